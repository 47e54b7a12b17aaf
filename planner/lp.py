"""The TimelyFreeze LP (seeds digest 1.6), solved lexicographically with HiGHS.

Stage 1 minimises the batch time ``T``; stage 2 keeps ``T <= T*`` and minimises the total freezing
``sum r_v``.  No big-M weight.

Large batches (``solver="auto"`` from ``_REGION_MIN_ACTIONS`` actions) are solved on a region of
near-critical actions that grows until it provably holds the optimum (:func:`_solve_region`): the LP on a
region, with every path through the left-out actions replaced by its all-frozen length, is a relaxation;
when its freeze ratios, with everything outside unfrozen, give the whole batch that same batch time, they
are the whole LP's lexicographic optimum.  Why: the simplex on these DAGs costs O(actions) per
iteration (a duration change moves every later start in the basis tree), so a 5-10x smaller model with
5-10x fewer iterations is ~50x cheaper.  Measured (pp32 x 2 x 512 ZBV, 98k actions): 2 rounds, 38k
actions in the last region, 2.1 s vs 12.1 s for the whole LP.  Interleaved1F1B's near-critical set is
most of the batch (its unfrozen schedule is within 1 % of critical almost everywhere), so there the
region grows past ``_REGION_MAX_FRACTION`` and the whole LP is solved.

The whole LP: stage 1 starts dual simplex (Devex pricing) from a crafted basis: every start variable basic with the
row of one predecessor at bound (the earliest-start schedule's tree), every freeze ratio nonbasic at a
bound.  Such a basis is dual feasible as soon as the freeze ratios on the tree path from ``T`` back to
the source are at 1 (they are the only ones with a nonzero reduced cost, ``-delta``); the rest may sit
at 0 or 1.  Two starts are used: "critical" (tree of the unfrozen schedule, only its critical path
frozen: budgets nearly feasible, the simplex repairs precedence rows with cheap hyper-sparse pivots) for
full-backward schedules, "frozen" (everything at 1, the previous default) for split I/W schedules,
whichever measured faster (pp32 x 2 x 256 Interleaved1F1B: 2.0 s / 8.2k iterations vs 14-16 s / 20.8k;
pp16 x 2 x 256 ZBV: 0.6 s / 5.1k vs 2.3 s / 7.3k).

Stage 2 runs on the stage-1 optimal face (complementary slackness, exact): columns with a nonzero
stage-1 reduced cost are fixed at their value and rows with a nonzero dual become equalities; HiGHS
presolve then shrinks the model and dual simplex solves it from scratch.  Measured (pp32 x 2 x 256
Interleaved1F1B): 4.0 s vs 9.9 s for the previous fresh pruned model from the all-unfrozen basis, 5.2 s
for the face with that crafted basis (no presolve); the stage-1 hot start was slower still.  The face
means ``T <= T*`` holds exactly: the previous ``T <= T* (1 + 1e-9) + 1e-9`` let stage 2 freeze up to
~1e-5 relative less.

Previous default ("dual"), measured alternatives (2-core box, planner.synthetic V orders, pp32 x 2 x
512 mb split, 98k actions, stage 1 + stage 2):
slack basis + default dual simplex (steepest edge) ~40 s; crafted basis + steepest edge 6.3 + 31 s;
crafted basis + Devex 1.0-1.4 + 5.6-8 s; crafted basis + Dantzig 1.0 + 10 s; primal simplex slower
than dual at every size; IPX 2-3x slower than simplex at 12k actions; "hipo" is not in this highspy
build; ``_MAX_TERMS`` 0/2/4/8 within noise of each other.
On the real torch orders (planner.schedules, pp16 x 2 x 256): Interleaved1F1B (16k actions) 4.3 s
with this default vs 6.6 s steepest edge vs 36 s slack basis; ZBVZeroBubble (25k actions) 2.2 s vs
5.4 s vs 10.2 s.  Real orders are harder than the synthetic ones (see scripts/bench_planner.py).

Model (``r_v`` = freeze ratio of freezable action v, ``d_v = w_max_v - (w_max_v - w_min_v) * r_v``):

* variables: a start time only for actions that need one (see below), ``r_v in [0, 1]`` only for
  freezable actions (fixed actions contribute constants), and ``T``;
* rows: ``start(v) >= start(u) + d_u`` for the edges that are not implied, ``T >= start(u) + d_u`` for
  the DAG's last actions, and per stage ``sum r_v <= r_max * |freezable actions of the stage|``.

Reductions (all exact):

* source edges become the bound ``start >= 0``;
* a same-rank edge ``u -> v`` whose ``v`` is not ``u``'s rank successor is implied by the rank chain;
* an action with a single remaining predecessor ``u`` starts exactly when ``u`` ends (any feasible
  schedule stays feasible, with the same durations, when every action starts as early as possible),
  so its start is the affine expression ``start(u) + d_u`` rather than a variable with a row.
  Expressions are capped at ``_MAX_TERMS`` freeze-ratio terms to keep rows short.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import networkx as nx
import numpy as np

from .dag import SINK, SOURCE, dag_index, longest_path
from .errors import PlannerError
from .actions import FREEZABLE_KINDS
from .trace import NodeWeights

_MAX_TERMS = 2
"""Longest chain of freeze-ratio terms substituted into a start expression before a variable is used."""

# Measured on the 2-core dev box (scripts/bench_planner.py, pp32 x 2 x 512 split, ~98k actions):
# see _SOLVER_OPTIONS below and the bench output for the alternatives tried.
_SOLVER_OPTIONS: dict[str, tuple[dict[str, object], bool, str, bool]] = {
    # name: (HiGHS options, start from a crafted basis, stage-1 crafted start, stage 2 on the optimal face)
    "fast": ({"solver": "simplex", "simplex_strategy": 1, "simplex_dual_edge_weight_strategy": 1}, True,
             "auto", True),
    "dual": ({"solver": "simplex", "simplex_strategy": 1, "simplex_dual_edge_weight_strategy": 1}, True,
             "frozen", False),
    "dual-dse": ({"solver": "simplex", "simplex_strategy": 1}, True, "frozen", False),
    "primal": ({"solver": "simplex", "simplex_strategy": 4}, True, "frozen", False),
    "slack": ({"solver": "simplex"}, False, "frozen", False),
    "ipx": ({"solver": "ipx"}, False, "frozen", False),
}
_AUTO = "fast"
SOLVERS: tuple[str, ...] = ("auto", "region", *_SOLVER_OPTIONS)
"""Every solver name ``solve_freeze_lp`` accepts: the one list the CLI and ``[freeze] solver`` check against."""
_REGION_MIN_ACTIONS = 20_000
"""From this many actions on, ``solver="auto"`` solves on a growing near-critical region (see
:func:`_solve_region`)."""
_REGION_START = 1e-3
"""First region: actions on paths within this fraction of the longest one (budget spread evenly)."""
_REGION_BAND = 0.1
"""When a round's paths overshoot so widely that adding all their actions would more than double the
region, only the actions of paths within this fraction of the overshoot from the longest are added."""
_REGION_MAX_FRACTION = 0.6
"""Past this fraction of all actions the region solve stops and the whole LP is solved instead."""
_REGION_MAX_ROUNDS = 50
_FIX_TOL = 1e-6
"""A stage-1 reduced cost or row dual larger than this (objective: T in ms) fixes its column / row in
stage 2.  Genuine duals here are flows and freeze prices (>= ~1e-4); numerical zeros are ~1e-9."""


@dataclass
class LPSolution:
    """Durations and starts of every action, the batch time, and how the solve went."""

    durations: dict[str, float]
    starts: dict[str, float]
    makespan: float
    status: str
    seconds: float
    solver: str


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

    @property
    def nnz(self) -> int:
        return int(self.value.size)


@dataclass
class _Arrays:
    """Per-node arrays of the DAG shared by both stages."""

    names: list[str]
    order: list[int]
    src_i: int
    snk_i: int
    stage: np.ndarray
    wmax: np.ndarray
    delta: np.ndarray  # w_max - w_min for freezable actions, else 0
    k_src: np.ndarray  # edges that need a row (after dropping source edges and implied same-rank edges)
    k_dst: np.ndarray
    sink_preds: np.ndarray
    split: bool = False  # the schedule splits backward into I and W
    stage_counts: dict[int, int] | None = None  # freezable actions per stage (budget base); None: count here


def _arrays(dag: nx.DiGraph, weights: NodeWeights) -> _Arrays:
    di = dag_index(dag)
    names = di.names
    n = len(names)
    src_i, snk_i = di.index[SOURCE], di.index[SINK]
    rank = np.full(n, -1, dtype=np.int64)
    stage = np.full(n, -1, dtype=np.int64)
    wmax = np.zeros(n)
    delta = np.zeros(n)
    nodes = dag.nodes
    split = False
    for i, a in enumerate(names):
        if i == src_i or i == snk_i:
            continue
        attrs = nodes[a]
        rank[i] = attrs["rank"]
        stage[i] = attrs["stage"]
        try:
            hi, lo = float(weights.w_max[a]), float(weights.w_min[a])
        except KeyError:
            raise PlannerError(f"no node weights for action {a!r}") from None
        wmax[i] = hi
        if attrs["kind"] == "W":
            split = True
        if attrs["kind"] in FREEZABLE_KINDS and hi - lo > 0:
            delta[i] = hi - lo
    # The rank successor of u (the next action in its rank's order) is the same-rank successor that
    # comes first topologically: every other same-rank successor is reached through the rank chain.
    topo_pos = np.empty(n, dtype=np.int64)
    topo_pos[di.order] = np.arange(n)
    src, dst = di.src, di.dst
    real = (src != src_i) & (dst != snk_i)
    same = real & (rank[src] == rank[dst])
    s_same, d_same = src[same], dst[same]
    order = np.lexsort((topo_pos[d_same], s_same))
    s_sorted, d_sorted = s_same[order], d_same[order]
    first = np.ones(s_sorted.size, dtype=bool)
    first[1:] = s_sorted[1:] != s_sorted[:-1]
    rank_succ = np.full(n, -1, dtype=np.int64)
    rank_succ[s_sorted[first]] = d_sorted[first]
    keep = real & ((rank[src] != rank[dst]) | (rank_succ[src] == dst))
    return _Arrays(names, di.order.tolist(), src_i, snk_i, stage, wmax, delta,
                   src[keep], dst[keep], src[(dst == snk_i) & (src != src_i)], split)


class _Paths:
    """Predecessor/successor lists of the kept edges of an :class:`_Arrays`, for repeated longest paths."""

    def __init__(self, ar: _Arrays) -> None:
        n = len(ar.names)
        perm = np.argsort(ar.k_dst, kind="stable")
        ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(ar.k_dst, minlength=n), out=ptr[1:])
        self.preds, self.pptr = ar.k_src[perm].tolist(), ptr.tolist()
        perm = np.argsort(ar.k_src, kind="stable")
        sptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(ar.k_src, minlength=n), out=sptr[1:])
        self.succs, self.sptr = ar.k_dst[perm].tolist(), sptr.tolist()
        self.order = ar.order
        self.n = n

    def head_tail(self, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Longest path (durations ``dur``, kept edges) to each node's start and from its end."""
        w = dur.tolist()
        preds, p = self.preds, self.pptr
        head = [0.0] * self.n
        for v in self.order:
            b = 0.0
            for u in preds[p[v]:p[v + 1]]:
                x = head[u] + w[u]
                if x > b:
                    b = x
            head[v] = b
        succs, sp = self.succs, self.sptr
        tail = [0.0] * self.n
        for u in reversed(self.order):
            b = 0.0
            for v in succs[sp[u]:sp[u + 1]]:
                x = w[v] + tail[v]
                if x > b:
                    b = x
            tail[u] = b
        return np.asarray(head), np.asarray(tail)


