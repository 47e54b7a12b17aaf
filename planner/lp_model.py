"""The freeze LP's model: per-node arrays of the batch DAG and one stage of the LP as sparse row-wise arrays.

``r_v`` is the freeze ratio of freezable action ``v`` and ``d_v = w_max_v - (w_max_v - w_min_v) * r_v`` its
duration (seeds digest 1.6).

* variables: a start time only for actions that need one (see below), ``r_v in [0, 1]`` only for
  freezable actions (fixed actions contribute constants), and ``T``;
* rows: ``start(v) >= start(u) + d_u + c_uv`` for the edges that are not implied, ``T >= start(u) + d_u``
  for the DAG's last actions, and per stage ``sum r_v <= r_max_s * |freezable actions of the stage|``
  (``r_max_s``: the one ``r_max`` of every stage, or the stage's own; :mod:`planner.budget`).
  ``c_uv >= 0`` is the edge's delay (``edge_ms``, :mod:`planner.comm`; 0 without delays).

Reductions (all exact, so the reduced LP has the same optimum as the plain one):

* source edges become the bound ``start >= 0`` (they carry no delay);
* a same-rank edge ``u -> v`` whose ``v`` is not ``u``'s rank successor and that has no delay is implied by
  the rank chain ``u -> s_1 -> ... -> v`` (rank-successor edges, always kept): durations and delays are
  ``>= 0``, so the chain's rows give ``start(v) >= end(u)``.  An implied edge with a delay is kept (the
  chain need not cover its delay); the delays of :func:`planner.comm.estimate_edge_delays` are only on
  cross-rank edges, so there this reduction drops exactly the edges it drops without delays;
* an action with a single remaining predecessor ``u`` starts exactly when ``u``'s data arrives (any
  feasible schedule stays feasible, with the same durations, when every action starts as early as
  possible; the dropped edges above stay satisfied), so its start is the affine expression
  ``start(u) + d_u + c_uv`` rather than a variable with a row.
  Expressions are capped at ``_MAX_TERMS`` freeze-ratio terms to keep rows short.

Every model comes with a starting basis (one tight precedence row per start variable and for ``T``: the
earliest-start schedule's tree) that :mod:`planner.lp_solve` hands to HiGHS; it is square by construction.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import networkx as nx
import numpy as np

from .actions import FREEZABLE_KINDS
from .budget import RMax, stage_r_max
from .comm import EdgeDelays
from .dag import SINK, SOURCE, dag_index, edge_delay_array
from .errors import PlannerError
from .trace import NodeWeights

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


@dataclass
class DagArrays:
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
    k_c: np.ndarray | None = None  # delay (ms) of each kept edge; None: no delays (every edge 0)


def dag_arrays(dag: nx.DiGraph, weights: NodeWeights, edge_ms: EdgeDelays | None = None) -> DagArrays:
    """Index ``dag`` and its weights into arrays, dropping source edges and implied same-rank edges;
    ``edge_ms`` (:mod:`planner.comm`) gives the kept edges their delays (``k_c``; ``None`` without delays)."""
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
    delay = None
    if edge_ms:
        delay = edge_delay_array(dag, edge_ms)  # source and sink edges never carry one
        keep |= real & (delay > 0)  # a same-rank edge with a delay is not implied by the rank chain
    return DagArrays(names, di.order.tolist(), src_i, snk_i, stage, wmax, delta,
                     src[keep], dst[keep], src[(dst == snk_i) & (src != src_i)], split,
                     k_c=None if delay is None else delay[keep])


class Paths:
    """Predecessor/successor lists of the kept edges of a :class:`DagArrays`, for repeated longest paths."""

    def __init__(self, ar: DagArrays) -> None:
        n = len(ar.names)
        perm = np.argsort(ar.k_dst, kind="stable")
        ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(ar.k_dst, minlength=n), out=ptr[1:])
        self.preds, self.pptr = ar.k_src[perm].tolist(), ptr.tolist()
        self.pdelay = None if ar.k_c is None else ar.k_c[perm].tolist()  # aligned with preds
        perm = np.argsort(ar.k_src, kind="stable")
        sptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(ar.k_src, minlength=n), out=sptr[1:])
        self.succs, self.sptr = ar.k_dst[perm].tolist(), sptr.tolist()
        self.sdelay = None if ar.k_c is None else ar.k_c[perm].tolist()  # aligned with succs
        self.order = ar.order
        self.n = n

    def head_tail(self, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Longest path (durations ``dur``, kept edges and their delays) to each node's start and from its end."""
        w = dur.tolist()
        head = _farthest(self.order, self.preds, self.pptr, w, self.pdelay)
        tail = _farthest(reversed(self.order), self.succs, self.sptr, w, self.sdelay)
        return np.asarray(head), np.asarray(tail)

    def tail(self, dur: np.ndarray) -> np.ndarray:
        """Longest path from each node's end (one pass; ``max(dur + tail)`` is the batch time)."""
        return np.asarray(_farthest(reversed(self.order), self.succs, self.sptr, dur.tolist(), self.sdelay))


