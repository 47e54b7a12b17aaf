"""The freeze LP's per-node arrays of the batch DAG (:class:`DagArrays`), shared by both stages, and of a
region's relaxation (:func:`region_arrays`, :mod:`planner.lp.region`), the stage budgets, and repeated longest
paths over them (:class:`Paths`).

Reductions made here (exact, so the reduced LP of :mod:`planner.lp.model` has the same optimum as the plain one):

* source edges become the bound ``start >= 0`` (they carry no delay);
* a same-rank edge ``u -> v`` whose ``v`` is not ``u``'s rank successor and that has no delay is implied by
  the rank chain ``u -> s_1 -> ... -> v`` (rank-successor edges, always kept): durations and delays are
  ``>= 0``, so the chain's rows give ``start(v) >= end(u)``.  An implied edge with a delay is kept (the
  chain need not cover its delay); the delays of :func:`planner.timing.comm.estimate_edge_delays` are only on
  cross-rank edges, so there this reduction drops exactly the edges it drops without delays.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import networkx as nx
import numpy as np

from planner.errors import PlannerError
from planner.lp.budget import RMax, stage_r_max
from planner.schedule.dag import SINK, SOURCE, DagIndex, Layers, dag_index, farthest, layers
from planner.trace.load import NodeWeights, freezable_mask


@dataclass
class DagArrays:
    """Per-node arrays of the DAG shared by both stages."""

    names: list[str]
    order: list[int]
    src_i: int
    snk_i: int
    stage: np.ndarray
    wmax: np.ndarray
    delta: np.ndarray  # w_max - w_min for freezable actions (above the problem's min_delta), else 0
    k_src: np.ndarray  # edges that need a row (after dropping source edges and implied same-rank edges)
    k_dst: np.ndarray
    sink_preds: np.ndarray
    split: bool = False  # the schedule splits backward into I and W
    stage_counts: dict[int, int] | None = None  # freezable actions per stage (budget base); None: count here
    k_c: np.ndarray | None = None  # delay (ms) of each kept edge; None: no delays (every edge 0)


def dag_arrays(dag: nx.DiGraph, weights: NodeWeights, delay: np.ndarray | None = None) -> DagArrays:
    """Index ``dag`` and its weights into arrays, dropping source edges and implied same-rank edges.

    ``delay``: one delay (ms) per edge of ``dag_index(dag)`` (:func:`planner.schedule.dag.edge_delay_array`), given
    to the kept edges (``k_c``); ``None`` without delays.  ``stage_counts`` counts every freezable action
    (``w_max > w_min``), also those :func:`planner.lp.problem.build_problem` then leaves without a ratio."""
    di = dag_index(dag)
    names = di.names
    n = len(names)
    src_i, snk_i = di.index[SOURCE], di.index[SINK]
    rank = np.full(n, -1, dtype=np.int64)
    stage = np.full(n, -1, dtype=np.int64)
    wmax = np.zeros(n)
    delta = np.zeros(n)
    split = False  # the schedule splits backward into I and W
    # every action's attributes and weights a field at a time (C-level maps, not a Python loop per node)
    idx = action_nodes(n, src_i, snk_i)
    acts = list(map(names.__getitem__, idx.tolist()))
    if acts:
        attrs = list(map(dag._node.__getitem__, acts))  # the nodes' attribute dicts (the graph's own)
        rk, sg, kd = (list(map(get, attrs)) for get in _RANK_STAGE_KIND)
        try:
            hi = np.fromiter(map(weights.w_max.__getitem__, acts), dtype=np.float64, count=len(acts))
            lo = np.fromiter(map(weights.w_min.__getitem__, acts), dtype=np.float64, count=len(acts))
        except KeyError:
            a = next(a for a in acts if a not in weights.w_max or a not in weights.w_min)
            raise PlannerError(f"no node weights for action {a!r}") from None
        rank[idx], stage[idx], wmax[idx] = rk, sg, hi
        frz = freezable_mask(kd, hi, lo)
        delta[idx[frz]] = (hi - lo)[frz]
        split = "W" in kd
    st, cn = np.unique(stage[delta > 0], return_counts=True)
    counts = dict(zip(st.tolist(), cn.tolist()))
    src, dst = di.src, di.dst
    real = (src != src_i) & (dst != snk_i)
    keep = real & ((rank[src] != rank[dst]) | (_rank_successor(di, rank)[src] == dst))
    if delay is not None:
        keep |= real & (delay > 0)  # a same-rank edge with a delay is not implied by the rank chain
    return DagArrays(
        names,
        di.order.tolist(),
        src_i,
        snk_i,
        stage,
        wmax,
        delta,
        src[keep],
        dst[keep],
        src[(dst == snk_i) & (src != src_i)],
        split,
        counts,
        k_c=None if delay is None else delay[keep],
    )


def action_nodes(n: int, src_i: int, snk_i: int) -> np.ndarray:
    """The nodes ``0..n-1`` but the source ``src_i`` and the sink ``snk_i``, in order: the actions."""
    keep = np.ones(n, dtype=bool)
    keep[[src_i, snk_i]] = False
    return np.flatnonzero(keep)


_RANK_STAGE_KIND = tuple(map(operator.itemgetter, ("rank", "stage", "kind")))


def _rank_successor(di: DagIndex, rank: np.ndarray) -> np.ndarray:
    """Per node, the next action in its rank's order (-1 for none): the same-rank successor that comes
    first topologically (every other same-rank successor is reached through the rank chain)."""
    n = len(di.names)
    topo_pos = np.empty(n, dtype=np.int64)
    topo_pos[di.order] = np.arange(n)
    src, dst = di.src, di.dst
    same = (rank[src] >= 0) & (rank[src] == rank[dst])
    s_same, d_same = src[same], dst[same]
    order = np.lexsort((topo_pos[d_same], s_same))
    s_sorted, d_sorted = s_same[order], d_same[order]
    first = np.ones(s_sorted.size, dtype=bool)
    first[1:] = s_sorted[1:] != s_sorted[:-1]
    rank_succ = np.full(n, -1, dtype=np.int64)
    rank_succ[s_sorted[first]] = d_sorted[first]
    return rank_succ


class Paths:
    """Predecessor/successor lists of the kept edges of a :class:`DagArrays`, for repeated longest paths, each a
    few numpy calls per level of the DAG (:func:`planner.schedule.dag.farthest`; the levels are found on first use)."""

    def __init__(self, arrays: DagArrays) -> None:
        n = len(arrays.names)
        perm = np.argsort(arrays.k_dst, kind="stable")
        self.pptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(arrays.k_dst, minlength=n), out=self.pptr[1:])
        self.preds = arrays.k_src[perm]
        self.pdelay = None if arrays.k_c is None else arrays.k_c[perm]  # aligned with preds
        perm = np.argsort(arrays.k_src, kind="stable")
        self.sptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(arrays.k_src, minlength=n), out=self.sptr[1:])
        self.succs = arrays.k_dst[perm]
        self.sdelay = None if arrays.k_c is None else arrays.k_c[perm]  # aligned with succs
        self.order = arrays.order
        self.n = n
        self._heads: Layers | None = None
        self._tails: Layers | None = None
        self._last_tail: tuple[bytes, np.ndarray] | None = None  # the last durations given to tail, and its result

    @property
    def heads(self) -> Layers:
        """The predecessor lists by level (longest paths to a node's start)."""
        if self._heads is None:
            self._heads = layers(self.pptr, self.preds, self.order)
        return self._heads

    @property
    def tails(self) -> Layers:
        """The successor lists by level (longest paths from a node's end)."""
        if self._tails is None:
            self._tails = layers(self.sptr, self.succs, reversed(self.order))
        return self._tails

    def head_tail(self, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Longest path (durations ``dur``, kept edges and their delays) to each node's start and from its end."""
        return farthest(self.heads, dur, self.pdelay), self.tail(dur)

    def tail(self, dur: np.ndarray) -> np.ndarray:
        """Longest path from each node's end (one pass; ``max(dur + tail)`` is the batch time). The region method
        asks again for the durations it asked for last (3 of a 98k-action plan's 25 passes): that answer is kept
        (a copy is returned) and given again for the same durations, bit for bit."""
        key = np.asarray(dur, dtype=np.float64).tobytes()
        if self._last_tail is None or self._last_tail[0] != key:
            self._last_tail = (key, farthest(self.tails, dur, self.sdelay))
        return self._last_tail[1].copy()


def stage_counts(arrays: DagArrays) -> dict[int, int]:
    """Freezable actions per stage, the base of each stage's budget (``arrays.stage_counts`` when given)."""
    if arrays.stage_counts is not None:
        return arrays.stage_counts
    st, cn = np.unique(arrays.stage[arrays.delta > 0], return_counts=True)
    return dict(zip(st.tolist(), cn.tolist()))


def stage_budgets(arrays: DagArrays, r_max: RMax) -> np.ndarray:
    """Each stage's budget ``r_max_s * n_s`` (the most its freeze ratios may sum to), indexed by stage, with
    ``n_s`` from :func:`stage_counts` (for a region, the whole batch's counts)."""
    counts = stage_counts(arrays)
    budget = np.zeros(max(int(arrays.stage.max()), max(counts, default=-1)) + 1)
    for s_, c in counts.items():
        budget[s_] = stage_r_max(r_max, s_) * c
    return budget


def region_arrays(
    arrays: DagArrays,
    keep: np.ndarray,
    head_min: np.ndarray,
    tail_min: np.ndarray,
    counts: dict[int, int],
) -> tuple[DagArrays, np.ndarray]:
    """The relaxation of the LP to the actions ``keep`` (a mask over ``arrays``'s nodes).

    Kept actions keep their edges among themselves.  Every path through left-out actions is replaced by
    what it is at least whatever the freezing: a kept action with a left-out predecessor cannot start
    before the longest all-frozen (``w_min``) path to it, and one with a left-out successor leaves at least
    the longest all-frozen path after it (delays of the edges crossing the region's border included).
    These bounds become fixed-duration dummy actions before/after it, joined to it by edges without
    delay; edges among kept actions keep their delays.  The per-stage budgets stay those of the whole
    batch (``counts``).  Every schedule of the whole batch restricted to the kept actions is feasible
    here, so this LP's batch time is a lower bound of ``T*`` and, at ``T <= T*``, its least freezing a
    lower bound of the least freezing.
    Returns the arrays and, per node of them, the index of the node of ``arrays`` (-1 for dummies).
    """
    n = len(arrays.names)
    keep = keep.copy()
    keep[[arrays.src_i, arrays.snk_i]] = False
    nodes = np.flatnonzero(keep)
    idx = np.full(n, -1, dtype=np.int64)
    idx[nodes] = np.arange(2, 2 + nodes.size)  # 0: source, 1: sink
    ks, kd = arrays.k_src, arrays.k_dst
    inner = keep[ks] & keep[kd]
    into = ~keep[ks] & keep[kd]
    kc = arrays.k_c
    hb = np.zeros(n)
    arrive = head_min[ks[into]] + arrays.wmax[ks[into]] - arrays.delta[ks[into]]
    np.maximum.at(hb, kd[into], arrive if kc is None else arrive + kc[into])
    out = keep[ks] & ~keep[kd]
    tb = np.zeros(n)
    leave = arrays.wmax[kd[out]] - arrays.delta[kd[out]] + tail_min[kd[out]]
    np.maximum.at(tb, ks[out], leave if kc is None else leave + kc[out])
    hv, tv = nodes[hb[nodes] > 0], nodes[tb[nodes] > 0]
    m = 2 + nodes.size
    hd = np.arange(m, m + hv.size)
    td = np.arange(m + hv.size, m + hv.size + tv.size)
    src = np.concatenate([idx[ks[inner]], hd, idx[tv]])
    dst = np.concatenate([idx[kd[inner]], idx[hv], td])
    sink_preds = np.concatenate([idx[arrays.sink_preds[keep[arrays.sink_preds]]], td])
    dummies = hv.size + tv.size
    pos = np.empty(n, dtype=np.int64)
    pos[np.asarray(arrays.order)] = np.arange(n)
    order = [0, *hd.tolist(), *idx[nodes[np.argsort(pos[nodes])]].tolist(), *td.tolist(), 1]
    names = [
        SOURCE,
        SINK,
        *(arrays.names[i] for i in nodes.tolist()),
        *(f"<before {i}>" for i in hv.tolist()),
        *(f"<after {i}>" for i in tv.tolist()),
    ]
    sub = DagArrays(
        names,
        order,
        0,
        1,
        np.concatenate([[-1, -1], arrays.stage[nodes], np.full(dummies, -1)]),
        np.concatenate([[0.0, 0.0], arrays.wmax[nodes], hb[hv], tb[tv]]),
        np.concatenate([[0.0, 0.0], arrays.delta[nodes], np.zeros(dummies)]),
        src,
        dst,
        sink_preds,
        arrays.split,
        counts,
        None if kc is None else np.concatenate([kc[inner], np.zeros(hv.size + tv.size)]),
    )
    back = np.concatenate([[arrays.src_i, arrays.snk_i], nodes, np.full(dummies, -1)])
    return sub, back