def _stage_counts(ar: _Arrays) -> dict[int, int]:
    """Freezable actions per stage, the base of each stage's budget (``ar.stage_counts`` when given)."""
    if ar.stage_counts is not None:
        return ar.stage_counts
    st, cn = np.unique(ar.stage[ar.delta > 0], return_counts=True)
    return dict(zip(st.tolist(), cn.tolist()))


def _head_tail(ar: _Arrays) -> tuple[np.ndarray, np.ndarray]:
    """Longest path (all durations at ``w_max``, kept edges) to each node's start and from its end."""
    return _Paths(ar).head_tail(ar.wmax)


def build_lp(
    dag: nx.DiGraph,
    weights: NodeWeights,
    r_max: float,
    *,
    t_bound: float | None = None,
    arrays: _Arrays | None = None,
    basis_start: str = "frozen",
) -> LPModel:
    """Assemble one stage of the reduced LP (no dense matrices, no per-row modelling API).

    ``t_bound=None``: stage 1, minimise ``T``; the starting basis is the all-frozen earliest-start
    schedule (every ``r`` at 1, one tight row per start variable), which is dual feasible, so dual
    simplex only has to repair the stage budgets.

    ``t_bound=T*``: stage 2, ``T <= t_bound``, minimise ``sum r``.  Edges and actions that no path longer
    than ``t_bound`` can use even with every action at ``w_max`` are left out (exact: such paths cannot
    exceed ``t_bound`` whatever the durations); their freeze ratios are 0.  The starting basis is the
    unfrozen earliest-start schedule (every ``r`` at 0), dual feasible for this objective.
    """
    t0 = time.perf_counter()
    ar = arrays if arrays is not None else _arrays(dag, weights)
    names, n = ar.names, len(ar.names)
    delta, wmax = ar.delta, ar.wmax
    k_src, k_dst, sink_preds = ar.k_src, ar.k_dst, ar.sink_preds
    stage2 = t_bound is not None
    frz_all = np.flatnonzero(delta > 0)
    if stage2:
        head, tail = _head_tail(ar)
        cut = t_bound * (1 - 1e-9) - 1e-9
        through = head + wmax + tail
        live = through > cut
        keep = (head[k_src] + wmax[k_src] + wmax[k_dst] + tail[k_dst]) > cut
        k_src, k_dst = k_src[keep], k_dst[keep]
        sink_preds = sink_preds[head[sink_preds] + wmax[sink_preds] > cut]
        frz = frz_all[live[frz_all]]
        delta = np.where(live, delta, 0.0)
    else:
        frz = frz_all
    crit = (not stage2) and basis_start == "critical"
    dur0 = wmax - delta if not (stage2 or crit) else wmax  # durations of the starting basis
    parent = [-1] * n

    rcol = np.full(n, -1, dtype=np.int64)
    rcol[frz] = np.arange(frz.size)
    ncol = frz.size

    perm = np.argsort(k_dst, kind="stable")
    kp = k_src[perm].tolist()
    kptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(k_dst, minlength=n), out=kptr[1:])
    kptr_l = kptr.tolist()
    delta_l, wmax_l, rcol_l, dur0_l = delta.tolist(), wmax.tolist(), rcol.tolist(), dur0.tolist()
    # start(v) = column ex_var[v] (or 0 if -1) + ex_c[v] + sum(coef * r_col for (col, coef) in ex_terms[v])
    ex_var = [-1] * n
    ex_c = [0.0] * n
    ex_terms: list[tuple] = [()] * n
    val = [0.0] * n  # start of each node in the starting-basis schedule
    rows_lo: list[float] = []
    rows_cols: list[list[int]] = []
    rows_vals: list[list[float]] = []
    tree: list[int] = []

    def end_expr(u: int) -> tuple[int, float, tuple]:
        t = ex_terms[u]
        if delta_l[u] > 0:
            t = t + ((rcol_l[u], -delta_l[u]),)
        return ex_var[u], ex_c[u] + wmax_l[u], t

    def add_rows(col: int, preds: list[int]) -> float:
        """Rows ``col - end(u) >= 0`` for each u; marks the tightest as a basis tree row."""
        best, best_row, best_u = -1.0, -1, -1
        for u in preds:
            var, c, t = end_expr(u)
            cols = [col]
            vals = [1.0]
            if var >= 0:
                cols.append(var)
                vals.append(-1.0)
            for cc, kk in t:
                cols.append(cc)
                vals.append(-kk)
            e = val[u] + dur0_l[u]
            if e > best:
                best, best_row, best_u = e, len(rows_lo), u
            rows_lo.append(c)
            rows_cols.append(cols)
            rows_vals.append(vals)
        tree.append(best_row)
        return best, best_u

    for v in ar.order:
        lo, hi = kptr_l[v], kptr_l[v + 1]
        if lo == hi or v == ar.snk_i:
            continue  # starts at 0 (only source edges), or is the sink (handled by T's rows)
        if hi - lo == 1:
            u = kp[lo]
            var, c, t = end_expr(u)
            if len(t) <= _MAX_TERMS:
                ex_var[v], ex_c[v], ex_terms[v] = var, c, t
                val[v] = val[u] + dur0_l[u]
                parent[v] = u
                continue
        ex_var[v] = ncol
        val[v], parent[v] = add_rows(ncol, kp[lo:hi])
        ncol += 1
    t_col = ncol
    ncol += 1
    r_upper = None
    if sink_preds.size:
        _, u = add_rows(t_col, sink_preds.tolist())
        if crit:
            # Dual feasible start: only the freeze ratios on the tree path from T to the source at 1.
            r_upper = np.zeros(frz.size, dtype=bool)
            while u >= 0:
                if rcol_l[u] >= 0:
                    r_upper[rcol_l[u]] = True
                u = parent[u]
    n_prec = len(rows_lo)

    # Per-stage budget rows: sum of the stage's freeze ratios <= r_max * (its number of freezable actions).
    budget = {k: r_max * c for k, c in _stage_counts(ar).items()}
    f_stage = ar.stage[frz]
    stages, counts = np.unique(f_stage, return_counts=True)
    lengths = np.fromiter((len(c) for c in rows_cols), dtype=np.int64, count=n_prec)
    start = np.zeros(n_prec + stages.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=start[1 : n_prec + 1])
    start[n_prec + 1 :] = start[n_prec] + np.cumsum(counts)
    nz = int(start[n_prec])
    sorder = np.argsort(f_stage, kind="stable")
    index = np.concatenate([np.fromiter((c for cs in rows_cols for c in cs), dtype=np.int32, count=nz),
                            rcol[frz][sorder].astype(np.int32)])
    value = np.concatenate([np.fromiter((x for vs in rows_vals for x in vs), dtype=np.float64, count=nz),
                            np.ones(frz.size)])
    row_lower = np.concatenate([np.asarray(rows_lo, dtype=np.float64), np.full(stages.size, -np.inf)])
    row_upper = np.concatenate([np.full(n_prec, np.inf),
                                np.asarray([budget[s] for s in stages.tolist()], dtype=np.float64)])
    col_lower = np.zeros(ncol)
    col_upper = np.full(ncol, np.inf)
    col_upper[: frz.size] = 1.0
    cost = np.zeros(ncol)
    if stage2:
        cost[: frz.size] = 1.0
        col_upper[t_col] = t_bound
    else:
        cost[t_col] = 1.0
    return LPModel(
        num_col=ncol, num_row=row_lower.size, col_cost=cost, col_lower=col_lower, col_upper=col_upper,
        row_lower=row_lower, row_upper=row_upper, start=start, index=index, value=value, t_col=t_col,
        r_actions=[names[i] for i in frz.tolist()], tree_rows=np.asarray(tree, dtype=np.int64),
        r_at_upper=not stage2, r_upper=r_upper, build_seconds=time.perf_counter() - t0,
    )


