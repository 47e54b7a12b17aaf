"""Timing traces (``timelyfreeze-trace/1``): load, validate, and reduce to per-action node weights.

A trace is a directory holding ``meta.json`` and one ``actions_rank<r>.jsonl`` per pipeline rank, plus
one ``actions_rank<r>_replica<d>.jsonl`` per rank for each further data-parallel pipeline replica ``d >= 1``
(see ``docs/formats.md``).  Every problem is reported as a one-line :class:`PlannerError`
that names the file (and ``:<line>`` for JSONL) and what is wrong.  Unknown extra fields are kept
(meta) or ignored (records) for forward compatibility.
"""

from __future__ import annotations

import json
import json.scanner
import math
import os
import statistics
from dataclasses import dataclass, field
from typing import Any

from .actions import FREEZABLE_KINDS, action_kind, parse_action
from .errors import PlannerError
from .fileio import read_json

TRACE_FORMAT = "timelyfreeze-trace/1"
META_FILE = "meta.json"

_META_FIELDS = ("schedule", "pp_degree", "num_stages", "num_microbatches", "stage_to_rank", "rank_orders")
_OPTIONAL_META_FIELDS = ("replicas", "hosts")  # checked when present
_EXTRA_META_FIELDS = ("hosts",)  # optional fields kept in ``TraceMeta.extra`` (written back as they came)
_RECORD_FIELDS = ("step", "action", "ms", "phase", "freeze_ratio")
_OPTIONAL_RECORD_FIELDS = ("start_ms",)  # checked when present


def rank_file_name(rank: int, replica: int = 0) -> str:
    """File name of one rank's records: ``actions_rank<r>.jsonl``, ``actions_rank<r>_replica<d>.jsonl`` for d >= 1."""
    return f"actions_rank{rank}.jsonl" if replica == 0 else f"actions_rank{rank}_replica{replica}.jsonl"


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

    def __post_init__(self) -> None:
        if "replicas" in self.extra:
            self.extra = dict(self.extra)
            n = self.extra.pop("replicas")
            if self.replicas not in (1, n):
                raise ValueError(f"replicas={self.replicas!r} conflicts with extra['replicas']={n!r}")
            self.replicas = n
        if not _is_int(self.replicas) or self.replicas < 1:
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


@dataclass
class Record:
    """One executed action: one line of ``rank_file_name(rank, replica)``."""

    step: int
    action: str
    ms: float
    phase: str
    freeze_ratio: float
    rank: int
    replica: int = 0
    start_ms: float | None = None  # start on the host's monotonic clock (ms), when the trace has it


