"""The schedule DAG of one training batch, and its longest path.

Nodes are the batch's actions plus ``"source"`` and ``"sink"``.  Edges are the data dependencies
(forward chain across stages, backward chain back across stages, F before its backward, I before its W)
plus each rank's execution order, which is what makes the DAG schedule-specific (seeds digest 1.5).
An ``OVERLAP_F_B`` pair (DualPipeV) is one node with the edges of both its parts: it starts when the
inputs of its forward and of its backward are there and both parts' outputs are due at its end (torch
sends them after the whole pair); its attributes ``stage``/``microbatch`` are its backward part's.
Placement is taken from ``stage_to_rank``, so looped/interleaved and V-shaped placements need no
special cases.  :func:`build_dag` returns a :class:`BatchDag`: a frozen graph (``nx.freeze``, its structure
cannot change) that carries its integer index (:class:`DagIndex`), built with it once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import chain

import networkx as nx
import numpy as np

from planner.errors import PlannerError
from planner.schedule.actions import PAIR, parse_action
from planner.schedule.meta import ActionTable, TraceMeta

SOURCE = "source"
SINK = "sink"

EdgeDelays = dict[tuple[str, str], float]
"""Delay (ms) per DAG edge ``(u, v)``: ``v`` starts no earlier than ``u``'s end plus the delay; absent = 0
(estimated by :func:`planner.timing.comm.estimate_edge_delays`)."""


@dataclass
class DagIndex:
    """Integer view of a DAG for linear-time passes: node ``i`` is ``names[i]``, ``order`` is topological,
    predecessors of ``i`` are ``pred_idx[pred_ptr[i]:pred_ptr[i+1]]``."""

    names: list[str]
    index: dict[str, int]
    order: np.ndarray
    pred_ptr: np.ndarray
    pred_idx: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    pred_perm: np.ndarray | None = None  # edge (position in src/dst) of each entry of pred_idx
    edge_keys: tuple[np.ndarray, np.ndarray] | None = None  # sorted src * n + dst and its argsort (lazy)
    layers: Layers | None = None  # pred lists by level, for longest paths (lazy)
    depth: np.ndarray | None = None  # each node's level (the most edges on a path to it), found by Kahn's pass


@dataclass
class Layers:
    """Neighbour lists (CSR: node ``x``'s neighbours are ``nbr[ptr[x]:ptr[x+1]]``) grouped by depth, for longest
    paths in numpy one level at a time (:func:`farthest`): a node's depth is the most edges on a path to it from a
    node without neighbours, so every node of one level has all its neighbours in earlier levels.

    ``nbr``/``entry``: every entry's neighbour and its position in the CSR, entries by level, then node;
    ``levels``: per level ``(a, b, nodes, seg)``, its entries ``a:b``, its nodes, and where each node's entries
    start within ``a:b`` (``None`` for level 0, whose nodes have no neighbours)."""

    n: int
    nbr: np.ndarray
    entry: np.ndarray
    levels: list[tuple[int, int, np.ndarray, np.ndarray | None]]
    steps: list[tuple[int, list[int], list[int]]] | None = field(default=None, repr=False, compare=False)
    """The same lists as plain Python, node by node in level order, ``(node, neighbours, their CSR entries)``
    (level 0 left out): what :func:`farthest` loops over on a small DAG (made at its first such call)."""


def layers(ptr: np.ndarray, nbr: np.ndarray, order: Iterable[int], depth: np.ndarray | None = None) -> Layers:
    """The :class:`Layers` of an acyclic CSR; ``order``: its nodes, every node after its neighbours. ``depth``:
    each node's depth when the caller has it (``DagIndex.depth``; ``order`` is then not read)."""
    n = ptr.size - 1
    deg = np.diff(ptr)
    node_of = np.repeat(np.arange(n), deg)  # the node each entry belongs to
    if depth is None:
        depth = _depths(ptr, nbr, order)
    d = int(depth.max()) if n else 0
    entry = np.argsort(depth[node_of] * n + node_of, kind="stable")  # by level, then node, CSR order within
    bounds = np.concatenate([[0], np.cumsum(np.bincount(depth[node_of], minlength=d + 1))]).tolist()
    node_order = np.argsort(depth, kind="stable")
    nbounds = np.concatenate([[0], np.cumsum(np.bincount(depth, minlength=d + 1))]).tolist()
    first = np.cumsum(deg[node_order]) - deg[node_order]  # where each node's entries start, in level order
    levels: list[tuple[int, int, np.ndarray, np.ndarray | None]] = []
    for k in range(d + 1):
        a, b, lo, hi = bounds[k], bounds[k + 1], nbounds[k], nbounds[k + 1]
        levels.append((a, b, node_order[lo:hi], first[lo:hi] - a if k else None))
    return Layers(n, nbr[entry], entry, levels)


def _depths(ptr: np.ndarray, nbr: np.ndarray, order: Iterable[int]) -> np.ndarray:
    """Each node's depth in an acyclic CSR (0 without neighbours, else one more than its deepest neighbour)."""
    n = ptr.size - 1
    p, nb = ptr.tolist(), nbr.tolist()
    dep = [0] * n
    get = dep.__getitem__
    for x in order:  # (one and two neighbours, most nodes of a batch DAG, without a slice and a map)
        lo, hi = p[x], p[x + 1]
        k = hi - lo
        if k == 1:
            dep[x] = dep[nb[lo]] + 1
        elif k == 2:
            a, b = dep[nb[lo]], dep[nb[lo + 1]]
            dep[x] = (a if a > b else b) + 1
        elif k:
            dep[x] = max(map(get, nb[lo:hi])) + 1
    return np.asarray(dep, dtype=np.int64)


LOOP_NODES = 4096
"""Up to this many nodes :func:`farthest` loops over the nodes in plain Python: its numpy passes cost a few calls
per level, more than a small DAG's whole work (a PP=2 ZBV batch of 8 microbatches: 98 nodes in 51 levels, whose
drift the runtime checks every stable step)."""


def farthest(lay: Layers, w: np.ndarray, delay: np.ndarray | None = None, floor: float = 0.0) -> np.ndarray:
    """``val[x] = max(floor, max over neighbours y of val[y] + w[y] + delay)`` (``delay`` per CSR entry; ``val`` 0
    for a node without neighbours): the longest path to each node's start (predecessor lists) or from its end
    (successor lists); the same floating-point sums and maxima as a loop over the nodes in topological order,
    which it is on a small DAG with finite weights and delays (:data:`LOOP_NODES`)."""
    if lay.n <= LOOP_NODES and np.isfinite(w).all() and (delay is None or np.isfinite(delay).all()):
        return _farthest_loop(lay, w, delay, floor)
    val = np.zeros(lay.n)
    nbr = lay.nbr
    wy = w[nbr]
    dl = None if delay is None else delay[lay.entry]
    for a, b, nodes, seg in lay.levels:
        if seg is None:
            continue
        t = val[nbr[a:b]]
        t += wy[a:b]
        if dl is not None:
            t += dl[a:b]
        m = t if seg.size == b - a else np.maximum.reduceat(t, seg)
        val[nodes] = np.maximum(m, floor)
    return val


def _farthest_loop(lay: Layers, w: np.ndarray, delay: np.ndarray | None, floor: float) -> np.ndarray:
    """:func:`farthest` node by node: each sum ``(val[y] + w[y]) + delay`` as the level pass adds it, their maximum
    (exact, so the same float in any order), then ``floor``."""
    if lay.steps is None:
        nbr, entry = lay.nbr.tolist(), lay.entry.tolist()
        steps = []
        for a, b, nodes, seg in lay.levels:
            if seg is None:
                continue
            cuts = [a + c for c in seg.tolist()] + [b]
            for x, lo, hi in zip(nodes.tolist(), cuts, cuts[1:]):
                steps.append((x, nbr[lo:hi], entry[lo:hi]))
        lay.steps = steps
    val = [0.0] * lay.n
    wl = w.tolist()
    dl = [0.0] * lay.nbr.size if delay is None else delay.tolist()
    plain = delay is None
    for x, ys, es in lay.steps:
        if len(ys) == 1:  # (most nodes of a batch DAG: one or two neighbours, without a list and a max)
            y = ys[0]
            best = val[y] + wl[y] if plain else val[y] + wl[y] + dl[es[0]]
        elif len(ys) == 2:
            y, z = ys
            a = val[y] + wl[y] if plain else val[y] + wl[y] + dl[es[0]]
            b = val[z] + wl[z] if plain else val[z] + wl[z] + dl[es[1]]
            best = b if b > a else a  # (max([a, b]): the first of equals)
        else:
            best = max([val[y] + wl[y] for y in ys] if plain else [val[y] + wl[y] + dl[e] for y, e in zip(ys, es)])
        val[x] = best if best > floor else floor
    return np.asarray(val, dtype=np.float64)


class BatchDag(nx.DiGraph):
    """The batch DAG of :func:`build_dag`: a frozen networkx graph with the ``meta`` it was built from and its
    integer ``index``, computed once when it is built (indexing a 98k-action DAG takes ~0.4 s)."""

    meta: TraceMeta
    index: DagIndex


def build_dag(meta: TraceMeta) -> BatchDag:
    """Build the batch DAG from validated trace metadata; the graph is frozen (read-only structure).

    Raises :class:`PlannerError` naming the actions of one cycle when ``rank_orders`` contradict the
    data dependencies (the schedule could never run).
    """
    nodes, edges = _actions(meta)
    succ: dict[str, dict[str, dict]] = {a: {} for a in nodes}
    pred: dict[str, dict[str, dict]] = {a: {} for a in nodes}
    for u, v in edges:
        if u != v:  # (a pair's parts never depend on each other)
            succ[u][v] = pred[v][u] = {}
    actions = list(nodes)[2:]
    heads = [a for a in actions if not pred[a]]
    tails = [a for a in actions if not succ[a]]
    for a in heads:
        succ[SOURCE][a] = pred[a][SOURCE] = {}
    for a in tails:
        succ[a][SINK] = pred[SINK][a] = {}
    if not actions:
        succ[SOURCE][SINK] = pred[SINK][SOURCE] = {}
    g = BatchDag()
    # the graph's own node and adjacency dicts (what DiGraph.__init__ sets), filled above in one pass: the
    # graph add_nodes_from/add_edges_from build, in the same order, without their per-edge checks and copies
    # (0.7 s of a 98k-action DAG's 1 s)
    g._node, g._adj, g._pred = nodes, succ, pred
    nx.freeze(g)
    g.meta = meta
    try:
        g.index = index_graph(g)  # Kahn's algorithm on arrays: linear, and raises on a cycle
        return g
    except PlannerError:
        pass
    names = [u for u, _ in nx.find_cycle(g)]
    raise PlannerError("rank_orders contradict the data dependencies (cycle: " + " -> ".join(names + names[:1]) + ")")


def _actions(meta: TraceMeta) -> tuple[dict[str, dict], list[tuple[str, str]]]:
    """The nodes (source, sink, then every action of ``meta`` with its attributes, rank by rank) and the edges
    between actions: the rank-order edges, then the data dependencies."""
    nodes: dict[str, dict] = {SOURCE: {}, SINK: {}}
    t = meta.action_table()  # every name's fields, read once per metadata
    edges: list[tuple[str, str]] = []
    if PAIR not in t.kind:  # no pair: each action is its one part
        for a, s, k, m, r in zip(t.names, t.stage, t.kind, t.microbatch, t.rank):
            nodes[a] = {"stage": s, "kind": k, "microbatch": m, "rank": r}
        _rank_edges(meta, edges)
        if _plain_dependencies(t, meta.num_stages, meta.num_microbatches, edges):
            return nodes, edges
        by_key = {(s, k, m): a for a, s, k, m in zip(t.names, t.stage, t.kind, t.microbatch)}
    else:
        by_key = {}  # every plain action, and each part of a pair -> its node
        for r in sorted(meta.rank_orders):
            for a in meta.rank_orders[r]:
                act = parse_action(a)
                nodes[a] = {"stage": act.stage, "kind": act.kind, "microbatch": act.microbatch, "rank": r}
                for part in act.parts:
                    by_key[(part.stage, part.kind, part.microbatch)] = a
        _rank_edges(meta, edges)

    def grad_in(s: int, m: int) -> str | None:
        """The input-gradient action of (s, m): a full B, or the I of a split backward."""
        return by_key.get((s, "B", m)) or by_key.get((s, "I", m))

    for s in range(meta.num_stages):
        for m in range(meta.num_microbatches):
            f = by_key.get((s, "F", m))
            b = grad_in(s, m)
            if f is not None:
                nf = by_key.get((s + 1, "F", m))
                if nf is not None:
                    edges.append((f, nf))
                if b is not None:
                    edges.append((f, b))
            if b is not None:
                nb = grad_in(s + 1, m)
                if nb is not None:
                    edges.append((nb, b))
            i, w = by_key.get((s, "I", m)), by_key.get((s, "W", m))
            if i is not None and w is not None:
                edges.append((i, w))
    return nodes, edges


def _rank_edges(meta: TraceMeta, edges: list[tuple[str, str]]) -> None:
    """Each rank's execution order as edges (appended to ``edges``)."""
    for r in sorted(meta.rank_orders):
        order = meta.rank_orders[r]
        edges.extend(zip(order[:-1], order[1:]))


_KIND_ROW = {"F": 0, "B": 1, "I": 2, "W": 3}


def _plain_dependencies(t: ActionTable, n_stages: int, n_mb: int, edges: list[tuple[str, str]]) -> bool:
    """The data dependencies of plain actions (no pair) appended to ``edges`` in the order of :func:`_actions`'
    loop (stage by stage, microbatch by microbatch: F to the next stage's F, F to its backward, the next stage's
    input gradient to this one's, I to W), found over arrays: True. False, with nothing appended, where an action
    lies outside ``n_stages`` x ``n_mb`` or a (stage, kind, microbatch) comes twice (the loop then decides)."""
    n = len(t.names)
    stage, mb = np.asarray(t.stage, dtype=np.int64), np.asarray(t.microbatch, dtype=np.int64)
    if n == 0 or stage.min() < 0 or stage.max() >= n_stages or mb.min() < 0 or mb.max() >= n_mb:
        return False
    row = np.fromiter(map(_KIND_ROW.__getitem__, t.kind), dtype=np.int64, count=n)
    cell = stage * n_mb + mb
    if np.bincount(row * (n_stages * n_mb) + cell).max() > 1:
        return False
    slots = n_stages * n_mb
    ids = np.full((4, slots + n_mb), -1, dtype=np.int64)  # per kind and (stage, microbatch): its action; a stage more
    ids[row, cell] = np.arange(n)
    f, b, i, w = ids
    g = np.where(b >= 0, b, i)  # the input-gradient action: a full B, or the I of a split backward
    here, there = np.arange(slots), np.arange(n_mb, slots + n_mb)  # (s, m) and (s + 1, m)
    u = np.stack([f[here], f[here], g[there], i[here]], axis=1).ravel()  # per (s, m), its four edges in turn
    v = np.stack([f[there], g[here], g[here], w[here]], axis=1).ravel()
    on = (u >= 0) & (v >= 0)
    names = t.names
    edges.extend(zip(map(names.__getitem__, u[on].tolist()), map(names.__getitem__, v[on].tolist())))
    return True


def dag_index(dag: nx.DiGraph) -> DagIndex:
    """Integer index of ``dag``: the one a :class:`BatchDag` carries, else computed afresh (:func:`index_graph`)."""
    if isinstance(dag, BatchDag) and hasattr(dag, "index"):
        return dag.index
    return index_graph(dag)


def index_graph(dag: nx.DiGraph) -> DagIndex:
    """Index ``dag`` (topological order by Kahn's algorithm on arrays); a cycle is a :class:`PlannerError`."""
    names = list(dag.nodes)
    n = len(names)
    index = dict(zip(names, range(n)))
    # the edges in dag.edges' order (each node's successors in turn), read from the successor dicts a node at a time
    succ = list(map(dag._adj.__getitem__, names))
    out_deg = np.fromiter(map(len, succ), dtype=np.int64, count=n)
    src = np.repeat(np.arange(n, dtype=np.int64), out_deg)
    dst = np.fromiter(map(index.__getitem__, chain.from_iterable(succ)), dtype=np.int64, count=src.size)
    # Kahn's algorithm on arrays.
    perm = np.argsort(dst, kind="stable")
    pred_idx = src[perm]
    pred_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=pred_ptr[1:])
    succ_idx = dst.tolist()  # (the edges are by source already: each node's successors are dst[sp[u]:sp[u + 1]])
    sp = [0, *np.cumsum(out_deg).tolist()]
    indeg = np.diff(pred_ptr).tolist()
    stack = np.flatnonzero(np.diff(pred_ptr) == 0).tolist()
    order: list[int] = []
    dep = [0] * n  # each node's depth, final when it is taken (all its predecessors are), for its layers
    while stack:
        u = stack.pop()
        order.append(u)
        d = dep[u] + 1
        for v in succ_idx[sp[u] : sp[u + 1]]:
            if d > dep[v]:
                dep[v] = d
            indeg[v] -= 1
            if indeg[v] == 0:
                stack.append(v)
    if len(order) != n:
        raise PlannerError("the DAG has a cycle: rank_orders contradict the data dependencies")
    order_arr = np.asarray(order, dtype=np.int64)
    depth = np.asarray(dep, dtype=np.int64)
    return DagIndex(names, index, order_arr, pred_ptr, pred_idx, src, dst, perm, depth=depth)


