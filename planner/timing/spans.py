"""What happened in a step, from a trace's timestamps (``start_ms``; no torch): the pipeline span of each
step, one step's actions at their real starts (the measured panels of a timeline), the machine's F factor
between two phases, and the achieved share of a predicted speed-up.

* **Span** of a step: last end minus first start (``start_ms + ms``) over every record of the step on
  every pipeline rank of replica 0 (all of its accumulation batches). ``start_ms`` is each host's
  monotonic clock, so spans are computed only when every rank of replica 0 is on one host (meta field
  ``hosts``; without it one host is assumed, as ``planner.timing.comm`` does) or the trace's clock samples
  (``clock_sync``) align the hosts (``planner.trace.clocks``; good to their ``error_ms``); otherwise
  :func:`step_spans` gives ``{}``. A step with a record without ``start_ms`` (a CUDA or older trace) has no span. With
  several replicas the span is replica 0's (``meta.hosts`` names only its ranks' hosts).
* **Representative step** of a phase: the step whose span is the phase's lower median span (the earliest
  such step), so a timeline drawn from it ends at that median.
* **F factor** of a phase against a base phase: the median ``ms`` of the F (forward) records of the phase
  divided by the median of the base's. Freezing never changes a forward action, so this measures the
  machine (1.0: the same speed; 1.1: 10 % slower in the phase).
* **Per-rank F factors** and the **DAG's F factor**: each pipeline rank is its own device (a GPU; here a
  pinned CPU core), and their speeds drift apart (on the 2-core test VM by up to 12 % within a run), so one
  median over all F records, which weights ranks by their record count and ignores which rank is
  critical, can move a share by 0.3. A rank's factor is the median over its F actions of (the action's
  median ``ms`` in the phase / in the base); the DAG's factor is the longest path of a plan's durations
  with every action scaled by its rank's factor, over the longest path of the durations themselves: how
  much slower the plan's batch is on the phase's machine.
* **Share** of a predicted speed-up: ``(measured - 1) / (predicted - 1)``; with the F factor taken out the
  measured speed-up is multiplied by the stable phase's F factor against the upper bound's (the stable
  batch brought back to the upper bound's machine speed): the DAG's factor where the plan is known, else
  the pooled one.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from planner.schedule.actions import action_kind
from planner.schedule.dag import EdgeDelays, build_dag, longest_path
from planner.timing.comm import estimate_edge_delays
from planner.timing.gaps import with_gap_costs
from planner.trace.clocks import comparable
from planner.trace.load import Trace

__all__ = [
    "StepTimeline",
    "achieved_share",
    "dag_f_factor",
    "dag_scale",
    "f_factor",
    "forward_medians",
    "one_host",
    "phase_spans",
    "plan_dag",
    "plan_f_factor",
    "rank_f_factors",
    "representative_step",
    "step_spans",
    "step_timeline",
]


@dataclass
class StepTimeline:
    """One measured step of replica 0: ``boxes`` are ``(action, rank, start, ms)`` with ``start`` in ms from
    the step's first start; ``span_ms`` is the step's span (the end of its last action); ``ratios`` the
    freeze ratio each action applied (the mean over the step's accumulation batches)."""

    step: int
    phase: str
    boxes: list[tuple[str, int, float, float]]
    span_ms: float
    ratios: dict[str, float]


def one_host(trace: Trace) -> bool:
    """True when start times compare across the ranks of replica 0: one host, no ``hosts`` field, or clock
    samples that put every rank on rank 0's clock (``planner.trace.clocks.comparable``)."""
    return comparable(trace.meta)


def _timed_steps(trace: Trace) -> dict[int, list]:
    """Replica 0's records per step, for the steps whose every record has ``start_ms`` ({} across hosts)."""
    if not one_host(trace):
        return {}
    steps: dict[int, list] = {}
    untimed: set[int] = set()
    for rec in trace.records:
        if rec.replica != 0:
            continue
        if rec.start_ms is None:
            untimed.add(rec.step)
        steps.setdefault(rec.step, []).append(rec)
    return {k: v for k, v in steps.items() if k not in untimed}


def step_spans(trace: Trace) -> dict[int, float]:
    """``{step: span ms}`` of every step with timestamps (module docstring); ``{}`` across hosts."""
    return {
        k: max(r.start_ms + r.ms for r in recs) - min(r.start_ms for r in recs)
        for k, recs in sorted(_timed_steps(trace).items())
    }


def _phase_of(trace: Trace) -> dict[int, str]:
    return {rec.step: rec.phase for rec in trace.records if rec.replica == 0}


def phase_spans(trace: Trace, spans: dict[int, float] | None = None) -> dict[str, float]:
    """``{phase: median span ms}`` over the phase's steps with a span (``spans``: ``step_spans(trace)``)."""
    spans = step_spans(trace) if spans is None else spans
    phase_of = _phase_of(trace)
    by_phase: dict[str, list[float]] = {}
    for k, ms in spans.items():
        by_phase.setdefault(phase_of[k], []).append(ms)
    return {p: float(statistics.median(v)) for p, v in by_phase.items()}


def representative_step(trace: Trace, phase: str, spans: dict[int, float] | None = None) -> int | None:
    """The earliest step of ``phase`` whose span is the phase's lower median span; None without one."""
    spans = step_spans(trace) if spans is None else spans
    phase_of = _phase_of(trace)
    mine = [(k, ms) for k, ms in spans.items() if phase_of.get(k) == phase]
    if not mine:
        return None
    median = statistics.median_low(ms for _, ms in mine)
    return min(k for k, ms in mine if ms == median)


def step_timeline(trace: Trace, step: int) -> StepTimeline | None:
    """Every action of replica 0 in ``step`` at its measured start; None when the step has no timestamps."""
    recs = _timed_steps(trace).get(step)
    if not recs:
        return None
    t0 = min(r.start_ms for r in recs)
    boxes = [(r.action, r.rank, r.start_ms - t0, r.ms) for r in sorted(recs, key=lambda r: (r.rank, r.start_ms))]
    ratios: dict[str, list[float]] = {}
    for r in recs:
        ratios.setdefault(r.action, []).append(r.freeze_ratio)
    return StepTimeline(
        step,
        recs[0].phase,
        boxes,
        max(s + ms for _, _, s, ms in boxes),
        {a: statistics.fmean(v) for a, v in ratios.items()},
    )


def f_factor(trace: Trace, phase: str = "stable", base: str = "upper") -> float | None:
    """Median F-action ms of ``phase`` / that of ``base`` (module docstring); None without F records in both."""
    ms: dict[str, list[float]] = {phase: [], base: []}
    for rec in trace.records:
        if rec.phase in ms and action_kind(rec.action) == "F":
            ms[rec.phase].append(rec.ms)
    if not ms[phase] or not ms[base]:
        return None
    lo = statistics.median(ms[base])
    return float(statistics.median(ms[phase]) / lo) if lo > 0 else None


def forward_medians(trace: Trace, phase: str) -> dict[str, float]:
    """The median ``ms`` of every F action in ``phase`` (replica 0)."""
    ms: dict[str, list[float]] = {}
    for rec in trace.records:
        if rec.replica == 0 and rec.phase == phase and action_kind(rec.action) == "F":
            ms.setdefault(rec.action, []).append(rec.ms)
    return {a: statistics.median(v) for a, v in ms.items()}


def rank_f_factors(trace: Trace, phase: str = "stable", base: str = "upper") -> dict[int, float]:
    """Per pipeline rank, the median over its F actions of (the action's median ms in ``phase`` / in
    ``base``), replica 0 (module docstring); ranks without F actions in both phases are left out."""
    now, ref = forward_medians(trace, phase), forward_medians(trace, base)
    rank = {a: r for r, order in trace.meta.rank_orders.items() for a in order}
    ratios: dict[int, list[float]] = {}
    for a, ms in now.items():
        if ref.get(a, 0.0) > 0:
            ratios.setdefault(rank[a], []).append(ms / ref[a])
    return {r: statistics.median(v) for r, v in sorted(ratios.items())}


def dag_f_factor(
    trace: Trace, durations: dict[str, float], dag, edge_ms: EdgeDelays | None = None, **phases: str
) -> float | None:
    """The longest path of ``durations`` (a plan's) with every action scaled by its rank's
    :func:`rank_f_factors` (``phases``: their ``phase`` and ``base``), over that of ``durations``; None
    when a rank has no factor."""
    return dag_scale(dag, durations, rank_f_factors(trace, **phases), edge_ms)


def dag_scale(dag, durations: dict[str, float], factors: dict[int, float], edge_ms: EdgeDelays | None = None):
    """The longest path of ``durations`` with every action scaled by its rank's factor in ``factors``, over that
    of ``durations``; None when a rank has no factor."""
    rank = {a: dag.nodes[a]["rank"] for a in durations}
    if any(r not in factors for r in rank.values()):
        return None
    base = longest_path(dag, durations, edge_ms)[0]
    scaled = longest_path(dag, {a: d * factors[rank[a]] for a, d in durations.items()}, edge_ms)[0]
    return scaled / base if base > 0 else None


def plan_dag(trace: Trace, plan):
    """(the DAG, its edge delays) that ``plan`` (a ``planner.plan.Plan``) was made with: the delays estimated
    again from the trace's monitoring windows, as planning did, plus the gap costs where the plan has them."""

    dag = build_dag(trace.meta)
    edges = estimate_edge_delays(trace, dag)
    if "gaps" in plan.extra:
        edges = with_gap_costs(trace, dag, edges)[0]
    return dag, edges


def plan_f_factor(trace: Trace, plan) -> float | None:
    """:func:`dag_f_factor` of the stable phase against the upper bound over ``plan``'s durations (a
    ``planner.plan.Plan``, the monitoring plan) with the delays it was made with: estimated again from the trace's
    monitoring windows, as planning did, plus the gap costs where the plan has them (``planner.timing.gaps``).
    None when a rank has no factor; KeyError or ValueError where the plan does not fit the trace."""
    dag, edges = plan_dag(trace, plan)
    return dag_f_factor(trace, {a: ap.duration for a, ap in plan.actions.items()}, dag, edges)


def achieved_share(measured: float | None, predicted: float | None) -> float | None:
    """``(measured - 1) / (predicted - 1)`` of two speed-ups; None when either is missing or nothing
    was predicted (``predicted <= 1``)."""
    if measured is None or predicted is None or predicted <= 1:
        return None
    return (measured - 1) / (predicted - 1)