def _status_name(h, status) -> str:  # noqa: ANN001 - highspy types
    try:
        return h.modelStatusToString(status)
    except Exception:  # pragma: no cover - older highspy
        return str(status)


def _highs_lp(m: LPModel, col_lower=None, col_upper=None, row_lower=None, row_upper=None, cost=None):  # noqa: ANN001
    import highspy

    lp = highspy.HighsLp()
    lp.num_col_ = m.num_col
    lp.num_row_ = m.num_row
    lp.col_cost_ = m.col_cost if cost is None else cost
    lp.col_lower_ = m.col_lower if col_lower is None else col_lower
    lp.col_upper_ = m.col_upper if col_upper is None else col_upper
    lp.row_lower_ = m.row_lower if row_lower is None else row_lower
    lp.row_upper_ = m.row_upper if row_upper is None else row_upper
    a = lp.a_matrix_
    a.format_ = highspy.MatrixFormat.kRowwise
    a.num_col_ = m.num_col
    a.num_row_ = m.num_row
    a.start_ = m.start.astype(np.int32)
    a.index_ = m.index
    a.value_ = m.value
    return lp


def _run(
    m: LPModel, opts: dict[str, object], use_basis: bool, what: str, lp=None,  # noqa: ANN001
) -> tuple[np.ndarray, int, object]:
    """Solve one stage with HiGHS; returns the column values, the simplex iteration count and the solution
    (with duals).  ``lp`` (a ``HighsLp``) replaces the model built from ``m``."""
    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    for k, v in opts.items():
        if h.setOptionValue(k, v) != highspy.HighsStatus.kOk:
            raise PlannerError(f"HiGHS rejected option {k}={v!r}")
    if lp is None:
        lp = _highs_lp(m)
    if h.passModel(lp) != highspy.HighsStatus.kOk:
        raise PlannerError(f"HiGHS rejected the {what} model")
    if use_basis:
        # Start variables and T basic, each with its tight tree row at bound; budget rows and the other
        # precedence rows basic; freeze ratios at 1 (stage 1) or 0 (stage 2).
        S = highspy.HighsBasisStatus
        nr = len(m.r_actions)
        b = highspy.HighsBasis()
        if m.r_upper is not None:
            b.col_status = [S.kUpper if x else S.kLower for x in m.r_upper.tolist()] + [S.kBasic] * (m.num_col - nr)
        else:
            b.col_status = [S.kUpper if m.r_at_upper else S.kLower] * nr + [S.kBasic] * (m.num_col - nr)
        rs = [S.kBasic] * m.num_row
        for r in m.tree_rows.tolist():
            rs[r] = S.kLower
        b.row_status = rs
        b.valid = True
        if h.setBasis(b) != highspy.HighsStatus.kOk:  # pragma: no cover - the basis is square by construction
            raise PlannerError(f"HiGHS rejected the {what} starting basis")
    h.run()
    st = h.getModelStatus()
    if st != highspy.HighsModelStatus.kOptimal:
        raise PlannerError(f"HiGHS {what} solve failed: model status {_status_name(h, st)!r}")
    sol = h.getSolution()
    return np.asarray(sol.col_value), int(h.getInfo().simplex_iteration_count), sol