def edge_delay_array(dag: nx.DiGraph, edge_ms: EdgeDelays | None) -> np.ndarray:
    """``edge_ms`` (ms per edge ``(u, v)``, ``planner.timing.comm``) as one delay per edge of ``dag_index(dag)``,
    aligned with its ``src``/``dst`` arrays; edges not in ``edge_ms`` get 0.

    Every key must be an edge of ``dag`` between two actions (source and sink edges carry no delay) and
    every value a finite number >= 0; anything else is a one-line :class:`PlannerError`.
    """
    di = dag_index(dag)
    out = np.zeros(di.src.size)
    if not edge_ms:
        return out
    n = len(di.names)
    index = di.index
    keys, values = [], []
    for (u, v), x in edge_ms.items():
        if u not in index or v not in index or u in (SOURCE, SINK) or v in (SOURCE, SINK):
            raise PlannerError(f"edge delay given for ({u!r}, {v!r}), which is not an edge between two actions")
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
            raise PlannerError(f"edge delay of ({u!r}, {v!r}) must be a finite number >= 0 (ms), got {x!r}")
        keys.append(index[u] * n + index[v])
        values.append(float(x))
    if di.edge_keys is None:
        ekey = di.src * n + di.dst
        eorder = np.argsort(ekey, kind="stable")
        di.edge_keys = (ekey[eorder], eorder)
    sorted_keys, eorder = di.edge_keys
    k = np.asarray(keys, dtype=np.int64)
    pos = np.minimum(np.searchsorted(sorted_keys, k), max(sorted_keys.size - 1, 0))
    missing = np.flatnonzero(sorted_keys[pos] != k) if sorted_keys.size else np.arange(k.size)
    if missing.size:
        i = int(k[missing[0]])
        raise PlannerError(
            f"edge delay given for ({di.names[i // n]!r}, {di.names[i % n]!r}), which is not an edge of the DAG"
        )
    out[eorder[pos]] = values
    return out