@dataclass
class Trace:
    """A whole trace: metadata plus every record of every rank and replica; ``source`` names where it came from."""

    meta: TraceMeta
    records: list[Record]
    source: str


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def validate_meta(d: Any, source: str) -> TraceMeta:
    """Check a ``meta.json`` dict against the spec and return it as a :class:`TraceMeta`.

    Raises :class:`PlannerError` (one line: ``<source>: <field>: <problem>``) on the first problem.
    """

    def err(msg: str) -> PlannerError:
        return PlannerError(f"{source}: {msg}")

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
        if not _is_int(v) or v < 1:
            raise err(f"field '{name}' must be a positive integer, got {v!r}")
    pp, n_stages, n_mb = d["pp_degree"], d["num_stages"], d["num_microbatches"]
    replicas = d.get("replicas", 1)
    if not _is_int(replicas) or replicas < 1:
        raise err(f"field 'replicas' must be a positive integer, got {replicas!r}")

    hosts = d.get("hosts")
    if "hosts" in d and (not isinstance(hosts, list) or len(hosts) != pp
                         or not all(isinstance(h, str) for h in hosts)):
        raise err(f"field 'hosts' must be a list of pp_degree={pp} host-name strings, got {hosts!r}")

    s2r = d["stage_to_rank"]
    if not isinstance(s2r, list) or not all(_is_int(x) for x in s2r):
        raise err("field 'stage_to_rank' must be a list of integers")
    if len(s2r) != n_stages:
        raise err(f"field 'stage_to_rank' has {len(s2r)} entries, expected num_stages={n_stages}")
    for s, r in enumerate(s2r):
        if not 0 <= r < pp:
            raise err(f"field 'stage_to_rank'[{s}] = {r} is not a rank in 0..{pp - 1}")

    ro = d["rank_orders"]
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
        if not isinstance(order, list) or not all(isinstance(a, str) for a in order):
            raise err(f"field 'rank_orders'[{key!r}] must be a list of action-name strings")
        rank_orders[r] = list(order)
    for r in range(pp):
        rank_orders.setdefault(r, [])

    # Every action: well-formed, in range, on the rank that owns its stage, listed once.
    seen: dict[str, int] = {}
    kinds: dict[tuple[int, int], list[str]] = {}
    for r in sorted(rank_orders):
        for a in rank_orders[r]:
            try:
                act = parse_action(a)
            except ValueError as e:
                raise err(f"field 'rank_orders'[{str(r)!r}]: {e}") from None
            if str(act) != a:
                raise err(f"field 'rank_orders'[{str(r)!r}]: action {a!r} is not in canonical form ({str(act)!r})")
            for part in act.parts:  # a pair: both parts' stages and microbatches, on this rank
                if part.stage >= n_stages:
                    raise err(f"field 'rank_orders'[{str(r)!r}]: action {a!r} has stage {part.stage}, "
                              f"but num_stages={n_stages}")
                if part.microbatch >= n_mb:
                    raise err(f"field 'rank_orders'[{str(r)!r}]: action {a!r} has microbatch {part.microbatch}, "
                              f"but num_microbatches={n_mb}")
                if s2r[part.stage] != r:
                    raise err(f"field 'rank_orders'[{str(r)!r}]: action {a!r} is on rank {r}, "
                              f"but stage_to_rank[{part.stage}] = {s2r[part.stage]}")
                kinds.setdefault((part.stage, part.microbatch), []).append(part.kind)
            if a in seen:
                raise err(f"field 'rank_orders': action {a!r} is listed more than once")
            seen[a] = r

    # Coverage: each (stage, microbatch) has exactly one F and either one B or one I plus one W (a pair's
    # parts count as the F and the B they run).
    for s in range(n_stages):
        for m in range(n_mb):
            ks = sorted(kinds.get((s, m), []))
            if ks not in (["B", "F"], ["F", "I", "W"]):
                have = ", ".join(f"{s}{k}{m}" for k in ks) or "nothing"
                raise err(f"field 'rank_orders': stage {s} microbatch {m} must have F and B (or F, I and W) "
                          f"exactly once, has {have}")

    known = (set(_META_FIELDS) | set(_OPTIONAL_META_FIELDS) | {"format"}) - set(_EXTRA_META_FIELDS)
    extra = {k: v for k, v in d.items() if k not in known}
    return TraceMeta(schedule, pp, n_stages, n_mb, list(s2r), rank_orders, extra, replicas)


def _validate_record(obj: Any, where: str, rank: int, rank_actions: set[str], replica: int = 0) -> Record:
    """Check one JSONL record; ``where`` is ``<file>:<line>``."""
    if not isinstance(obj, dict):
        raise PlannerError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for name in _RECORD_FIELDS:
        if name not in obj:
            raise PlannerError(f"{where}: missing field '{name}'")
    step, action, ms, phase, fr = (obj[k] for k in _RECORD_FIELDS)
    if not _is_int(step):
        raise PlannerError(f"{where}: field 'step' must be an integer, got {step!r}")
    if not isinstance(action, str):
        raise PlannerError(f"{where}: field 'action' must be a string, got {action!r}")
    if action not in rank_actions:  # rank_orders hold only valid names, so a member needs no parsing
        try:
            parse_action(action)
        except ValueError as e:
            raise PlannerError(f"{where}: field 'action': {e}") from None
        raise PlannerError(f"{where}: action {action!r} is not in rank_orders[{str(rank)!r}] of meta.json")
    if not _is_num(ms) or not math.isfinite(ms) or ms < 0:
        raise PlannerError(f"{where}: field 'ms' must be a finite number >= 0, got {ms!r}")
    if not isinstance(phase, str) or not phase:
        raise PlannerError(f"{where}: field 'phase' must be a non-empty string, got {phase!r}")
    if not _is_num(fr) or not math.isfinite(fr) or not 0.0 <= fr <= 1.0:
        raise PlannerError(f"{where}: field 'freeze_ratio' must be a number in [0, 1], got {fr!r}")
    start = obj.get("start_ms")
    if "start_ms" in obj:
        if not _is_num(start) or not math.isfinite(start):
            raise PlannerError(f"{where}: field 'start_ms' must be a finite number, got {start!r}")
        start = float(start)
    return Record(step, action, float(ms), phase, float(fr), rank, replica, start)