def _face_lp(m: LPModel, sol, t_bound: float):  # noqa: ANN001 - highspy solution
    """Stage 2 on the stage-1 model: objective ``sum r``, ``T <= t_bound``, restricted to the optimal face.

    Complementary slackness: with ``(y, d)`` one optimal dual of stage 1, the optimal solutions of stage 1
    are exactly the feasible points with every column of nonzero reduced cost at its bound and every row
    of nonzero dual tight.  Fixing those (exact) lets presolve remove most of the model.
    Returns the ``HighsLp`` and the numbers of fixed columns and rows.
    """
    x = np.asarray(sol.col_value)
    cd = np.asarray(sol.col_dual)
    rd = np.asarray(sol.row_dual)
    cl, cu = m.col_lower.copy(), m.col_upper.copy()
    fc = np.abs(cd) > _FIX_TOL
    fc[m.t_col] = False
    xv = np.clip(x[fc], cl[fc], cu[fc])
    cl[fc] = xv
    cu[fc] = xv
    cu[m.t_col] = t_bound
    rl, ru = m.row_lower.copy(), m.row_upper.copy()
    fr = np.abs(rd) > _FIX_TOL
    lo_side = fr & np.isfinite(rl) & ~np.isfinite(ru)
    hi_side = fr & np.isfinite(ru) & ~np.isfinite(rl)
    ru[lo_side] = rl[lo_side]
    rl[hi_side] = ru[hi_side]
    cost = np.zeros(m.num_col)
    cost[: len(m.r_actions)] = 1.0
    return _highs_lp(m, cl, cu, rl, ru, cost), int(fc.sum()), int((lo_side | hi_side).sum())


