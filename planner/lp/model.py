"""The freeze LP's model: one stage of the LP as sparse row-wise arrays, built on :mod:`planner.lp.arrays`.

``r_v`` is the freeze ratio of freezable action ``v`` and ``d_v = w_max_v - (w_max_v - w_min_v) * r_v`` its
duration (seeds digest 1.6).

* variables: a start time only for actions that need one (see below), ``r_v in [0, 1]`` only for
  freezable actions (fixed actions contribute constants), and ``T``;
* rows: ``start(v) >= start(u) + d_u + c_uv`` for the edges that are not implied, ``T >= start(u) + d_u``
  for the DAG's last actions, and per stage ``sum r_v <= r_max_s * |freezable actions of the stage|``
  (``r_max_s``: the one ``r_max`` of every stage, or the stage's own; :mod:`planner.lp.budget`).
  ``c_uv >= 0`` is the edge's delay (``edge_ms``, :mod:`planner.timing.comm`; 0 without delays).

Reductions (all exact, so the reduced LP has the same optimum as the plain one): the kept edges of
:func:`planner.lp.arrays.dag_arrays` (source edges and implied same-rank edges dropped), and

* an action with a single remaining predecessor ``u`` starts exactly when ``u``'s data arrives (any
  feasible schedule stays feasible, with the same durations, when every action starts as early as
  possible; the dropped edges above stay satisfied), so its start is the affine expression
  ``start(u) + d_u + c_uv`` rather than a variable with a row.
  Expressions are capped at ``_MAX_TERMS`` freeze-ratio terms to keep rows short.

Every model comes with a starting basis (one tight precedence row per start variable and for ``T``: the
earliest-start schedule's tree) that :mod:`planner.lp.highs` hands to HiGHS; it is square by construction.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from planner.lp.arrays import DagArrays, Paths, stage_budgets
from planner.lp.budget import RMax
from planner.lp.problem import TIME_ATOL, TIME_RTOL

_MAX_TERMS = 2
"""Longest chain of freeze-ratio terms substituted into a start expression before a variable is used."""


@dataclass
class LPModel:
    """One assembled stage of the LP: row-wise sparse arrays ready for ``highspy.HighsLp``, a starting
    basis, and the maps back to actions.

    Columns: the freeze ratios ``r`` first (``r_actions[j]`` is column ``j``), then start variables,
    then ``T`` (column ``t_col``).  Rows: precedence rows (``start(v) - end(u) >= const``), the rows
    ``T - end(u) >= const`` for last actions, then one budget row per stage with freezable actions.
    """

    num_col: int
    num_row: int
    col_cost: np.ndarray
    col_lower: np.ndarray
    col_upper: np.ndarray
    row_lower: np.ndarray
    row_upper: np.ndarray
    start: np.ndarray
    index: np.ndarray
    value: np.ndarray
    t_col: int
    r_actions: list[str]
    tree_rows: np.ndarray  # one tight precedence row per start variable and one for T: the basis
    r_at_upper: bool  # starting basis has every freeze ratio at 1 (else at 0)
    r_upper: np.ndarray | None = None  # per freeze ratio: at 1 in the starting basis (overrides r_at_upper)
    build_seconds: float = 0.0
    budget_stages: list[int] | None = None  # stage of each budget row (the last rows, in this order)

    @property
    def nnz(self) -> int:
        return int(self.value.size)


def build_lp(
    arrays: DagArrays,
    r_max: RMax,
    *,
    t_bound: float | None = None,
    basis_start: str = "frozen",
) -> LPModel:
    """Assemble one stage of the reduced LP on ``arrays`` (no dense matrices, no per-row modelling API).

    ``t_bound=None``: stage 1, minimise ``T``.  Starting basis (``basis_start``): ``"frozen"``, the
    all-frozen earliest-start schedule (every ``r`` at 1, one tight row per start variable), or
    ``"critical"``, the unfrozen schedule's tree with only the freeze ratios on its path from ``T`` back
    to the source at 1.  Both are dual feasible (the ratios on that path are the only ones with a nonzero
    reduced cost, ``-delta``), so dual simplex only has to repair the budgets and precedence rows.

    ``t_bound=within_tol(T*)`` (:mod:`planner.lp.problem`): stage 2, ``T <= t_bound``, minimise ``sum r``.  Edges
    and actions that no path longer than ``t_bound`` less its resolution can use even with every action at
    ``w_max`` are left out (exact:
    such paths cannot exceed ``t_bound`` whatever the durations); their freeze ratios are 0.  The starting
    basis is the unfrozen earliest-start schedule (every ``r`` at 0), dual feasible for this objective.
    """
    t0 = time.perf_counter()
    stage2 = t_bound is not None
    edges = _Edges(arrays.k_src, arrays.k_dst, arrays.k_c, arrays.sink_preds)
    frz, delta = np.flatnonzero(arrays.delta > 0), arrays.delta
    if t_bound is not None:
        edges, frz, delta = _prune(arrays, edges, frz, t_bound * (1 - TIME_RTOL) - TIME_ATOL)
    crit = (not stage2) and basis_start == "critical"
    rows = _Rows(arrays, frz, delta, dur0=arrays.wmax - delta if not (stage2 or crit) else arrays.wmax)
    rows.precedence(edges)
    r_upper = rows.critical_start(frz.size) if crit else None
    m = _assemble(arrays, rows, frz, r_max, t_bound)
    m.r_at_upper, m.r_upper, m.build_seconds = not stage2, r_upper, time.perf_counter() - t0
    return m


@dataclass
class _Edges:
    """The kept edges of a model (with their delays, ``None``: none) and the sink's predecessors."""

    src: np.ndarray
    dst: np.ndarray
    c: np.ndarray | None
    sink_preds: np.ndarray


