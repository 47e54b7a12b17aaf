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

import operator
import statistics

import networkx as nx
import numpy as np

from planner.schedule.dag import EdgeDelays, longest_path
from planner.timing.comm import SAMPLE_PHASES
from planner.trace.columns import columns, group_ids
from planner.trace.load import Trace

__all__ = ["expected_factor", "jitter_factors", "residual_steps"]


def residual_steps(trace: Trace, phases: tuple[str, ...] = SAMPLE_PHASES) -> list[dict[str, float]]:
    """Every complete step of ``phases`` (replica 0) as ``{action: residual}`` (module docstring), over the
    trace's columns (:mod:`planner.trace.columns`): an action with several records in a step counts their sum."""
    c = columns(trace)
    n_actions = len(c.names)
    out = []
    for phase in phases:
        code = c.phase_code(phase)
        rows = np.flatnonzero((c.phase == code) & (c.replica == 0)) if code >= 0 else np.zeros(0, dtype=np.int64)
        if not len(rows):
            continue
        step, action = c.step[rows], c.action[rows]
        cell, first = group_ids(step, action)  # (step, action): the sum of its records, in record order
        total = np.bincount(cell, weights=c.ms[rows], minlength=len(first))
        steps, seen = np.unique(step[first], return_counts=True)
        _, ran = np.unique(step, return_index=True)  # each step's first record (the same sorted steps)
        complete = seen == n_actions  # a step with a record of every action
        if complete.sum() < 2:
            continue
        full = steps[complete][np.argsort(ran[complete])]  # in the order they ran
        table = np.empty((len(full), n_actions))
        for i, k in enumerate(full):
            at = step[first] == k
            table[i, action[first][at]] = total[at]
        med = _column_medians(table)
        rel = np.where(med > 0, table / np.where(med > 0, med, 1.0), 1.0)
        level = _column_medians(rel.T)
        for row, lv in zip(rel, level.tolist()):
            out.append(dict(zip(c.names, (row / lv if lv > 0 else row).tolist())))
    return out


def _column_medians(table: np.ndarray) -> np.ndarray:
    """Each column's median as ``statistics.median`` computes it (the middle value, or the mean of the two)."""
    v = np.sort(table, axis=0)
    n = v.shape[0]
    return v[(n - 1) // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


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
    out: dict = {"steps": len(residuals)}
    acts = plan.actions
    for key, field in (("no_freeze", "w_max"), ("all_frozen", "w_min"), ("planned", "duration")):
        # (expected_factor is 1.0 without residuals, before it reads a duration: then the map is not made)
        durations = dict(zip(acts, map(operator.attrgetter(field), acts.values()))) if residuals else {}
        out[key] = expected_factor(dag, durations, residuals, edge_ms)
    return out