def _lexicographic(
    ar: _Arrays, r_max: float, opts: dict[str, object], use_basis: bool, basis_start: str, on_face: bool,
) -> tuple[float, np.ndarray, dict[str, object]]:
    """Both LP stages on ``ar``: returns ``T*``, the freeze ratio of every node of ``ar`` (0 for fixed
    actions) and sizes/timings."""
    t0 = time.perf_counter()
    m1 = build_lp(None, None, r_max, arrays=ar, basis_start=basis_start)  # type: ignore[arg-type]
    t1 = time.perf_counter()
    col, it1, sol1 = _run(m1, opts, use_basis, "batch-time")
    t_star = float(col[m1.t_col])
    t2 = time.perf_counter()
    r = np.zeros(len(ar.names))
    m2 = None
    it2 = 0
    fixed = (0, 0)
    t_bound = t_star * (1 + 1e-9) + 1e-9
    build2 = 0.0
    frz = np.flatnonzero(ar.delta > 0)
    if m1.r_actions and on_face:
        tb = time.perf_counter()
        lp2, fc, fr = _face_lp(m1, sol1, t_bound)
        fixed = (fc, fr)
        build2 = time.perf_counter() - tb
        try:
            col2, it2, _ = _run(m1, {**opts, "presolve": "on"}, False, "least-freezing", lp=lp2)
            r[frz] = np.clip(col2[: frz.size], 0.0, 1.0)  # stage 1 keeps every freezable action (same order)
            m2 = m1
        except PlannerError:  # pragma: no cover - numerical trouble on the face: solve stage 2 in full
            on_face = False
    if m1.r_actions and not on_face:
        m2 = build_lp(None, None, r_max, t_bound=t_bound, arrays=ar)  # type: ignore[arg-type]
        build2 += m2.build_seconds
        if m2.r_actions:
            col2, it2, _ = _run(m2, opts, use_basis, "least-freezing")
            idx = {a: i for i, a in enumerate(ar.names)}
            r[[idx[a] for a in m2.r_actions]] = np.clip(col2[: len(m2.r_actions)], 0.0, 1.0)
    t3 = time.perf_counter()
    info = dict(
        cols=m1.num_col, rows=m1.num_row, nnz=m1.nnz,
        cols2=m2.num_col if m2 else 0, rows2=m2.num_row if m2 else 0, nnz2=m2.nnz if m2 else 0,
        build1_s=t1 - t0, solve1_s=t2 - t1, stage2_s=t3 - t2,
        build2_s=build2, iters1=it1, iters2=it2, fixed_cols2=fixed[0], fixed_rows2=fixed[1],
        stage1_start=basis_start,
    )
    return t_star, r, info


