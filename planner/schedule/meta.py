"""Trace metadata (``meta.json`` of a ``timelyfreeze-trace/1`` directory, ``docs/formats.md``): the schedule,
its placement and every rank's order of actions; :func:`validate_meta` checks a dict against the spec.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import numpy as np

from planner.errors import PlannerError
from planner.schedule.actions import action_fields, parse_action, plain_fields

TRACE_FORMAT = "timelyfreeze-trace/1"
META_FILE = "meta.json"

_META_FIELDS = ("schedule", "pp_degree", "num_stages", "num_microbatches", "stage_to_rank", "rank_orders")
_OPTIONAL_META_FIELDS = ("replicas", "hosts", "clock_sync")  # checked when present
_EXTRA_META_FIELDS = ("hosts", "clock_sync")  # optional fields kept in ``TraceMeta.extra`` (written back as they came)


Fields = tuple[list[int], list[str], list[int]]
"""Stage, kind and microbatch of each of a list of action names (:func:`planner.schedule.actions.action_fields`)."""


@dataclass(frozen=True)
class ActionTable:
    """Every action of one batch (``TraceMeta.all_actions()``: rank by rank in execution order) with what
    :func:`planner.schedule.actions.parse_action` reads of its name (a pair: its backward part's stage and
    microbatch, kind ``OVERLAP_F_B``) and the rank that runs it, one list per field. Read-only: it is shared by
    everyone who asks the :class:`TraceMeta` for it."""

    names: list[str]
    stage: list[int]
    kind: list[str]
    microbatch: list[int]
    rank: list[int]


def action_table(rank_orders: dict[int, list[str]], fields: Fields | None = None) -> ActionTable:
    """The :class:`ActionTable` of ``rank_orders``; ``fields``: :func:`planner.schedule.actions.action_fields` of
    their names when the caller has them (else read here)."""
    ranks = sorted(rank_orders)
    names = [a for r in ranks for a in rank_orders[r]]
    stage, kind, microbatch = action_fields(names) if fields is None else fields
    return ActionTable(names, stage, kind, microbatch, [r for r in ranks for _ in rank_orders[r]])


@dataclass
class TraceMeta:
    """The validated contents of ``meta.json``.

    ``replicas`` is the number of data-parallel pipeline replicas (default 1). A ``"replicas"`` key passed
    in ``extra`` (e.g. ``build_meta(..., replicas=n)``) is moved into the attribute, so ``extra`` never holds it.
    The optional ``hosts`` field stays in ``extra`` (read it as :attr:`hosts`).
    """

    schedule: str
    pp_degree: int
    num_stages: int
    num_microbatches: int
    stage_to_rank: list[int]
    rank_orders: dict[int, list[str]]
    extra: dict[str, Any] = field(default_factory=dict)
    replicas: int = 1
    _table: ActionTable | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if "replicas" in self.extra:
            self.extra = dict(self.extra)
            n = self.extra.pop("replicas")
            if self.replicas not in (1, n):
                raise ValueError(f"replicas={self.replicas!r} conflicts with extra['replicas']={n!r}")
            self.replicas = n
        if not is_int(self.replicas) or self.replicas < 1:
            raise ValueError(f"replicas must be a positive integer, got {self.replicas!r}")

    def to_json(self) -> dict[str, Any]:
        """The ``meta.json`` dict (rank keys as strings, unknown extra fields preserved, ``replicas`` only if > 1)."""
        d: dict[str, Any] = dict(self.extra)
        d.update(
            {
                "format": TRACE_FORMAT,
                "schedule": self.schedule,
                "pp_degree": self.pp_degree,
                "num_stages": self.num_stages,
                "num_microbatches": self.num_microbatches,
                "stage_to_rank": list(self.stage_to_rank),
                "rank_orders": {str(r): list(o) for r, o in sorted(self.rank_orders.items())},
            }
        )
        if self.replicas > 1:
            d["replicas"] = self.replicas
        return d

    @property
    def hosts(self) -> list[str] | None:
        """Host name of each pipeline rank (of replica 0), index = rank; ``None`` when the trace does not say."""
        return self.extra.get("hosts")

    def all_actions(self) -> list[str]:
        """Every action of one batch, rank by rank in execution order."""
        return [a for r in sorted(self.rank_orders) for a in self.rank_orders[r]]

    def action_table(self) -> ActionTable:
        """Every action's fields (:class:`ActionTable`), its names read once per metadata (by :func:`validate_meta`'s
        check, else on first use) and kept: the DAG, the trace's columns, the monitoring groups and the plan summary
        all read them here (``rank_orders`` are not changed in place once the metadata is made)."""
        if self._table is None:
            self._table = action_table(self.rank_orders)
        return self._table


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def validate_meta(d: Any, source: str) -> TraceMeta:
    """Check a ``meta.json`` dict against the spec and return it as a :class:`TraceMeta`.

    Raises :class:`PlannerError` (one line: ``<source>: <field>: <problem>``) on the first problem.
    """

    def err(msg: str) -> PlannerError:
        return PlannerError(f"{source}: {msg}")

    _check_fields(d, err)
    pp, n_stages, n_mb = d["pp_degree"], d["num_stages"], d["num_microbatches"]
    s2r = d["stage_to_rank"]
    if not isinstance(s2r, list) or not all(is_int(x) for x in s2r):
        raise err("field 'stage_to_rank' must be a list of integers")
    if len(s2r) != n_stages:
        raise err(f"field 'stage_to_rank' has {len(s2r)} entries, expected num_stages={n_stages}")
    for s, r in enumerate(s2r):
        if not 0 <= r < pp:
            raise err(f"field 'stage_to_rank'[{s}] = {r} is not a rank in 0..{pp - 1}")
    rank_orders = _rank_orders(d["rank_orders"], pp, err)
    plain = plain_fields([a for r in sorted(rank_orders) for a in rank_orders[r]])
    _check_actions(rank_orders, s2r, n_stages, n_mb, err, plain)
    known = (set(_META_FIELDS) | set(_OPTIONAL_META_FIELDS) | {"format"}) - set(_EXTRA_META_FIELDS)
    extra = {k: v for k, v in d.items() if k not in known}
    meta = TraceMeta(d["schedule"], pp, n_stages, n_mb, list(s2r), rank_orders, extra, d.get("replicas", 1))
    if plain is not None:  # the names read by the check: the table's fields (a pair's names are read when asked)
        meta._table = action_table(rank_orders, plain)
    return meta


def _check_fields(d: Any, err: Callable[[str], PlannerError]) -> None:
    """The format, the required fields, and the scalar fields (schedule, sizes, replicas, hosts)."""
    if not isinstance(d, dict):
        raise err(f"expected a JSON object, got {type(d).__name__}")
    fmt = d.get("format")
    if fmt != TRACE_FORMAT:
        what = "missing" if "format" not in d else f"is {fmt!r}"
        raise err(f"field 'format' {what}, expected {TRACE_FORMAT!r}")
    for name in _META_FIELDS:
        if name not in d:
            raise err(f"missing field '{name}'")
    schedule = d["schedule"]
    if not isinstance(schedule, str) or not schedule:
        raise err(f"field 'schedule' must be a non-empty string, got {schedule!r}")
    for name in ("pp_degree", "num_stages", "num_microbatches"):
        v = d[name]
        if not is_int(v) or v < 1:
            raise err(f"field '{name}' must be a positive integer, got {v!r}")
    replicas = d.get("replicas", 1)
    if not is_int(replicas) or replicas < 1:
        raise err(f"field 'replicas' must be a positive integer, got {replicas!r}")
    pp, hosts = d["pp_degree"], d.get("hosts")
    if "hosts" in d and (not isinstance(hosts, list) or len(hosts) != pp or not all(isinstance(h, str) for h in hosts)):
        raise err(f"field 'hosts' must be a list of pp_degree={pp} clock-id strings, got {hosts!r}")
    if "clock_sync" in d:
        _check_clock_sync(d["clock_sync"], pp, err)


def _check_clock_sync(sync: Any, pp: int, err: Callable[[str], PlannerError]) -> None:
    """``clock_sync``: ``{"key": "boot_id"|"hostname", "samples": [{"step", "offset_ms", "error_ms"}, ...]}``, one
    finite offset and one finite error bound >= 0 per pipeline rank in every sample, steps strictly rising."""
    if not isinstance(sync, dict) or sync.get("key") not in ("boot_id", "hostname"):
        raise err(f"field 'clock_sync' must be an object with 'key' \"boot_id\" or \"hostname\", got {sync!r}")
    got = sync.get("samples")
    if not isinstance(got, list):
        raise err(f"field 'clock_sync'.samples must be a list, got {got!r}")
    last = None
    for i, s in enumerate(got):
        where = f"field 'clock_sync'.samples[{i}]"
        if not isinstance(s, dict) or not is_int(s.get("step")) or (last is not None and s["step"] <= last):
            raise err(f"{where} must be an object with an integer 'step' above the previous one, got {s!r}")
        last = s["step"]
        for name, low in (("offset_ms", -math.inf), ("error_ms", 0.0)):
            v = s.get(name)
            ok = isinstance(v, list) and len(v) == pp and all(is_num(x) and math.isfinite(x) and x >= low for x in v)
            if not ok:
                raise err(f"{where}.{name} must be a list of pp_degree={pp} finite numbers (errors >= 0), got {v!r}")


def _plain_actions_hold(
    rank_orders: dict[int, list[str]], s2r: list[int], n_stages: int, n_mb: int, plain: Fields | None
) -> bool:
    """True when every action is a canonical plain name (no pair) and :func:`_check_actions`'s rules all hold,
    checked over arrays (a 100k-action batch in a few hundredths of a second, a tenth of the loop's time); False
    when anything is off or when there are pairs (the loop then decides, and names what is wrong). ``plain``:
    :func:`planner.schedule.actions.plain_fields` of the names (``all_actions()`` order), read once by the caller."""
    names = [a for r in sorted(rank_orders) for a in rank_orders[r]]
    if plain is None or len(set(names)) != len(names):
        return False
    stage = np.array(plain[0], dtype=np.int64)
    code = {"F": 0, "B": 1, "I": 2, "W": 3}
    kind = np.fromiter(map(code.__getitem__, plain[1]), dtype=np.int64, count=len(plain[1]))
    mb = np.array(plain[2], dtype=np.int64)
    rank = np.repeat(sorted(rank_orders), [len(rank_orders[r]) for r in sorted(rank_orders)])
    if stage.max() >= n_stages or mb.max() >= n_mb or not np.array_equal(np.asarray(s2r)[stage], rank):
        return False
    counts = np.bincount((stage * n_mb + mb) * 4 + kind, minlength=n_stages * n_mb * 4).reshape(-1, 4)
    full = (counts == (1, 1, 0, 0)).all(axis=1)  # F and B
    split = (counts == (1, 0, 1, 1)).all(axis=1)  # F, I and W
    return bool((full | split).all())


def _rank_orders(ro: Any, pp: int, err: Callable[[str], PlannerError]) -> dict[int, list[str]]:
    """``rank_orders`` with integer rank keys in ``0..pp-1`` (an empty order for a rank not listed)."""
    if not isinstance(ro, dict):
        raise err("field 'rank_orders' must be an object mapping rank -> list of action names")
    rank_orders: dict[int, list[str]] = {}
    for key, order in ro.items():
        try:
            r = int(key)
        except (TypeError, ValueError):
            raise err(f"field 'rank_orders' has key {key!r}, expected a rank number") from None
        if str(r) != str(key) or not 0 <= r < pp:
            raise err(f"field 'rank_orders' has key {key!r}, expected a rank in 0..{pp - 1}")
        if r in rank_orders:
            raise err(f"field 'rank_orders' lists rank {r} twice")
        if not isinstance(order, list) or not all(map(isinstance, order, repeat(str))):
            raise err(f"field 'rank_orders'[{key!r}] must be a list of action-name strings")
        rank_orders[r] = list(order)
    for r in range(pp):
        rank_orders.setdefault(r, [])
    return rank_orders


def _check_actions(
    rank_orders: dict[int, list[str]],
    s2r: list[int],
    n_stages: int,
    n_mb: int,
    err: Callable[[str], PlannerError],
    plain: Fields | None,
) -> None:
    """Every action well-formed, in range, on the rank that owns its stage and listed once; each (stage,
    microbatch) with exactly one F and either one B or one I plus one W (a pair's parts count as the F and
    the B they run). Checked over arrays when every name is a plain action (:func:`_plain_actions_hold`;
    ``plain`` as there); otherwise, or when something is wrong, action by action, which names the first problem."""
    if _plain_actions_hold(rank_orders, s2r, n_stages, n_mb, plain):
        return
    seen: set[str] = set()
    kinds: dict[tuple[int, int], list[str]] = {}
    for r in sorted(rank_orders):
        where = f"field 'rank_orders'[{str(r)!r}]"
        for a in rank_orders[r]:
            try:
                act = parse_action(a)
            except ValueError as e:
                raise err(f"{where}: {e}") from None
            if str(act) != a:
                raise err(f"{where}: action {a!r} is not in canonical form ({str(act)!r})")
            for part in act.parts:  # a pair: both parts' stages and microbatches, on this rank
                if part.stage >= n_stages:
                    raise err(f"{where}: action {a!r} has stage {part.stage}, but num_stages={n_stages}")
                if part.microbatch >= n_mb:
                    raise err(f"{where}: action {a!r} has microbatch {part.microbatch}, but num_microbatches={n_mb}")
                if s2r[part.stage] != r:
                    raise err(
                        f"{where}: action {a!r} is on rank {r}, but stage_to_rank[{part.stage}] = {s2r[part.stage]}"
                    )
                kinds.setdefault((part.stage, part.microbatch), []).append(part.kind)
            if a in seen:
                raise err(f"field 'rank_orders': action {a!r} is listed more than once")
            seen.add(a)
    for s in range(n_stages):
        for m in range(n_mb):
            ks = sorted(kinds.get((s, m), []))
            if ks not in (["B", "F"], ["F", "I", "W"]):
                have = ", ".join(f"{s}{k}{m}" for k in ks) or "nothing"
                raise err(
                    f"field 'rank_orders': stage {s} microbatch {m} must have F and B (or F, I and W) "
                    f"exactly once, has {have}"
                )
