"""Where a measured batch's time goes, from a trace's timestamps (``start_ms``; no torch).

For one batch (a step, or one accumulation batch of it) of replica 0:

* ``span``: last end minus first start over every rank (``planner.timing.spans``).
* ``dag_ms``: the DAG's longest path over the batch's *measured* action times with the given edge delays
  (the cross-rank delays of ``planner.timing.comm``, and the rank-order gaps of ``planner.timing.gaps`` when given):
  what the model would predict if it knew every action's time.  ``residual = span - dag_ms`` is what the
  model misses between the actions.
* The *critical rank* is the rank of the action that ends last.  ``action_ms`` is the sum of its actions'
  times and ``dag_idle = dag_ms - action_ms`` the idle the DAG implies on it (>= 0: a rank's actions are a
  chain of the DAG).  So ``span = action_ms + dag_idle + residual``.
* Per rank, what lies between its actions, which adds up to ``span = offset + actions + free + wait``
  on that rank (``RankSplit``): ``offset`` the start of its first action after the batch's first start,
  ``free`` the gaps before an action whose cross-rank inputs were due by the previous action's end
  (``planner.timing.gaps``: runtime work the DAG does not see), ``wait`` the other gaps, themselves split into
  ``wait_due`` (until the input was due: the DAG's waiting, given the other rank's measured times) and
  ``wait_late`` (the start after that).

:func:`gap_table` pools the gaps of many traces by schedule and class for the table of
``docs/results/runtime/gap_model.md``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import networkx as nx

from planner.schedule.dag import EdgeDelays, build_dag, longest_path
from planner.timing.comm import cross_rank_edges, estimate_edge_delays
from planner.timing.gaps import GapSample, batches, gap_samples, rank_neighbours
from planner.timing.spans import one_host
from planner.trace.load import Trace

__all__ = ["BatchSplit", "RankSplit", "decompose_batch", "decompose_trace", "gap_table"]


@dataclass
class RankSplit:
    """One rank's span in one batch: ``offset + action_ms + free_ms + wait_due_ms + wait_late_ms``."""

    offset_ms: float = 0.0
    offset_late_ms: float = 0.0
    """The part of ``offset_ms`` after the first action's cross-rank inputs were due (0 without any)."""
    action_ms: float = 0.0
    free_ms: float = 0.0
    wait_due_ms: float = 0.0
    wait_late_ms: float = 0.0
    end_ms: float = 0.0


@dataclass
class BatchSplit:
    """The decomposition of one batch (module docstring); times in ms."""

    span_ms: float
    dag_ms: float
    critical_rank: int
    action_ms: float
    dag_idle_ms: float
    residual_ms: float
    ranks: dict[int, RankSplit] = field(default_factory=dict)
    gaps: list[GapSample] = field(default_factory=list)


def decompose_batch(
    trace: Trace,
    recs: dict,
    *,
    dag: nx.DiGraph | None = None,
    cross: EdgeDelays | None = None,
    edge_ms: EdgeDelays | None = None,
) -> BatchSplit:
    """Decompose one batch: ``recs`` maps every action to its record (with ``start_ms``).  ``cross``: the
    cross-rank delays that split free from waiting gaps; ``edge_ms``: the delays of the DAG replay
    (default ``cross``)."""
    meta = trace.meta
    if dag is None:
        dag = build_dag(meta)
    cross = dict(cross or {})
    edge_ms = cross if edge_ms is None else edge_ms
    end = {a: r.start_ms + r.ms for a, r in recs.items()}
    t0 = min(r.start_ms for r in recs.values())
    span = max(end.values()) - t0
    dag_ms = longest_path(dag, {a: r.ms for a, r in recs.items()}, edge_ms)[0]
    last = max(end, key=end.__getitem__)
    crit = recs[last].rank
    prev = rank_neighbours(meta)
    ranks: dict[int, RankSplit] = {}
    xpred: dict[str, list[str]] = {}
    for u, v in cross_rank_edges(dag):
        xpred.setdefault(v, []).append(u)
    for r, order in meta.rank_orders.items():
        rs = ranks[r] = RankSplit(end_ms=end[order[-1]] - t0)
        first = recs[order[0]]
        rs.offset_ms = first.start_ms - t0
        due = max((end[u] + cross.get((u, order[0]), 0.0) for u in xpred.get(order[0], [])), default=t0)
        rs.offset_late_ms = max(0.0, first.start_ms - max(due, t0))
        for a in order:
            rec = recs[a]
            rs.action_ms += rec.ms
            p = prev[a]
            if p is None:
                continue
            gap = rec.start_ms - end[p]
            ready = max((end[u] + cross.get((u, a), 0.0) for u in xpred.get(a, [])), default=-float("inf"))
            if ready <= end[p]:
                rs.free_ms += gap
            else:
                due = min(ready - end[p], gap)
                rs.wait_due_ms += due
                rs.wait_late_ms += gap - due
    action_ms = ranks[crit].action_ms
    mini = Trace(meta, list(recs.values()), trace.source)
    gaps = gap_samples(mini, phases=None, dag=dag, cross=cross)
    return BatchSplit(span, dag_ms, crit, action_ms, dag_ms - action_ms, span - dag_ms, ranks, gaps)


def decompose_trace(
    trace: Trace,
    *,
    phases: tuple[str, ...] | None = None,
    dag: nx.DiGraph | None = None,
    cross: EdgeDelays | None = None,
    edge_ms: EdgeDelays | None = None,
) -> list[tuple[int, str, BatchSplit]]:
    """``(step, phase, split)`` of every batch of ``phases`` (None: all) that has a timed record of every
    action (:func:`decompose_batch`; ``cross`` defaults to the trace's cross-rank delays); ``[]`` when the
    ranks of replica 0 are on several hosts (``planner.timing.spans.one_host``)."""
    if not one_host(trace):
        return []
    if dag is None:
        dag = build_dag(trace.meta)
    if cross is None:
        cross = estimate_edge_delays(trace, dag)
    n = len(trace.meta.all_actions())
    return [
        (step, next(iter(recs.values())).phase, decompose_batch(trace, recs, dag=dag, cross=cross, edge_ms=edge_ms))
        for (step, _), recs in sorted(batches(trace, phases).items())
        if len(recs) == n
    ]


def _q(xs: list[float], f: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(f * len(s)))]


def gap_table(rows: list[tuple[str, str, GapSample]]) -> list[dict]:
    """Pool ``(schedule, job, sample)`` rows by ``(schedule, phase, class, free)``: per group the samples'
    count, median, mean, quartiles, and the share of samples over 2 ms; sorted by schedule, phase, class."""
    groups: dict[tuple, list[float]] = {}
    jobs: dict[tuple, set[str]] = {}
    for schedule, job, s in rows:
        key = (schedule, s.phase, s.rank, s.cls[1] + "->" + s.cls[2], "free" if s.free else "wait")
        groups.setdefault(key, []).append(s.gap_ms)
        jobs.setdefault(key, set()).add(job)
    out = []
    for key in sorted(groups):
        xs = groups[key]
        out.append(
            {
                "schedule": key[0],
                "phase": key[1],
                "rank": key[2],
                "transition": key[3],
                "input": key[4],
                "runs": len(jobs[key]),
                "n": len(xs),
                "median_ms": statistics.median(xs),
                "mean_ms": statistics.fmean(xs),
                "q25_ms": _q(xs, 0.25),
                "q75_ms": _q(xs, 0.75),
                "over_2ms": sum(x > 2.0 for x in xs) / len(xs),
            }
        )
    return out