def _region_arrays(
    ar: _Arrays, keep: np.ndarray, head_min: np.ndarray, tail_min: np.ndarray, counts: dict[int, int],
) -> tuple[_Arrays, np.ndarray]:
    """The relaxation of the LP to the actions ``keep`` (a mask over ``ar``'s nodes).

    Kept actions keep their edges among themselves.  Every path through left-out actions is replaced by
    what it is at least whatever the freezing: a kept action with a left-out predecessor cannot start
    before the longest all-frozen (``w_min``) path to it, and one with a left-out successor leaves at least
    the longest all-frozen path after it.  These bounds become fixed-duration dummy actions before/after
    it.  The per-stage budgets stay those of the whole batch (``counts``).  Every schedule of the whole
    batch restricted to the kept actions is feasible here, so this LP's batch time is a lower bound of
    ``T*`` and, at ``T <= T*``, its least freezing a lower bound of the least freezing.
    Returns the arrays and, per node of them, the index of the node of ``ar`` (-1 for dummies).
    """
    n = len(ar.names)
    keep = keep.copy()
    keep[[ar.src_i, ar.snk_i]] = False
    nodes = np.flatnonzero(keep)
    idx = np.full(n, -1, dtype=np.int64)
    idx[nodes] = np.arange(2, 2 + nodes.size)  # 0: source, 1: sink
    ks, kd = ar.k_src, ar.k_dst
    inner = keep[ks] & keep[kd]
    into = ~keep[ks] & keep[kd]
    hb = np.zeros(n)
    np.maximum.at(hb, kd[into], head_min[ks[into]] + ar.wmax[ks[into]] - ar.delta[ks[into]])
    out = keep[ks] & ~keep[kd]
    tb = np.zeros(n)
    np.maximum.at(tb, ks[out], ar.wmax[kd[out]] - ar.delta[kd[out]] + tail_min[kd[out]])
    hv, tv = nodes[hb[nodes] > 0], nodes[tb[nodes] > 0]
    m = 2 + nodes.size
    hd = np.arange(m, m + hv.size)
    td = np.arange(m + hv.size, m + hv.size + tv.size)
    src = np.concatenate([idx[ks[inner]], hd, idx[tv]])
    dst = np.concatenate([idx[kd[inner]], idx[hv], td])
    sink_preds = np.concatenate([idx[ar.sink_preds[keep[ar.sink_preds]]], td])
    dummies = hv.size + tv.size
    pos = np.empty(n, dtype=np.int64)
    pos[np.asarray(ar.order)] = np.arange(n)
    order = [0, *hd.tolist(), *idx[nodes[np.argsort(pos[nodes])]].tolist(), *td.tolist(), 1]
    names = [SOURCE, SINK, *(ar.names[i] for i in nodes.tolist()), *(f"<before {i}>" for i in hv.tolist()),
             *(f"<after {i}>" for i in tv.tolist())]
    sub = _Arrays(
        names, order, 0, 1,
        np.concatenate([[-1, -1], ar.stage[nodes], np.full(dummies, -1)]),
        np.concatenate([[0.0, 0.0], ar.wmax[nodes], hb[hv], tb[tv]]),
        np.concatenate([[0.0, 0.0], ar.delta[nodes], np.zeros(dummies)]),
        src, dst, sink_preds, ar.split, counts,
    )
    back = np.concatenate([[ar.src_i, ar.snk_i], nodes, np.full(dummies, -1)])
    return sub, back