def _farthest(
    order, nbrs: list[int], ptr: list[int], w: list[float], delay: list[float] | None,  # noqa: ANN001
) -> list[float]:
    """``val[x] = max(0, max over y in nbrs[ptr[x]:ptr[x+1]] of val[y] + w[y] + delay)``, for ``x`` in ``order``
    (every neighbour before ``x``): the longest path to a node's start (predecessors, topological order) or
    from its end (successors, reverse order)."""
    val = [0.0] * len(w)
    for x in order:
        b = 0.0
        if delay is None:
            for y in nbrs[ptr[x]:ptr[x + 1]]:
                t = val[y] + w[y]
                if t > b:
                    b = t
        else:
            for k in range(ptr[x], ptr[x + 1]):
                b = max(b, val[nbrs[k]] + w[nbrs[k]] + delay[k])
        val[x] = b
    return val


def stage_counts(ar: DagArrays) -> dict[int, int]:
    """Freezable actions per stage, the base of each stage's budget (``ar.stage_counts`` when given)."""
    if ar.stage_counts is not None:
        return ar.stage_counts
    st, cn = np.unique(ar.stage[ar.delta > 0], return_counts=True)
    return dict(zip(st.tolist(), cn.tolist()))


def stage_budgets(ar: DagArrays, r_max: RMax) -> np.ndarray:
    """Each stage's budget ``r_max_s * n_s`` (the most its freeze ratios may sum to), indexed by stage, with
    ``n_s`` from :func:`stage_counts` (for a region, the whole batch's counts)."""
    counts = stage_counts(ar)
    budget = np.zeros(max(int(ar.stage.max()), max(counts, default=-1)) + 1)
    for s_, c in counts.items():
        budget[s_] = stage_r_max(r_max, s_) * c
    return budget


def build_lp(
    dag: nx.DiGraph,
    weights: NodeWeights,
    r_max: RMax,
    *,
    t_bound: float | None = None,
    arrays: DagArrays | None = None,
    basis_start: str = "frozen",
) -> LPModel:
    """Assemble one stage of the reduced LP (no dense matrices, no per-row modelling API).

    ``t_bound=None``: stage 1, minimise ``T``.  Starting basis (``basis_start``): ``"frozen"``, the
    all-frozen earliest-start schedule (every ``r`` at 1, one tight row per start variable), or
    ``"critical"``, the unfrozen schedule's tree with only the freeze ratios on its path from ``T`` back
    to the source at 1.  Both are dual feasible (the ratios on that path are the only ones with a nonzero
    reduced cost, ``-delta``), so dual simplex only has to repair the budgets and precedence rows.

    ``t_bound=T*``: stage 2, ``T <= t_bound``, minimise ``sum r``.  Edges and actions that no path longer
    than ``t_bound`` can use even with every action at ``w_max`` are left out (exact: such paths cannot
    exceed ``t_bound`` whatever the durations); their freeze ratios are 0.  The starting basis is the
    unfrozen earliest-start schedule (every ``r`` at 0), dual feasible for this objective.
    """
    t0 = time.perf_counter()
    ar = arrays if arrays is not None else dag_arrays(dag, weights)
    names, n = ar.names, len(ar.names)
    delta, wmax = ar.delta, ar.wmax
    k_src, k_dst, sink_preds, k_c = ar.k_src, ar.k_dst, ar.sink_preds, ar.k_c
    stage2 = t_bound is not None
    frz_all = np.flatnonzero(delta > 0)
    if stage2:
        head, tail = Paths(ar).head_tail(wmax)  # all durations at w_max
        cut = t_bound * (1 - 1e-9) - 1e-9
        through = head + wmax + tail
        live = through > cut
        longest = head[k_src] + wmax[k_src] + wmax[k_dst] + tail[k_dst]  # through the edge
        keep = (longest if k_c is None else longest + k_c) > cut
        k_src, k_dst = k_src[keep], k_dst[keep]
        k_c = None if k_c is None else k_c[keep]
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
    kc = None if k_c is None else k_c[perm].tolist()  # delay of each entry of kp
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

    def add_rows(col: int, preds: list[int], delays: list[float] | None = None) -> float:
        """Rows ``col - end(u) >= delay`` for each u (``delays`` aligned with ``preds``, ``None``: 0);
        marks the tightest as a basis tree row."""
        best, best_row, best_u = -1.0, -1, -1
        for j, u in enumerate(preds):
            var, c, t = end_expr(u)
            e = val[u] + dur0_l[u]
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
                if kc is not None:
                    ex_c[v] += kc[lo]
                    val[v] += kc[lo]
                parent[v] = u
                continue
        ex_var[v] = ncol
        val[v], parent[v] = add_rows(ncol, kp[lo:hi], None if kc is None else kc[lo:hi])
        ncol += 1
    t_col = ncol
    ncol += 1
    r_upper = None
    if sink_preds.size:
        _, u = add_rows(t_col, sink_preds.tolist())  # T >= end(u): no delay on sink edges
        if crit:
            # Dual feasible start: only the freeze ratios on the tree path from T to the source at 1.
            r_upper = np.zeros(frz.size, dtype=bool)
            while u >= 0:
                if rcol_l[u] >= 0:
                    r_upper[rcol_l[u]] = True
                u = parent[u]
    n_prec = len(rows_lo)

    # Per-stage budget rows: sum of the stage's freeze ratios <= r_max_s * (its number of freezable actions).
    budget = stage_budgets(ar, r_max)
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
        budget_stages=stages.tolist(),
    )