def _prune(arrays: DagArrays, e: _Edges, frz: np.ndarray, cut: float) -> tuple[_Edges, np.ndarray, np.ndarray]:
    """Stage 2: the edges, sink predecessors and freezable actions on some path longer than ``cut`` with every
    action at ``w_max``, and ``delta`` with the others' set to 0."""
    wmax = arrays.wmax
    head, tail = Paths(arrays).head_tail(wmax)  # all durations at w_max
    live = head + wmax + tail > cut
    longest = head[e.src] + wmax[e.src] + wmax[e.dst] + tail[e.dst]  # through the edge
    keep = (longest if e.c is None else longest + e.c) > cut
    sink_preds = e.sink_preds[head[e.sink_preds] + wmax[e.sink_preds] > cut]
    kept = _Edges(e.src[keep], e.dst[keep], None if e.c is None else e.c[keep], sink_preds)
    return kept, frz[live[frz]], np.where(live, arrays.delta, 0.0)


class _Rows:
    """The precedence rows of one model, built in topological order, with a start expression per node.

    ``start(v) = column ex_var[v] (or 0 if -1) + ex_c[v] + sum(coef * r_col for (col, coef) in ex_terms[v])``;
    ``val[v]``: ``v``'s start in the starting-basis schedule (durations ``dur0``); ``tree``: one tight row per
    start variable and for ``T``, the starting basis."""

    def __init__(self, arrays: DagArrays, frz: np.ndarray, delta: np.ndarray, dur0: np.ndarray) -> None:
        n = len(arrays.names)
        self.ar = arrays
        rcol = np.full(n, -1, dtype=np.int64)
        rcol[frz] = np.arange(frz.size)
        self.rcol = rcol
        self.ncol = int(frz.size)
        self.delta, self.wmax, self.rcol_l, self.dur0 = (
            delta.tolist(),
            arrays.wmax.tolist(),
            rcol.tolist(),
            dur0.tolist(),
        )
        self.ex_var = [-1] * n
        self.ex_c = [0.0] * n
        self.ex_terms: list[tuple] = [()] * n
        self.val = [0.0] * n
        self.parent = [-1] * n
        self.lo: list[float] = []
        self.cols: list[list[int]] = []
        self.vals: list[list[float]] = []
        self.tree: list[int] = []
        self.t_col = -1
        self.last_u = -1  # the tight predecessor of T's tree row

    def end_expr(self, u: int) -> tuple[int, float, tuple]:
        t = self.ex_terms[u]
        if self.delta[u] > 0:
            t = t + ((self.rcol_l[u], -self.delta[u]),)
        return self.ex_var[u], self.ex_c[u] + self.wmax[u], t

    def add_rows(self, col: int, preds: list[int], delays: list[float] | None = None) -> tuple[float, int]:
        """Rows ``col - end(u) >= delay`` for each u (``delays`` aligned with ``preds``, ``None``: 0);
        marks the tightest as a basis tree row; returns its start in the basis schedule and its ``u``."""
        best, best_row, best_u = -1.0, -1, -1
        for j, u in enumerate(preds):
            var, c, t = self.end_expr(u)
            e = self.val[u] + self.dur0[u]
            if delays is not None:
                c += delays[j]
                e += delays[j]
            cols = [col]
            vals = [1.0]
            if var >= 0:
                cols.append(var)
                vals.append(-1.0)
            for cc, kk in t:
                cols.append(cc)
                vals.append(-kk)
            if e > best:
                best, best_row, best_u = e, len(self.lo), u
            self.lo.append(c)
            self.cols.append(cols)
            self.vals.append(vals)
        self.tree.append(best_row)
        return best, best_u

    def precedence(self, e: _Edges) -> None:
        """A start expression (or variable and rows) for every node in topological order, then ``T``'s rows."""
        n = len(self.ar.names)
        perm = np.argsort(e.dst, kind="stable")
        kp = e.src[perm].tolist()
        kc = None if e.c is None else e.c[perm].tolist()  # delay of each entry of kp
        kptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(e.dst, minlength=n), out=kptr[1:])
        ptr = kptr.tolist()
        for v in self.ar.order:
            lo, hi = ptr[v], ptr[v + 1]
            if lo == hi or v == self.ar.snk_i:
                continue  # starts at 0 (only source edges), or is the sink (handled by T's rows)
            if hi - lo == 1:
                u = kp[lo]
                var, c, t = self.end_expr(u)
                if len(t) <= _MAX_TERMS:
                    self.ex_var[v], self.ex_c[v], self.ex_terms[v] = var, c, t
                    self.val[v] = self.val[u] + self.dur0[u]
                    if kc is not None:
                        self.ex_c[v] += kc[lo]
                        self.val[v] += kc[lo]
                    self.parent[v] = u
                    continue
            self.ex_var[v] = self.ncol
            self.val[v], self.parent[v] = self.add_rows(self.ncol, kp[lo:hi], None if kc is None else kc[lo:hi])
            self.ncol += 1
        self.t_col = self.ncol
        self.ncol += 1
        if e.sink_preds.size:
            _, self.last_u = self.add_rows(self.t_col, e.sink_preds.tolist())  # T >= end(u): no delay on sink edges

    def critical_start(self, nr: int) -> np.ndarray:
        """Dual feasible start: only the freeze ratios on the tree path from ``T`` to the source at 1."""
        r_upper = np.zeros(nr, dtype=bool)
        u = self.last_u
        while u >= 0:
            if self.rcol_l[u] >= 0:
                r_upper[self.rcol_l[u]] = True
            u = self.parent[u]
        return r_upper