def _solve_region(
    ar: _Arrays, r_max: float, opts: dict[str, object],
) -> tuple[float, np.ndarray, dict[str, object]] | None:
    """Solve the LP on a growing set of near-critical actions; ``None`` when that set grows too large.

    Round: solve both stages on the relaxation to the kept actions (:func:`_region_arrays`), giving a
    lower bound ``T_R`` of ``T*`` and, at ``T <= T_R``, freeze ratios whose sum bounds the least freezing
    from below.  With every left-out action unfrozen, the longest path of the whole batch is computed: if
    it is ``T_R``, these ratios reach the lower bound of both stages, so they are the lexicographic optimum
    of the whole LP (exact, no heuristics in the result).  Otherwise the actions on the paths longer than
    ``T_R`` are added and the round repeats.
    The first set: actions within ``_REGION_START`` of the longest path when every freezable action is
    frozen by ``r_max`` (the budget spread evenly).
    """
    paths = _Paths(ar)
    n = len(ar.names)
    wmin = ar.wmax - ar.delta
    head_min, tail_min = paths.head_tail(wmin)
    counts = _stage_counts(ar)
    ref = ar.wmax - r_max * ar.delta
    h, t = paths.head_tail(ref)
    through = h + ref + t
    keep = through >= through.max() * (1 - _REGION_START)
    info: dict[str, object] = {"rounds": 0}
    totals = {"iters1": 0, "iters2": 0, "solve1_s": 0.0, "stage2_s": 0.0, "build1_s": 0.0, "build2_s": 0.0}
    for rnd in range(1, _REGION_MAX_ROUNDS + 1):
        if keep.sum() > _REGION_MAX_FRACTION * (n - 2):
            return None
        sub, back = _region_arrays(ar, keep, head_min, tail_min, counts)
        t_r, r_sub, sinfo = _lexicographic(sub, r_max, opts, True, "critical", True)
        for k in totals:
            totals[k] += sinfo[k]  # type: ignore[operator]
        r = np.zeros(n)
        real = back >= 0
        r[back[real]] = r_sub[real]
        d = ar.wmax - ar.delta * r
        h, t = paths.head_tail(d)
        through = h + d + t
        t_full = float(through.max())
        info.update(sinfo, **totals, rounds=rnd, region_actions=int(keep.sum()))
        bound = t_r * (1 + 1e-9) + 1e-9
        if t_full <= bound:
            return t_r, r, info
        add = (through > bound) & ~keep
        if add.sum() > keep.sum():  # far off: add only the worst paths' actions
            add = (through >= t_full - _REGION_BAND * (t_full - t_r)) & ~keep
        keep |= add
    return None  # pragma: no cover - the set grows every round, so this needs > _REGION_MAX_ROUNDS rounds


