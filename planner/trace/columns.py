"""A trace's records as columns: one numpy array per record field, built once per trace (:func:`columns`).

The timing estimates (monitoring windows, pooled node weights, jitter residuals) group the records by a few keys
and take medians. Over a 100k-action trace (two records per action) one Python loop per record and estimate cost
most of a plan's time; over columns a grouping is one sort. :func:`group_medians` gives exactly the floats
``statistics.median`` gives on each group's values (the middle value, or the mean of the two middle ones, of the
sorted values), so the estimates are the same numbers either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.schedule.meta import ActionTable


@dataclass(frozen=True)
class Columns:
    """Every record of a trace, one array entry per record, in the trace's record order.

    ``action``: index into ``names`` (``meta.all_actions()``); ``phase``: index into ``phases`` (the trace's
    phase names, in order of first appearance); ``stage``/``kind``: per action (index into ``names``) its stage
    and its kind's index into ``kinds``; ``start_ms`` NaN where a record has none."""

    names: list[str]
    phases: list[str]
    kinds: list[str]
    action: np.ndarray
    phase: np.ndarray
    step: np.ndarray
    ms: np.ndarray
    replica: np.ndarray
    rank: np.ndarray
    freeze_ratio: np.ndarray
    start_ms: np.ndarray
    stage: np.ndarray
    kind: np.ndarray

    def phase_code(self, phase: str) -> int:
        """The index of ``phase`` in ``phases``; -1 when no record has it."""
        return self.phases.index(phase) if phase in self.phases else -1

    def kind_mask(self, kinds: tuple[str, ...]) -> np.ndarray:
        """Per action (index into ``names``): whether its kind is one of ``kinds``."""
        codes = [i for i, k in enumerate(self.kinds) if k in kinds]
        return np.isin(self.kind, codes)


def columns(trace) -> Columns:
    """The columns of ``trace`` (a ``planner.trace.load.Trace``), built on first use and kept on the trace (a
    trace's records are not changed in place: ``planner.timing.monitor.anchored`` makes a new trace, and setting
    ``records`` drops the columns built from the old ones)."""
    got = kept_columns(trace)
    if got is None:
        got = _build(trace)
        set_columns(trace, got)
    return got


def kept_columns(trace) -> Columns | None:
    """The columns kept on ``trace``; None when none are built yet."""
    return getattr(trace, "_columns", None)


def set_columns(trace, cols: Columns | None) -> None:
    """Keep ``cols`` as ``trace``'s columns (for a trace made from another's, whose columns follow from its);
    None drops them (they are built afresh on next use)."""
    object.__setattr__(trace, "_columns", cols)


def _build(trace) -> Columns:
    table = trace.meta.action_table()
    index = {a: i for i, a in enumerate(table.names)}
    phase_index: dict[str, int] = {}
    code = phase_index.setdefault  # a phase's index: the next one at its first record
    rows = [
        (index[r.action], code(r.phase, len(phase_index)), r.step, r.ms, r.replica, r.rank, r.freeze_ratio, r.start_ms)
        for r in trace.records
    ]
    return from_rows(table, list(phase_index), rows)


def from_rows(table: ActionTable, phases: list[str], rows: list[tuple]) -> Columns:
    """The columns of records given as ``(action index, phase index, step, ms, replica, rank, freeze_ratio,
    start_ms)`` rows (``start_ms`` None or NaN: none), in record order; ``table``: the trace's actions
    (``meta.action_table()``)."""
    values = np.array(rows, dtype=np.float64).reshape(len(rows), 8)  # integers stay exact (below 2**53); None: NaN
    ints = values[:, [0, 1, 2, 4, 5]].astype(np.int64)
    action, phase, step, replica, rank = ints.T
    return from_arrays(table, phases, action, phase, step, values[:, 3], replica, rank, values[:, 6], values[:, 7])


def from_arrays(
    table: ActionTable,
    phases: list[str],
    action: np.ndarray,
    phase: np.ndarray,
    step: np.ndarray,
    ms: np.ndarray,
    replica: np.ndarray,
    rank: np.ndarray,
    freeze_ratio: np.ndarray,
    start_ms: np.ndarray,
) -> Columns:
    """The columns of records given field by field, in record order (``planner.trace.load`` reads a trace's files
    into them): ``action``/``phase`` index into ``table.names`` (``meta.action_table()``, whose fields give each
    action's stage and kind)/``phases``; integer fields as int64, the others float64, ``start_ms`` NaN where a record
    has none."""
    stage, kind, kinds = _stage_kind(table)
    i64, f64 = (lambda a: np.array(a, dtype=np.int64)), (lambda a: np.array(a, dtype=np.float64))
    return Columns(
        names=list(table.names),
        phases=phases,
        kinds=kinds,
        action=i64(action),
        phase=i64(phase),
        step=i64(step),
        ms=f64(ms),
        replica=i64(replica),
        rank=i64(rank),
        freeze_ratio=f64(freeze_ratio),
        start_ms=f64(start_ms),
        stage=stage,
        kind=kind,
    )


def _stage_kind(table: ActionTable) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Per action its stage and its kind's index into the kinds (in order of first appearance), and the kinds."""
    kinds = list(dict.fromkeys(table.kind))
    code = {k: i for i, k in enumerate(kinds)}
    n = len(table.names)
    stage = np.array(table.stage, dtype=np.int64).reshape(n)
    kind = np.array([code[k] for k in table.kind], dtype=np.int64).reshape(n)
    return stage, kind, kinds


def group_ids(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group rows by equal ``keys`` (integer arrays of one length): (each row's group id, one row of each group),
    groups numbered in the keys' sorted order."""
    n = len(keys[0])
    if not n:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    code = np.zeros(n, dtype=np.int64)
    for k in keys:
        inv, m = _ranks(k)
        code = code * m + inv
    gid, groups = _ranks(code)
    first = np.full(groups, n, dtype=np.int64)
    np.minimum.at(first, gid, np.arange(n))  # (each group's first row)
    return gid, first


def _ranks(k: np.ndarray) -> tuple[np.ndarray, int]:
    """Each entry's rank among the distinct values of ``k`` (``np.unique``'s inverse) and how many there are: by
    counting where ``k`` holds integers in ``0..4 len(k)`` (the records' indexes, steps, codes: no sort), else
    ``np.unique``."""
    if k.dtype.kind in "iu" and int(k.min()) >= 0 and int(k.max()) <= 4 * k.size:
        seen = np.zeros(int(k.max()) + 1, dtype=bool)
        seen[k] = True
        rank = np.cumsum(seen, dtype=np.int64) - 1
        return rank[k], int(rank[-1]) + 1
    values, inv = np.unique(k, return_inverse=True)
    return inv.reshape(-1), values.size


def group_medians(gid: np.ndarray, values: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Per group ``0..n_groups-1`` of ``gid``: the median of its ``values`` as ``statistics.median`` computes
    it, and its count (a group without values: NaN, 0)."""
    order = np.lexsort((values, gid))
    v, g = values[order], gid[order]
    count = np.bincount(g, minlength=n_groups)
    start = np.cumsum(count) - count
    med = np.full(n_groups, np.nan)
    has = count > 0
    lo = (start + (count - 1) // 2)[has]
    hi = (start + count // 2)[has]
    med[has] = np.where(lo == hi, v[lo], (v[lo] + v[hi]) / 2)
    return med, count
