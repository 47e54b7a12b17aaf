"""Timing traces (``timelyfreeze-trace/1``): load, validate, and reduce to per-action node weights.

A trace is a directory holding ``meta.json`` and one ``actions_rank<r>.jsonl`` per pipeline rank, plus
one ``actions_rank<r>_replica<d>.jsonl`` per rank for each further data-parallel pipeline replica ``d >= 1``
(see ``docs/formats.md``), or the same files packed in a ``trace.tar.gz`` (:mod:`planner.trace.archive`).
Every problem is reported as a one-line :class:`PlannerError` that names the file (and ``:<line>`` for
JSONL) and what is wrong.  Unknown extra fields are kept (meta) or ignored (records) for forward
compatibility.  The metadata and its checks live in :mod:`planner.schedule.meta` (``TraceMeta``,
``validate_meta``, imported here for the loaders).
"""

from __future__ import annotations

import functools
import json
import math
import operator
import os
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.errors import PlannerError
from planner.fileio import parse_json
from planner.schedule.actions import FREEZABLE_KINDS, action_fields, parse_action
from planner.schedule.meta import META_FILE, TRACE_FORMAT, TraceMeta, is_int, is_num, validate_meta
from planner.trace.archive import find_trace, is_archive_path, read_archive
from planner.trace.clocks import align_records, samples
from planner.trace.columns import (
    Columns,
    columns,
    from_arrays,
    group_ids,
    group_medians,
    kept_columns,
    set_columns,
)

__all__ = [
    "META_FILE",
    "TRACE_FORMAT",
    "NodeWeights",
    "PhaseEstimates",
    "Record",
    "Trace",
    "TraceMeta",
    "combine_replicas",
    "load_trace",
    "node_weights",
    "rank_file_name",
    "trace_from_records",
    "validate_meta",
]

_RECORD_FIELDS = ("step", "action", "ms", "phase", "freeze_ratio")
_OPTIONAL_RECORD_FIELDS = ("start_ms",)  # checked when present


def rank_file_name(rank: int, replica: int = 0) -> str:
    """File name of one rank's records: ``actions_rank<r>.jsonl``, ``actions_rank<r>_replica<d>.jsonl`` for d >= 1."""
    return f"actions_rank{rank}.jsonl" if replica == 0 else f"actions_rank{rank}_replica{replica}.jsonl"


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


class Trace:
    """A whole trace: metadata plus every record of every rank and replica; ``source`` names where it came from.

    ``Trace(meta, records, source)`` holds the records given. A trace made from its columns
    (:meth:`from_columns`: what :func:`load_trace` reads a well-formed trace into, and what
    :func:`planner.timing.monitor.anchored` makes) builds its :class:`Record` list on first use of ``records``:
    planning reads only the columns (:mod:`planner.trace.columns`), so a 100k-action plan never makes an object
    per line. Setting ``records`` replaces them (and drops columns built from the old ones)."""

    def __init__(self, meta: TraceMeta, records: list[Record] | None, source: str) -> None:
        self.meta = meta
        self._records = records
        self.source = source

    @classmethod
    def from_columns(cls, meta: TraceMeta, cols: Columns, source: str) -> Trace:
        """The trace whose records are ``cols`` (:class:`planner.trace.columns.Columns`, in record order)."""
        trace = cls(meta, None, source)
        set_columns(trace, cols)
        return trace

    @property
    def records(self) -> list[Record]:
        if self._records is None:
            self._records = _records_of(columns(self))
        return self._records

    @records.setter
    def records(self, records: list[Record]) -> None:
        self._records = records
        set_columns(self, None)

    def has_start_times(self) -> bool:
        """Whether any record has ``start_ms`` (read from the columns when the trace has them)."""
        c = kept_columns(self)
        if c is not None:
            return bool(np.isfinite(c.start_ms).any())
        return any(rec.start_ms is not None for rec in self.records)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        return (self.meta, self.source, self.records) == (other.meta, other.source, other.records)

    def __repr__(self) -> str:
        return f"Trace(source={self.source!r}, schedule={self.meta.schedule!r}, {len(self.records)} records)"