def solve_freeze_lp(
    dag: nx.DiGraph,
    weights: NodeWeights,
    r_max: float,
    *,
    solver: str = "auto",
    options: dict[str, object] | None = None,
    stats: dict[str, float] | None = None,
) -> LPSolution:
    """Solve the freeze LP lexicographically (min batch time, then min total freezing).

    ``solver``: ``"auto"`` (``region`` from ``_REGION_MIN_ACTIONS`` actions on, else ``fast``), ``region``
    (the LP on a growing set of near-critical actions, exact, see :func:`_solve_region`; falls back to
    ``fast`` when the set grows past ``_REGION_MAX_FRACTION`` of the actions), ``fast`` (the whole LP: dual
    simplex, Devex pricing, crafted stage-1 basis, stage 2 on the stage-1 optimal face with presolve) or
    one of ``dual`` (all-frozen stage-1 basis, stage 2 a fresh pruned model), ``dual-dse``, ``primal``,
    ``ipx``, ``slack`` (see ``_SOLVER_OPTIONS``).
    ``options`` are extra HiGHS options; ``stats`` (if given) receives model sizes and timings.
    """
    if not isinstance(r_max, (int, float)) or isinstance(r_max, bool) or not 0.0 <= float(r_max) <= 1.0:
        raise PlannerError(f"r_max must be a number in [0, 1], got {r_max!r}")
    if solver not in SOLVERS:
        raise PlannerError(f"unknown solver {solver!r} (choose {', '.join(SOLVERS)})")
    r_max = float(r_max)
    t0 = time.perf_counter()
    ar = _arrays(dag, weights)
    key = solver
    if solver == "auto":
        key = "region" if len(ar.names) - 2 >= _REGION_MIN_ACTIONS else _AUTO
    result = None
    if key == "region":
        base = _SOLVER_OPTIONS[_AUTO][0]
        if (ar.delta > 0).any():
            result = _solve_region(ar, r_max, {**base, **(options or {})})
        if result is None:
            key = _AUTO
    if result is None:
        opts, use_basis, basis_start, on_face = _SOLVER_OPTIONS[key]
        if basis_start == "auto":
            # Measured (scripts/bench_planner.py): the critical-path start is 5-10x faster on full-backward
            # schedules, the all-frozen start 2-4x faster on split (I/W) ones.
            basis_start = "frozen" if ar.split else "critical"
        result = _lexicographic(ar, r_max, {**opts, **(options or {})}, use_basis, basis_start, on_face)
    t_star, r, info = result
    t3 = time.perf_counter()

    durations = {a: float(weights.w_max[a]) for a in ar.names if a != SOURCE and a != SINK}
    for i in np.flatnonzero(r > 0).tolist():
        a = ar.names[i]
        hi, lo = durations[a], float(weights.w_min[a])
        durations[a] = min(hi, max(lo, hi - (hi - lo) * float(r[i])))
    makespan, starts, _ = longest_path(dag, durations)
    if not math.isclose(makespan, t_star, rel_tol=1e-6, abs_tol=1e-6):
        raise PlannerError(
            f"LP batch time {t_star:.9g} does not match the longest path {makespan:.9g} of its durations"
        )
    seconds = time.perf_counter() - t0
    if stats is not None:
        stats.update(info, actions=len(durations), total_s=seconds, check_s=time.perf_counter() - t3)
    return LPSolution(durations, starts, makespan, "optimal", seconds, f"highs-{key}")