def longest_path(
    dag: nx.DiGraph,
    durations: Mapping[str, float],
    edge_ms: EdgeDelays | None = None,
) -> tuple[float, dict[str, float], list[str]]:
    """Earliest start of every node when each action takes ``durations[a]`` (source/sink take 0) and
    each edge ``(u, v)`` adds the delay ``edge_ms.get((u, v), 0)`` (``planner.timing.comm``): ``v`` starts at the
    maximum over its predecessors ``u`` of ``start(u) + durations[u] + edge_ms[(u, v)]``.

    Returns ``(makespan, starts, critical_path)``: the makespan is the sink's start, ``starts`` maps every
    node (source and sink included) to its start time, and ``critical_path`` lists the actions of one
    longest path from first to last.  Linear in nodes + edges (plus sorting the edges once per DAG when
    delays are given).
    """
    di = dag_index(dag)
    return indexed_longest_path(di, durations, edge_delay_array(dag, edge_ms)[di.pred_perm] if edge_ms else None)


def indexed_longest_path(
    di: DagIndex,
    durations: Mapping[str, float] | np.ndarray,
    pred_delay: np.ndarray | None,
) -> tuple[float, dict[str, float], list[str]]:
    """:func:`longest_path` on an index, with the delays given per entry of ``di.pred_idx`` (``None``: none).
    ``durations``: by action name, or an array aligned with ``di.names`` (source and sink 0)."""
    w, start_arr = _starts(di, durations, pred_delay)
    start = start_arr.tolist()
    preds = di.pred_idx
    # per node, the first predecessor (in pred_idx order) that sets its start, as the loop chose (-1: none), all
    # entries at once: the same sums and comparisons as one node at a time
    t = start_arr[preds] + w[preds]
    if pred_delay is not None:
        t += pred_delay
    node = np.repeat(np.arange(len(di.names)), np.diff(di.pred_ptr))  # the node each entry is a predecessor of
    tight = np.flatnonzero((t == start_arr[node]) & (t > -1.0))
    first = np.ones(tight.size, dtype=bool)
    first[1:] = node[tight[1:]] != node[tight[:-1]]
    setter = np.full(len(di.names), -1, dtype=np.int64)
    setter[node[tight[first]]] = preds[tight[first]]
    up = setter.tolist()
    sink = di.index[SINK]
    path: list[str] = []
    v = up[sink]
    while v >= 0:  # back from the sink along those predecessors
        if di.names[v] != SOURCE:
            path.append(di.names[v])
        v = up[v]
    path.reverse()
    starts = dict(zip(di.names, start))
    return start[sink], starts, path