def trace_from_records(
    meta: dict[str, Any], records_by_rank: dict[Any, list[dict[str, Any]]], source: str = "<memory>"
) -> Trace:
    """Validate an in-memory trace (what the runtime gathers over the process group) like :func:`load_trace`.

    Keys are a rank (replica 0) or a ``(replica, rank)`` pair; every (replica, rank) must be present.
    Error locations read ``<source>/<rank_file_name(rank, replica)>:<index+1>``.
    """
    m = validate_meta(meta, f"{source}/{META_FILE}")
    by_pair: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for key, recs in records_by_rank.items():
        if _is_int(key):
            pair = (0, key)
        elif isinstance(key, tuple) and len(key) == 2 and all(_is_int(x) for x in key):
            pair = key
        else:
            raise PlannerError(f"{source}: records given for key {key!r}, expected a rank or a (replica, rank) pair")
        d, r = pair
        if not 0 <= d < m.replicas or not 0 <= r < m.pp_degree:
            raise PlannerError(f"{source}: records given for replica {d} rank {r}, expected replica in "
                               f"0..{m.replicas - 1} and rank in 0..{m.pp_degree - 1}")
        if pair in by_pair:
            raise PlannerError(f"{source}: records for replica {d} rank {r} given twice (key {key!r})")
        by_pair[pair] = recs
    for d in range(m.replicas):
        for r in range(m.pp_degree):
            if (d, r) not in by_pair:
                of = f" of replica {d}" if d else ""
                raise PlannerError(f"{source}/{rank_file_name(r, d)}: no records for rank {r}{of}")
    records: list[Record] = []
    for (d, r), recs in sorted(by_pair.items()):
        acts = set(m.rank_orders[r])
        fname = f"{source}/{rank_file_name(r, d)}"
        for i, obj in enumerate(recs):
            records.append(_validate_record(obj, f"{fname}:{i + 1}", r, acts, d))
    return Trace(m, records, source)


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Read and validate a trace directory (``meta.json`` + one records file per rank and replica)."""
    root = os.fspath(path)
    meta_path = os.path.join(root, META_FILE)
    if not os.path.isdir(root):
        raise PlannerError(f"{root}: trace directory does not exist")
    m = validate_meta(read_json(meta_path, "missing (a trace directory needs meta.json)"), meta_path)
    if m.replicas == 1:
        need = f"pp_degree={m.pp_degree} needs one file per rank"
    else:
        need = f"pp_degree={m.pp_degree}, replicas={m.replicas} need one file per rank and replica"

    records: list[Record] = []
    for d in range(m.replicas):
        for r in range(m.pp_degree):
            fname = os.path.join(root, rank_file_name(r, d))
            acts = set(m.rank_orders[r])
            try:
                f = open(fname, encoding="utf-8")
            except FileNotFoundError:
                raise PlannerError(f"{fname}: missing ({need})") from None
            except OSError as e:
                raise PlannerError(f"{fname}: cannot read: {e.strerror}") from None
            with f:
                try:
                    lines = f.read().splitlines()
                except UnicodeDecodeError as e:
                    raise PlannerError(f"{fname}: not UTF-8 text: {e.reason}") from None
            fast = _fast_records(lines, r, acts, d)
            if fast is not None:
                records.extend(fast)
                continue
            for lineno, line in enumerate(lines, start=1):  # something is off: find it, line by line
                if not line.strip():
                    continue
                where = f"{fname}:{lineno}"
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise PlannerError(f"{where}: invalid JSON: {e.msg}") from None
                records.append(_validate_record(obj, where, r, acts, d))
    return Trace(m, records, root)


_SCAN = json.scanner.make_scanner(json.JSONDecoder())
"""One JSON value from a position of a string: (value, end); the C scanner where available."""


def _fast_records(lines: list[str], rank: int, rank_actions: set[str], replica: int) -> list[Record] | None:
    """The records of one file when every line is a well-formed record (what the runtime writes), parsed by
    the JSON module's scanner directly and checked inline; None at the first doubt, and :func:`load_trace`
    then checks line by line with :func:`_validate_record` to name the problem (the same result, about twice
    as fast on a 100k-action trace)."""
    out = []
    isfinite, scan = math.isfinite, _SCAN
    for line in lines:
        if not line or line.isspace():
            continue
        try:
            obj, end = scan(line, 0)
        except (StopIteration, ValueError):
            return None
        if type(obj) is not dict or (end != len(line) and not line[end:].isspace()):
            return None
        try:
            step, action, ms, phase, fr = obj["step"], obj["action"], obj["ms"], obj["phase"], obj["freeze_ratio"]
        except KeyError:
            return None
        start = obj.get("start_ms")
        if (type(step) is not int or type(action) is not str or action not in rank_actions or type(ms) not in (int, float)
                or not (isfinite(ms) and ms >= 0) or type(phase) is not str or not phase
                or type(fr) not in (int, float) or not 0.0 <= fr <= 1.0):
            return None
        if start is not None:
            if type(start) not in (int, float) or not isfinite(start):
                return None
            start = float(start)
        elif "start_ms" in obj:  # an explicit null: the line-by-line check words the error
            return None
        out.append(Record(step, action, float(ms), phase, float(fr), rank, replica, start))
    return out


@dataclass
class NodeWeights:
    """Per-action duration bounds (ms): ``w_max`` nothing frozen, ``w_min`` everything frozen."""

    w_min: dict[str, float]
    w_max: dict[str, float]

    @property
    def freezable(self) -> set[str]:
        """Actions of a freezable kind (B, W, OVERLAP_F_B) whose duration can shrink (``w_max - w_min > 0``)."""
        return {
            a
            for a, hi in self.w_max.items()
            if action_kind(a) in FREEZABLE_KINDS and hi - self.w_min[a] > 0
        }


def node_weights(trace: Trace) -> NodeWeights:
    """Derive ``w_min``/``w_max`` per action as the spec says: per replica, medians of ``upper``/``lower``
    records (``w_min`` clamped to ``w_max``); then, across replicas, the per-action maximum of each.

    The optimizer step waits for the slowest replica, and the batch time (a longest path in the DAG) is
    monotone in the node weights, so a plan's predicted batch time on the per-action-maximum weights bounds
    every replica's predicted batch time for the same ratios. Planning on the replica that is critical now
    would ignore that another replica becomes critical once it is sped up. One replica: plain medians.
    """
    samples: dict[tuple[int, str, str], list[float]] = {}
    for rec in trace.records:
        phase = rec.phase
        if phase == "upper" or phase == "lower":
            key = (rec.replica, rec.action, phase)
            got = samples.get(key)
            if got is None:
                samples[key] = [rec.ms]
            else:
                got.append(rec.ms)
    return combine_replicas(trace, {k: _median(v) for k, v in samples.items()})


def _median(xs: list[float]) -> float:
    """statistics.median, without its overhead for the one- and two-sample lists most actions have."""
    n = len(xs)
    if n == 1:
        return float(xs[0])
    if n == 2:
        return (xs[0] + xs[1]) / 2.0
    return float(statistics.median(xs))


def combine_replicas(trace: Trace, estimate: dict[tuple[int, str, str], float]) -> NodeWeights:
    """Node weights from one estimate (ms) per ``(replica, action, phase)``: per replica ``w_max`` is the
    ``upper`` estimate and ``w_min`` the ``lower`` one clamped to ``w_max`` (B, W and pairs; other kinds get
    ``w_min = w_max``); across replicas, the per-action maximum of each (see :func:`node_weights`). A
    missing estimate is a one-line :class:`PlannerError` naming the replica's file. Every estimator
    (``planner.estimate``) ends here."""
    w_min: dict[str, float] = {}
    w_max: dict[str, float] = {}
    for d in range(trace.meta.replicas):
        for r in sorted(trace.meta.rank_orders):
            fname = os.path.join(trace.source, rank_file_name(r, d))
            for a in trace.meta.rank_orders[r]:
                if (d, a, "upper") not in estimate:
                    raise PlannerError(f"{fname}: action {a!r} has no record with phase 'upper' (needed for w_max)")
                hi = estimate[d, a, "upper"]
                if action_kind(a) in FREEZABLE_KINDS:
                    if (d, a, "lower") not in estimate:
                        raise PlannerError(f"{fname}: action {a!r} has no record with phase 'lower' "
                                           "(needed for w_min)")
                    lo = min(estimate[d, a, "lower"], hi)
                else:
                    lo = hi
                if d == 0:
                    w_min[a], w_max[a] = lo, hi
                else:
                    w_min[a], w_max[a] = max(w_min[a], lo), max(w_max[a], hi)
    return NodeWeights(w_min, w_max)