def _records_of(c: Columns) -> list[Record]:
    """The records of columns ``c``, in their order (``start_ms`` NaN: none)."""
    names, phases = c.names, c.phases
    starts = [None if s != s else s for s in c.start_ms.tolist()]
    cols = (c.step.tolist(), c.action.tolist(), c.ms.tolist(), c.phase.tolist(), c.freeze_ratio.tolist())
    at = zip(*cols, c.rank.tolist(), c.replica.tolist(), starts)
    return [Record(st, names[a], ms, phases[p], fr, rk, d, s) for st, a, ms, p, fr, rk, d, s in at]


def _validate_record(obj: Any, where: str, rank: int, rank_actions: Collection[str], replica: int = 0) -> Record:
    """Check one JSONL record; ``where`` is ``<file>:<line>``."""
    if not isinstance(obj, dict):
        raise PlannerError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for name in _RECORD_FIELDS:
        if name not in obj:
            raise PlannerError(f"{where}: missing field '{name}'")
    step, action, ms, phase, fr = (obj[k] for k in _RECORD_FIELDS)
    if not is_int(step):
        raise PlannerError(f"{where}: field 'step' must be an integer, got {step!r}")
    if not isinstance(action, str):
        raise PlannerError(f"{where}: field 'action' must be a string, got {action!r}")
    if action not in rank_actions:  # rank_orders hold only valid names, so a member needs no parsing
        try:
            parse_action(action)
        except ValueError as e:
            raise PlannerError(f"{where}: field 'action': {e}") from None
        raise PlannerError(f"{where}: action {action!r} is not in rank_orders[{str(rank)!r}] of meta.json")
    if not is_num(ms) or not math.isfinite(ms) or ms < 0:
        raise PlannerError(f"{where}: field 'ms' must be a finite number >= 0, got {ms!r}")
    if not isinstance(phase, str) or not phase:
        raise PlannerError(f"{where}: field 'phase' must be a non-empty string, got {phase!r}")
    if not is_num(fr) or not math.isfinite(fr) or not 0.0 <= fr <= 1.0:
        raise PlannerError(f"{where}: field 'freeze_ratio' must be a number in [0, 1], got {fr!r}")
    start = obj.get("start_ms")
    if "start_ms" in obj:
        if not is_num(start) or not math.isfinite(start):
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
        if is_int(key):
            pair = (0, key)
        elif isinstance(key, tuple) and len(key) == 2 and all(is_int(x) for x in key):
            pair = key
        else:
            raise PlannerError(f"{source}: records given for key {key!r}, expected a rank or a (replica, rank) pair")
        d, r = pair
        if not 0 <= d < m.replicas or not 0 <= r < m.pp_degree:
            raise PlannerError(
                f"{source}: records given for replica {d} rank {r}, expected replica in "
                f"0..{m.replicas - 1} and rank in 0..{m.pp_degree - 1}"
            )
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
    return Trace(m, align_records(m, records), source)


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Read and validate a trace: a directory (``meta.json`` + one records file per rank and replica), its archive
    (``trace.tar.gz``), or a directory's path after it was packed (``<path>.tar.gz`` beside it,
    :func:`planner.trace.archive.find_trace`). In an archive, problems are named ``<archive>/<file>``."""
    root = os.fspath(path)
    found = find_trace(root)
    if is_archive_path(root) or (found is not None and is_archive_path(found)):
        root = os.fspath(found or root)
        read = read_archive(root).get  # a missing or bad archive: its one-line error
    elif os.path.isdir(root):
        read = _read_file_in(root)
    else:
        raise PlannerError(f"{root}: trace directory does not exist (nor an archive {os.path.basename(root)}.tar.gz)")
    meta_path = os.path.join(root, META_FILE)
    raw = read(META_FILE)
    if raw is None:
        raise PlannerError(f"{meta_path}: missing (a trace directory needs meta.json)")
    m = validate_meta(parse_json(raw, meta_path), meta_path)
    if m.replicas == 1:
        need = f"pp_degree={m.pp_degree} needs one file per rank"
    else:
        need = f"pp_degree={m.pp_degree}, replicas={m.replicas} need one file per rank and replica"

    names = m.all_actions()
    index = dict(zip(names, range(len(names))))
    blocks: list[tuple[np.ndarray, ...]] = []  # each file's records, field by field (planner.trace.columns.from_arrays)
    phases: dict[str, int] = {}
    slow: list[Record] | None = None  # the records checked line by line, from the first file not read fast
    for d in range(m.replicas):
        for r in range(m.pp_degree):
            fname = os.path.join(root, rank_file_name(r, d))
            raw = read(rank_file_name(r, d))
            if raw is None:
                raise PlannerError(f"{fname}: missing ({need})")
            try:
                lines = raw.decode("utf-8").splitlines()
            except UnicodeDecodeError as e:
                raise PlannerError(f"{fname}: not UTF-8 text: {e.reason}") from None
            if slow is None:
                order = m.rank_orders[r]
                block = _fast_block(lines, r, dict(zip(order, map(index.__getitem__, order))), d, phases)
                if block is not None:
                    blocks.append(block)
                    continue
            slow = [] if slow is None else slow
            slow.extend(_checked_records(fname, lines, r, set(m.rank_orders[r]), d))
    fields = [np.concatenate(f) for f in zip(*blocks)] if blocks else [np.zeros(0)] * 8
    cols = from_arrays(m.action_table(), list(phases), *fields)
    if slow is not None:  # something was off but no error: the files read fast, then the others
        return Trace(m, align_records(m, _records_of(cols) + slow), root)
    if samples(m):  # start times to bring onto rank 0's clock: the records now, columns from them when asked
        return Trace(m, align_records(m, _records_of(cols)), root)
    return Trace.from_columns(m, cols, root)


def _checked_records(fname: str, lines: list[str], rank: int, rank_actions: set[str], replica: int) -> list[Record]:
    """The records of one file's lines checked line by line (:func:`_validate_record`), which names the first
    problem (``<file>:<line>``): what :func:`load_trace` does once a file is not what the runtime writes."""
    records: list[Record] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{fname}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise PlannerError(f"{where}: invalid JSON: {e.msg}") from None
        records.append(_validate_record(obj, where, rank, rank_actions, replica))
    return records


def _read_file_in(root: str) -> Callable[[str], bytes | None]:
    """A reader of the files of the trace directory ``root``: a file's bytes, None when it does not exist."""

    def read(name: str) -> bytes | None:
        fname = os.path.join(root, name)
        try:
            with open(fname, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise PlannerError(f"{fname}: cannot read: {e.strerror}") from None

    return read


_NO_START = math.nan
"""What a record without ``start_ms`` reads as (this object: an explicit ``NaN`` in a file is another one)."""


def _fast_block(
    lines: list[str],
    rank: int,
    rank_actions: dict[str, int],
    replica: int,
    phases: dict[str, int],
) -> tuple[np.ndarray, ...] | None:
    """One file's records as the fields of :func:`planner.trace.columns.from_arrays` (action, phase, step, ms,
    replica, rank, freeze_ratio, start_ms) when every line is a well-formed record (what the runtime writes): the
    lines parsed as one JSON array by the C decoder and checked a field at a time; None at the first doubt
    (``phases`` then unchanged), and :func:`load_trace` checks that file and the ones after it line by line with
    :func:`_validate_record` to name the problem (the same records, several times as fast on a 100k-action trace,
    and no :class:`Record` until one is asked for).  ``rank_actions``: the rank's actions and their index in the
    trace's ``meta.all_actions()``; ``phases``: phase -> index, in order of first appearance (grown here)."""
    if "" in lines or any(map(str.isspace, lines)):  # (what the runtime writes has no blank line)
        lines = [line for line in lines if line and not line.isspace()]
    n = len(lines)
    try:
        objs = json.loads("[" + ",".join(lines) + "]")
    except ValueError:
        return None
    # one value per line (a line holding two would add one: lines are never empty here, so none can add none)
    if len(objs) != n or (n and {*map(type, objs)} != {dict}):
        return None
    try:  # a field at a time: a tuple per record, transposed, took three times as long
        step, action, ms, phase, fr = (list(map(get, objs)) for get in _FIELD_GETS)
    except KeyError:
        return None
    start = list(map(_START_GET, objs))
    if not (
        {*map(type, step)} <= {int}
        and {*map(type, action)} <= {str}
        and {*map(type, ms)} <= {int, float}
        and {*map(type, phase)} <= {str}
        and all(phase)
        and {*map(type, fr)} <= {int, float}
        and {*map(type, start)} <= {int, float}  # (an explicit null start: the line-by-line check words the error)
    ):
        return None
    try:  # (an action not in the rank's order: a KeyError)
        action_a = np.fromiter(map(rank_actions.__getitem__, action), dtype=np.int64, count=n)
    except KeyError:
        return None
    try:
        ms_a, fr_a, start_a = (np.array(x, dtype=np.float64) for x in (ms, fr, start))
        step_a = np.array(step, dtype=np.int64)
    except OverflowError:
        return None
    missing = start.count(_NO_START)  # (by identity: NaN equals nothing, so an explicit one is not counted)
    if missing in (0, n):  # every record has a start, or none: the runtime's files
        given = np.full(n, not missing and n > 0, dtype=bool)
    else:
        given = np.fromiter((s is not _NO_START for s in start), dtype=bool, count=n)
    if not (
        np.isfinite(ms_a).all()
        and (ms_a >= 0).all()
        and ((fr_a >= 0.0) & (fr_a <= 1.0)).all()
        and np.isfinite(start_a[given]).all()
    ):
        return None
    for p in dict.fromkeys(phase):
        phases.setdefault(p, len(phases))
    return (
        action_a,
        np.fromiter(map(phases.__getitem__, phase), dtype=np.int64, count=n),
        step_a,
        ms_a,
        np.full(n, replica, dtype=np.int64),
        np.full(n, rank, dtype=np.int64),
        fr_a,
        start_a,
    )


_FIELD_GETS = tuple(map(operator.itemgetter, _RECORD_FIELDS))
_START_GET = operator.methodcaller("get", "start_ms", _NO_START)


@dataclass
class NodeWeights:
    """Per-action duration bounds (ms): ``w_max`` nothing frozen, ``w_min`` everything frozen (neither changed in
    place once made: :attr:`freezable` is found once)."""

    w_min: dict[str, float]
    w_max: dict[str, float]

    @functools.cached_property
    def freezable(self) -> set[str]:
        """Actions of a freezable kind (B, W, OVERLAP_F_B) whose duration can shrink (``w_max - w_min > 0``); found
        on first use and kept (it reads every name)."""
        names = list(self.w_max)
        kinds = action_fields(names)[1]
        return {a for a, k in zip(names, kinds) if k in FREEZABLE_KINDS and self.w_max[a] - self.w_min[a] > 0}


def freezable_mask(kinds: Sequence[str], w_max: np.ndarray, w_min: np.ndarray) -> np.ndarray:
    """:attr:`NodeWeights.freezable`'s rule over arrays (one entry per action): a freezable kind (B, W,
    OVERLAP_F_B) whose duration can shrink (``w_max - w_min > 0``)."""
    return np.fromiter(map(_FREEZABLE.__contains__, kinds), dtype=bool, count=len(kinds)) & (w_max - w_min > 0)


_FREEZABLE = frozenset(FREEZABLE_KINDS)


def node_weights(trace: Trace) -> NodeWeights:
    """Derive ``w_min``/``w_max`` per action as the spec says: per replica, medians of ``upper``/``lower``
    records (``w_min`` clamped to ``w_max``); then, across replicas, the per-action maximum of each.

    The optimizer step waits for the slowest replica, and the batch time (a longest path in the DAG) is
    monotone in the node weights, so a plan's predicted batch time on the per-action-maximum weights bounds
    every replica's predicted batch time for the same ratios. Planning on the replica that is critical now
    would ignore that another replica becomes critical once it is sped up. One replica: plain medians.
    """
    c = columns(trace)
    upper, lower = c.phase_code("upper"), c.phase_code("lower")
    rows = np.flatnonzero((c.phase == upper) | (c.phase == lower))
    d, a, ph = c.replica[rows], c.action[rows], c.phase[rows]
    key, first = group_ids(d, a, ph)
    med, _ = group_medians(key, c.ms[rows], len(first))
    return combine_replicas(trace, PhaseEstimates(d[first], a[first], ph[first] == lower, med))


@dataclass(frozen=True)
class PhaseEstimates:
    """One estimate (ms) per (replica, action, phase) with records, phases ``upper`` and ``lower``, as arrays of
    one length: ``replica``, ``action`` (index into the trace's ``meta.all_actions()``), ``lower`` (True:
    ``lower``, False: ``upper``) and ``value``."""

    replica: np.ndarray
    action: np.ndarray
    lower: np.ndarray
    value: np.ndarray


def combine_replicas(trace: Trace, estimate: PhaseEstimates) -> NodeWeights:
    """Node weights from one estimate per ``(replica, action, phase)``: per replica ``w_max`` is the
    ``upper`` estimate and ``w_min`` the ``lower`` one clamped to ``w_max`` (B, W and pairs; other kinds get
    ``w_min = w_max``); across replicas, the per-action maximum of each (see :func:`node_weights`). A
    missing estimate is a one-line :class:`PlannerError` naming the replica's file. Every estimator
    (``planner.timing.estimate``) ends here."""
    names = trace.meta.all_actions()
    freezable = columns(trace).kind_mask(FREEZABLE_KINDS)
    hi = np.full((trace.meta.replicas, len(names)), np.nan)
    lo = hi.copy()
    up, low = ~estimate.lower, estimate.lower
    hi[estimate.replica[up], estimate.action[up]] = estimate.value[up]
    lo[estimate.replica[low], estimate.action[low]] = estimate.value[low]
    if np.isnan(hi).any() or np.isnan(lo[:, freezable]).any():
        _missing_estimate(trace, ~np.isnan(hi), ~np.isnan(lo), freezable)
    lo = np.where(freezable, np.minimum(lo, hi), hi)
    return NodeWeights(dict(zip(names, lo.max(axis=0).tolist())), dict(zip(names, hi.max(axis=0).tolist())))


def _missing_estimate(trace: Trace, has_hi: np.ndarray, has_lo: np.ndarray, freezable: np.ndarray) -> None:
    """The one-line error of the first missing estimate, replica by replica, rank by rank, in execution order."""
    index = {a: i for i, a in enumerate(trace.meta.all_actions())}
    for d in range(trace.meta.replicas):
        for r in sorted(trace.meta.rank_orders):
            fname = os.path.join(trace.source, rank_file_name(r, d))
            for a in trace.meta.rank_orders[r]:
                i = index[a]
                if not has_hi[d, i]:
                    raise PlannerError(f"{fname}: action {a!r} has no record with phase 'upper' (needed for w_max)")
                if freezable[i] and not has_lo[d, i]:
                    raise PlannerError(f"{fname}: action {a!r} has no record with phase 'lower' (needed for w_min)")


def phase_stage_ratios(trace: Trace, phase: str = "stable") -> list[float]:
    """Per global stage, the mean realised freeze ratio (by elements) of its freezable actions (B, W, a DualPipeV
    pair's backward part) over the records of ``phase``: the per-stage share of freezing a run applied, as its
    budget ``r_max`` counts it. A stage with no such record in ``phase`` gets 0."""
    total = [0.0] * trace.meta.num_stages
    count = [0] * trace.meta.num_stages
    for rec in trace.records:
        act = parse_action(rec.action)
        if rec.phase == phase and act.kind in FREEZABLE_KINDS:
            total[act.stage] += rec.freeze_ratio
            count[act.stage] += 1
    return [t / c if c else 0.0 for t, c in zip(total, count)]
