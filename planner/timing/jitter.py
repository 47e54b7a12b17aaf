"""Why a measured batch is longer than its plan's longest path even when every action keeps its median time
(no torch).

A plan's batch time is the longest path of the actions' expected durations. In a real step every action
is a little off its median, and the step lasts as long as its longest path under *those* durations. The
longest path is a maximum over paths, so noise that averages out on each path still lengthens the maximum
(Jensen's inequality): the more paths are nearly as long as the longest, the more. A plan that evens out the
stages, which is what the LP does, makes many paths nearly critical; on the CPU test machine the stable
1F1B steps' longest paths were 0.6-3.6 % above the longest path of the same actions' medians, ZBV's
0.2-0.7 % (``docs/results/runtime/README.md``).

The rule of :func:`jitter_factors`:

* **Residual steps** come from the monitoring windows (:data:`planner.timing.comm.SAMPLE_PHASES`), replica 0, steps
  with a record of every action: an action's residual is its ``ms`` over its median in that window, divided
  by the step's own level (the median of the step's residuals), so a step that was slow as a whole (the
  machine, which the F factor follows) does not count as jitter.
* The **factor** of a set of durations ``d`` is the mean over the residual steps ``k`` of the longest path of
  ``d x residual_k`` over that of ``d`` (whole steps, so what moves together in a step keeps moving
  together; delays on edges are not scaled). Deterministic: no random draws.
* :func:`jitter_factors` gives it for a plan's three predictions: ``no_freeze`` (every ``w_max``),
  ``all_frozen`` (every ``w_min``) and ``planned`` (the plan's durations); 1.0 each without residual steps.
"""

from __future__ import annotations

import statistics

import networkx as nx

from planner.schedule.dag import EdgeDelays, longest_path
from planner.timing.comm import SAMPLE_PHASES
from planner.trace.load import Trace

__all__ = ["expected_factor", "jitter_factors", "residual_steps"]


def residual_steps(trace: Trace, phases: tuple[str, ...] = SAMPLE_PHASES) -> list[dict[str, float]]:
    """Every complete step of ``phases`` (replica 0) as ``{action: residual}`` (module docstring)."""
    actions = set(trace.meta.all_actions())
    by_phase: dict[str, dict[int, dict[str, float]]] = {phase: {} for phase in phases}
    for rec in trace.records:  # one pass for every phase
        steps = by_phase.get(rec.phase)
        if steps is not None and rec.replica == 0:
            step = steps.get(rec.step)
            if step is None:
                step = steps[rec.step] = {}
            step[rec.action] = step.get(rec.action, 0.0) + rec.ms
    out = []
    for phase in phases:
        steps = by_phase[phase]
        full = [v for v in steps.values() if set(v) == actions]
        if len(full) < 2:
            continue
        med = {a: statistics.median(v[a] for v in full) for a in actions}
        for v in full:
            rel = {a: v[a] / med[a] if med[a] > 0 else 1.0 for a in actions}
            level = statistics.median(rel.values())
            out.append({a: r / level for a, r in rel.items()} if level > 0 else rel)
    return out


def expected_factor(
    dag: nx.DiGraph, durations: dict[str, float], residuals: list[dict[str, float]], edge_ms: EdgeDelays | None = None
) -> float:
    """The mean over ``residuals`` of the longest path of ``durations x residual`` over that of
    ``durations``; 1.0 without residuals or for an empty batch."""
    if not residuals:  # (without residuals no longest path is needed)
        return 1.0
    base = longest_path(dag, durations, edge_ms)[0]
    if base <= 0:
        return 1.0
    paths = [longest_path(dag, {a: d * r.get(a, 1.0) for a, d in durations.items()}, edge_ms)[0] for r in residuals]
    return statistics.fmean(paths) / base


def jitter_factors(trace: Trace, dag: nx.DiGraph, plan, edge_ms: EdgeDelays | None = None) -> dict:
    """``{"steps", "no_freeze", "all_frozen", "planned"}``: the number of residual steps and the factor of each
    of ``plan``'s (a ``planner.plan.Plan``) three predictions (module docstring)."""
    residuals = residual_steps(trace)
    acts = plan.actions
    sets = {
        "no_freeze": {a: ap.w_max for a, ap in acts.items()},
        "all_frozen": {a: ap.w_min for a, ap in acts.items()},
        "planned": {a: ap.duration for a, ap in acts.items()},
    }
    return {"steps": len(residuals)} | {k: expected_factor(dag, d, residuals, edge_ms) for k, d in sets.items()}
