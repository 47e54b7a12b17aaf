"""Fixed costs between consecutive actions of a rank, measured in a trace and put on the DAG's rank-order edges
(no torch).

An action's ``ms`` is the hooked compute call only.  Between two consecutive actions of one rank the runtime
also runs Python: the schedule loop, posting and waiting on sends and receives, the stage's input and output
handling, hooks.  When the next action's cross-rank input was already there, that time is a *gap* the
DAG does not see: its longest path lets the next action start at the previous one's end.  On the CPU test
machine these gaps are 0.05-1 ms each, with occasional 3-6 ms ones (a transfer that needs the other rank's
progress thread while that rank computes), and a rank runs 16-48 actions per batch, so they add up to
several % of the batch (``docs/results/runtime/gap_model.md``).

The rule of :func:`fit_gap_model`:

* Samples come from the records of phases ``upper`` and ``lower`` of replica 0 with ``start_ms`` (the
  monitoring windows the plan is made from, :data:`planner.timing.comm.SAMPLE_PHASES`), batch by batch as in
  :mod:`planner.timing.comm`.  An action with a cross-rank input from another host (meta ``hosts``) gives no
  sample, unless the trace's clock samples (``clock_sync``) put every rank on rank 0's clock
  (``planner.trace.clocks``).  The costs apply to every replica.
* For every pair ``p -> v`` of consecutive actions of a rank (``meta.rank_orders``) and every batch with
  records of both: the gap is ``start_v - end_p``.  It is *free* (a sample) only when ``v`` did not wait
  for a cross-rank input: every cross-rank predecessor ``u`` of ``v`` had ``end_u + delay(u, v) <= end_p``
  (``delay``: the cross-rank delays of :func:`planner.timing.comm.estimate_edge_delays`).  Otherwise the gap is
  waiting that the DAG already models, and the sample is discarded.
* Samples are grouped by *class* ``(rank, kind of p, kind of v)``: the same transition on the same rank
  runs the same code, whatever the microbatch.  A class's cost is the **mean** of its samples clamped at
  ``>= 0`` (the batch time adds up gaps along a path, so the mean is what adds up; a median would drop the
  occasional long ones, which are a stable share of the samples).  A class without samples gets 0.
* Every rank-order edge ``p -> v`` gets its class's cost as an edge delay (:data:`planner.schedule.dag.EdgeDelays`),
  next to the cross-rank delays: ``start(v) >= end(p) + gap``.  Constants on edges keep the LP linear.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import networkx as nx

from planner.schedule.actions import action_kind
from planner.schedule.dag import EdgeDelays, build_dag
from planner.timing.comm import SAMPLE_PHASES, cross_rank_edges, estimate_edge_delays, summarize
from planner.trace.clocks import same_clock
from planner.trace.load import Trace

__all__ = [
    "GapModel",
    "GapSample",
    "batches",
    "class_name",
    "delay_fields",
    "fit_gap_model",
    "gap_line",
    "gap_samples",
    "merge_delays",
    "rank_neighbours",
    "split_delays",
    "with_gap_costs",
]

GapClass = tuple[int, str, str]
"""``(rank, kind of the previous action, kind of the next one)``."""


@dataclass(frozen=True)
class GapSample:
    """One gap between consecutive actions ``prev -> action`` of ``rank`` in one batch of ``step``;
    ``free``: the action's cross-rank inputs were due by ``prev``'s end (module docstring)."""

    step: int
    phase: str
    rank: int
    prev: str
    action: str
    gap_ms: float
    free: bool

    @property
    def cls(self) -> GapClass:
        return (self.rank, action_kind(self.prev), action_kind(self.action))


@dataclass
class GapModel:
    """A fitted cost (ms) per gap class, the samples behind each, and the phases they came from."""

    costs: dict[GapClass, float]
    counts: dict[GapClass, int]
    phases: tuple[str, ...] = SAMPLE_PHASES
    stat: str = "mean"
    cross: EdgeDelays = field(default_factory=dict)
    """The cross-rank delays the free/wait split used."""

    def edge_delays(self, dag: nx.DiGraph) -> EdgeDelays:
        """The delay of every rank-order edge of ``dag`` (``build_dag``) whose class has a cost > 0."""
        meta = dag.meta
        out: EdgeDelays = {}
        if not any(x > 0 for x in self.costs.values()):
            return out  # (no class costs anything: no edge to look at)
        for r, order in meta.rank_orders.items():
            for p, v in zip(order[:-1], order[1:]):
                x = self.costs.get((r, action_kind(p), action_kind(v)), 0.0)
                if x > 0:
                    out[p, v] = x
        return out

    def summary(self) -> dict:
        """What the plan's ``gaps`` field adds about the fit: its phases and statistic, and per class its cost
        and sample count."""
        return {
            "phases": list(self.phases),
            "stat": self.stat,
            "classes": {
                class_name(c): {"ms": round(self.costs[c], 6), "samples": self.counts.get(c, 0)}
                for c in sorted(self.costs)
            },
        }


def class_name(c: GapClass) -> str:
    """``"r0 F->B"`` for ``(0, "F", "B")``."""
    return f"r{c[0]} {c[1]}->{c[2]}"


def rank_neighbours(meta) -> dict[str, str | None]:
    """The previous action of every action on its rank (``None`` for a rank's first)."""
    return {a: (order[i - 1] if i else None) for order in meta.rank_orders.values() for i, a in enumerate(order)}


def batches(trace: Trace, phases: tuple[str, ...] | None) -> dict[tuple[int, int], dict]:
    """``(step, k) -> action -> record`` of replica 0's records with ``start_ms`` (``phases``: None = all)."""
    seen: dict[tuple[int, str], int] = {}
    out: dict[tuple[int, int], dict] = {}
    for rec in trace.records:
        if rec.replica != 0 or (phases is not None and rec.phase not in phases):
            continue
        k = seen.get((rec.step, rec.action), 0)
        seen[rec.step, rec.action] = k + 1
        if rec.start_ms is not None:
            out.setdefault((rec.step, k), {})[rec.action] = rec
    return out


def gap_samples(
    trace: Trace,
    *,
    phases: tuple[str, ...] | None = SAMPLE_PHASES,
    dag: nx.DiGraph | None = None,
    cross: EdgeDelays | None = None,
) -> list[GapSample]:
    """Every gap between consecutive actions of a rank in the batches of ``phases`` (None: every phase),
    free or not (module docstring); ``cross``: the cross-rank delays (default: estimated from the trace)."""
    if not trace.has_start_times():
        return []  # (a gap needs two start times)
    meta = trace.meta
    if dag is None:
        dag = build_dag(meta)
    if cross is None:
        cross = estimate_edge_delays(trace, dag)
    prev = rank_neighbours(meta)
    xpred: dict[str, list[str]] = {}
    edges = cross_rank_edges(dag)
    for u, v in edges:
        xpred.setdefault(v, []).append(u)
    rank_of = {a: r for r, order in meta.rank_orders.items() for a in order}
    # start times compare within a host, or across hosts through the trace's clock samples (planner.trace.clocks):
    # an action with an input on another clock gives no sample
    xpred = {v: us for v, us in xpred.items() if all(same_clock(meta, rank_of[u], rank_of[v]) for u in us)}
    unknown = {v for u, v in edges if v not in xpred}
    out: list[GapSample] = []
    for (step, _), recs in sorted(batches(trace, phases).items()):
        end = {a: rec.start_ms + rec.ms for a, rec in recs.items()}
        for a, rec in recs.items():
            p = prev[a]
            if p is None or p not in recs or a in unknown:
                continue
            us = xpred.get(a, [])
            if any(u not in recs for u in us):
                continue
            ready = max((end[u] + cross.get((u, a), 0.0) for u in us), default=-float("inf"))
            out.append(GapSample(step, rec.phase, rank_of[a], p, a, rec.start_ms - end[p], ready <= end[p]))
    return out


def fit_gap_model(
    trace: Trace,
    *,
    dag: nx.DiGraph | None = None,
    cross: EdgeDelays | None = None,
    phases: tuple[str, ...] = SAMPLE_PHASES,
    stat: str = "mean",
) -> GapModel:
    """The cost of every gap class from the free gaps of ``phases`` (module docstring); ``stat``: ``mean``
    (the default) or ``median``.  A trace without ``start_ms`` gives a model without costs."""
    if stat not in ("mean", "median"):
        raise ValueError(f"stat must be 'mean' or 'median', got {stat!r}")
    if dag is None:
        dag = build_dag(trace.meta)
    if cross is None:
        cross = estimate_edge_delays(trace, dag)
    by_cls: dict[GapClass, list[float]] = {}
    for s in gap_samples(trace, phases=phases, dag=dag, cross=cross):
        if s.free:
            by_cls.setdefault(s.cls, []).append(s.gap_ms)
    reduce = statistics.fmean if stat == "mean" else statistics.median
    costs = {c: max(0.0, float(reduce(xs))) for c, xs in by_cls.items()}
    return GapModel(costs, {c: len(xs) for c, xs in by_cls.items()}, tuple(phases), stat, dict(cross))


def merge_delays(*delays: EdgeDelays | None) -> EdgeDelays:
    """One delay per edge from several dicts of delays: their sum where an edge is in several."""
    out: EdgeDelays = {}
    for d in delays:
        for e, x in (d or {}).items():
            out[e] = out.get(e, 0.0) + x
    return out


def split_delays(dag: nx.DiGraph, delays: EdgeDelays) -> tuple[EdgeDelays, EdgeDelays]:
    """``(cross-rank, same-rank)`` parts of ``delays`` on ``dag``: communication, and gaps."""
    rank = dag.nodes
    cross: EdgeDelays = {}
    same: EdgeDelays = {}
    for (u, v), x in delays.items():
        (same if rank[u]["rank"] == rank[v]["rank"] else cross)[u, v] = x
    return cross, same


def delay_fields(dag: nx.DiGraph, delays: EdgeDelays) -> dict:
    """A plan's summary of the delays it was made with: ``comm`` (cross-rank edges) and ``gaps`` (same-rank
    edges), each ``planner.timing.comm.summarize``, present only when that part has delays."""
    cross, same = split_delays(dag, delays)
    return {name: summarize(d) for name, d in (("comm", cross), ("gaps", same)) if d}


def with_gap_costs(trace: Trace, dag: nx.DiGraph, cross: EdgeDelays) -> tuple[EdgeDelays, GapModel]:
    """The delays to plan with: ``cross`` plus the rank-order gaps of :func:`fit_gap_model` (fitted on the
    monitoring windows, split free/waiting by ``cross``); and the model."""
    model = fit_gap_model(trace, dag=dag, cross=cross)
    return merge_delays(cross, model.edge_delays(dag)), model


def gap_line(summary: dict) -> str:
    """One line for the CLI, e.g. ``gaps between actions: 29 rank-order edges, median 0.42 ms, max 3.1 ms``."""
    return (
        f"gaps between actions: {summary['edges']} rank-order edges, median {summary.get('median_ms', 0.0):.3g} ms, "
        f"max {summary.get('max_ms', 0.0):.3g} ms"
    )