def indexed_makespan(di: DagIndex, durations: Mapping[str, float] | np.ndarray, pred_delay: np.ndarray | None) -> float:
    """The makespan of :func:`indexed_longest_path` (the sink's start), without its starts by name and its path."""
    return float(_starts(di, durations, pred_delay)[1][di.index[SINK]])


def duration_array(di: DagIndex, durations: Mapping[str, float]) -> np.ndarray:
    """``durations`` by action name as an array aligned with ``di.names``, the source and the sink 0 whatever
    ``durations`` says; an action without one is a one-line :class:`PlannerError`."""
    dur = list(map(durations.get, di.names))
    for end in (SOURCE, SINK):
        if end in di.index:
            dur[di.index[end]] = 0.0
    if None in dur:
        raise PlannerError(f"no duration given for action {di.names[dur.index(None)]!r}")
    return np.array(dur, dtype=np.float64)


def _starts(
    di: DagIndex, durations: Mapping[str, float] | np.ndarray, pred_delay: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """The durations as an array aligned with ``di.names`` and every node's earliest start
    (:func:`indexed_longest_path`'s arguments)."""
    w = np.asarray(durations, dtype=np.float64) if isinstance(durations, np.ndarray) else duration_array(di, durations)
    if di.layers is None:
        di.layers = layers(di.pred_ptr, di.pred_idx, di.order.tolist() if di.depth is None else (), di.depth)
    return w, farthest(di.layers, w, pred_delay, floor=-1.0)  # a loop's running best started at -1
