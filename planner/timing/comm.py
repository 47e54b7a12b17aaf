"""Delays on the DAG's cross-rank edges, estimated from the measured start times of a trace (no torch).

An action's record may carry ``start_ms``, its start on the host's monotonic clock (CPU timing only;
``docs/formats.md``), so it ends at ``start_ms + ms``.  Between two actions on different pipeline ranks the
data has to travel: send, wire, receive.  None of that is in ``ms`` (the compute time of the hooked call),
so the DAG's longest path ignores it.  This module measures it per cross-rank edge and hands it to
:func:`planner.schedule.dag.longest_path` and the freeze LP as :data:`EdgeDelays` (ms per DAG edge ``(u, v)``;
an edge that is not in the dict has no delay).

The rule of :func:`estimate_edge_delays`:

* Samples come from the records of phases ``upper`` and ``lower`` of replica 0 that have ``start_ms``.
  One *batch* is one step, or one accumulation batch of it: the ``k``-th record of an action in a step
  belongs to the step's ``k``-th batch.  Start times compare within one host (meta field ``hosts``: each
  rank's clock; without it every rank is on one host), and across hosts once the trace's clock samples
  (``clock_sync``) put them on rank 0's clock (``planner.trace.clocks``, applied when the trace is loaded);
  without those, only edges between two ranks on the same host get samples.
* For every cross-rank edge ``u -> v`` of ``build_dag(meta)`` (node attribute ``rank`` differs) and every
  batch with records of ``u``, ``v`` and ``p``: ``end_u = start_u + ms_u``, ``p`` is ``v``'s predecessor in its
  rank's order (``meta.rank_orders``) and ``end_p`` its end in that batch (``-inf`` when ``v`` is its rank's
  first action, which then needs no record of ``p``).  The sample ``start_v - end_u`` is *uncensored* only
  when ``end_p <= end_u``: ``v``'s rank was free when ``u``'s data became due, so ``v``'s start was set by
  ``u``'s data.  Otherwise ``v`` waited for its own rank and the sample is discarded.  (Every action but a
  DualPipeV pair has at most one cross-rank predecessor in these DAGs, so the rank predecessor is the only
  other thing ``v`` can have waited for; a pair, which has one for each of its parts, also needs its other
  cross-rank predecessor to have ended by ``end_u``.)  Batches missing a record of ``u``, ``v``, ``p`` (or
  that other predecessor) are skipped.
* An edge's delay is the median of its uncensored samples, clamped at ``>= 0``.  An edge with no
  uncensored sample gets the *link* value of its kind, within a host or across hosts: the median of all
  uncensored samples of the cross-rank edges of that kind, clamped at ``>= 0``; where its kind has none,
  the median over both kinds, or 0 when there is none at all.  (A cross-host edge so gets the measured
  cross-host delay, not the intra-host one, when any cross-host edge was measured.)
* Same-rank edges get no delay (what happens inside the hooked compute call is already in ``ms``).
* A trace without any ``start_ms`` gives ``{}``: no delays, the plan is exactly the delay-free one.
"""

from __future__ import annotations

import statistics

import networkx as nx
import numpy as np

from planner.schedule.dag import SINK, SOURCE, EdgeDelays, build_dag, dag_index
from planner.trace.clocks import same_clock
from planner.trace.load import Trace

__all__ = ["SAMPLE_PHASES", "EdgeDelays", "cross_rank_edges", "estimate_edge_delays", "summarize", "summary_line"]

SAMPLE_PHASES = ("upper", "lower")
"""Phases whose records give delay samples (the same records the node weights come from)."""


def cross_rank_edges(dag: nx.DiGraph) -> list[tuple[str, str]]:
    """The edges of ``dag`` between actions on different ranks, in the graph's edge order."""
    di, nodes = dag_index(dag), dag.nodes  # the index lists the edges in the graph's edge order
    names = di.names
    rank = np.fromiter((-1 if a in (SOURCE, SINK) else nodes[a]["rank"] for a in names), np.int64, len(names))
    rs, rd = rank[di.src], rank[di.dst]
    cross = (rs >= 0) & (rd >= 0) & (rs != rd)
    return [(names[u], names[v]) for u, v in zip(di.src[cross].tolist(), di.dst[cross].tolist())]