def _assemble(arrays: DagArrays, rows: _Rows, frz: np.ndarray, r_max: RMax, t_bound: float | None) -> LPModel:
    """The model's row-wise arrays: the precedence rows, then one budget row per stage with freezable actions
    (sum of the stage's freeze ratios <= r_max_s * its number of freezable actions)."""
    n_prec = len(rows.lo)
    budget = stage_budgets(arrays, r_max)
    f_stage = arrays.stage[frz]
    stages, counts = np.unique(f_stage, return_counts=True)
    lengths = np.fromiter((len(c) for c in rows.cols), dtype=np.int64, count=n_prec)
    start = np.zeros(n_prec + stages.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=start[1 : n_prec + 1])
    start[n_prec + 1 :] = start[n_prec] + np.cumsum(counts)
    nz = int(start[n_prec])
    sorder = np.argsort(f_stage, kind="stable")
    index = np.concatenate(
        [
            np.fromiter((c for cs in rows.cols for c in cs), dtype=np.int32, count=nz),
            rows.rcol[frz][sorder].astype(np.int32),
        ]
    )
    value = np.concatenate(
        [np.fromiter((x for vs in rows.vals for x in vs), dtype=np.float64, count=nz), np.ones(frz.size)]
    )
    row_lower = np.concatenate([np.asarray(rows.lo, dtype=np.float64), np.full(stages.size, -np.inf)])
    row_upper = np.concatenate(
        [np.full(n_prec, np.inf), np.asarray([budget[s] for s in stages.tolist()], dtype=np.float64)]
    )
    ncol, t_col = rows.ncol, rows.t_col
    col_lower = np.zeros(ncol)
    col_upper = np.full(ncol, np.inf)
    col_upper[: frz.size] = 1.0
    cost = np.zeros(ncol)
    if t_bound is not None:
        cost[: frz.size] = 1.0
        col_upper[t_col] = t_bound
    else:
        cost[t_col] = 1.0
    return LPModel(
        num_col=ncol,
        num_row=row_lower.size,
        col_cost=cost,
        col_lower=col_lower,
        col_upper=col_upper,
        row_lower=row_lower,
        row_upper=row_upper,
        start=start,
        index=index,
        value=value,
        t_col=t_col,
        r_actions=[arrays.names[i] for i in frz.tolist()],
        tree_rows=np.asarray(rows.tree, dtype=np.int64),
        r_at_upper=True,
        budget_stages=stages.tolist(),
    )