def _batches(trace: Trace) -> dict[tuple[int, int], dict[str, tuple[float, float]]]:
    """``(step, k) -> action -> (start, end)`` of replica 0's sample records; ``k`` is the accumulation batch."""
    seen: dict[tuple[int, str], int] = {}
    out: dict[tuple[int, int], dict[str, tuple[float, float]]] = {}
    for rec in trace.records:
        if rec.replica != 0 or rec.phase not in SAMPLE_PHASES:
            continue
        k = seen.get((rec.step, rec.action), 0)
        seen[rec.step, rec.action] = k + 1
        if rec.start_ms is not None:
            out.setdefault((rec.step, k), {})[rec.action] = (rec.start_ms, rec.start_ms + rec.ms)
    return out


def estimate_edge_delays(trace: Trace, dag: nx.DiGraph | None = None) -> EdgeDelays:
    """Delay (ms) of every cross-rank edge of the batch DAG by the rule of the module docstring; ``{}``
    when no record has ``start_ms``.  ``dag``: ``build_dag(trace.meta)``, when the caller has it."""
    if not trace.has_start_times():
        return {}
    meta = trace.meta
    if dag is None:
        dag = build_dag(meta)
    rank_of = {a: r for r, order in meta.rank_orders.items() for a in order}
    prev = {a: (order[i - 1] if i else None) for order in meta.rank_orders.values() for i, a in enumerate(order)}
    batches = list(_batches(trace).values())
    edges = cross_rank_edges(dag)
    cross_preds: dict[str, list[str]] = {}
    for u, v in edges:
        cross_preds.setdefault(v, []).append(u)
    samples: dict[tuple[str, str], list[float]] = {}
    for u, v in edges:
        if not same_clock(meta, rank_of[u], rank_of[v]):
            continue
        waits = [w for w in [prev[v], *cross_preds[v]] if w is not None and w != u]
        got = samples.setdefault((u, v), [])
        for t in batches:
            if u not in t or v not in t or any(w not in t for w in waits):
                continue
            end_u = t[u][1]
            if all(t[w][1] <= end_u for w in waits):
                got.append(t[v][0] - end_u)
    hosts = meta.hosts
    cross_host = {(u, v): hosts is not None and hosts[rank_of[u]] != hosts[rank_of[v]] for u, v in edges}
    pooled = [x for xs in samples.values() for x in xs]
    link = max(0.0, float(statistics.median(pooled))) if pooled else 0.0
    links = {}  # the link value of each kind of edge (within a host, across hosts), where it has samples
    for kind in (False, True):
        mine = [x for e, xs in samples.items() if cross_host[e] == kind for x in xs]
        links[kind] = max(0.0, float(statistics.median(mine))) if mine else link
    return {
        e: max(0.0, float(statistics.median(samples[e]))) if samples.get(e) else links[cross_host[e]] for e in edges
    }


def summarize(delays: EdgeDelays) -> dict[str, float]:
    """``{"edges", "median_ms", "max_ms"}`` of the delays (the plan's ``comm`` field)."""
    values = list(delays.values())
    return {
        "edges": len(values),
        "median_ms": round(float(statistics.median(values)), 6) if values else 0.0,
        "max_ms": round(max(values), 6) if values else 0.0,
    }


def summary_line(summary: dict[str, float]) -> str:
    """One line for the CLI, e.g. ``communication: 14 cross-rank edges, median 0.42 ms, max 1.3 ms``."""
    return (
        f"communication: {summary['edges']} cross-rank edges, median {summary['median_ms']:.3g} ms, "
        f"max {summary['max_ms']:.3g} ms"
    )
