"""What the plan's placement buys, as the planner predicts it: the plan's batch time against the batch time of
freezing the same per-stage share uniformly (every freezable action of stage ``s`` frozen by ``shares[s]``).

Both are longest paths of the same DAG with the same edge delays, and each action's time follows the plan's
linear model ``w_max - r * (w_max - w_min)``, so the difference is the placement's alone. The measured
counterpart is the placement grid (``scripts/placement_grid.toml``): TimelyFreeze against random freezing
matched to its realised per-stage shares.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.plan import Plan
from planner.schedule.actions import FREEZABLE_KINDS, parse_action
from planner.schedule.dag import EdgeDelays
from planner.schedule.meta import TraceMeta
from planner.trace.simulate import simulate_batch


def uniform_durations(plan: Plan, shares: Sequence[float]) -> dict[str, float]:
    """Every action's time when each freezable action of stage ``s`` freezes ``shares[s]`` of the stage (the
    plan's bounds, linear model); other actions keep their unfrozen time."""
    out = {}
    for name, a in plan.actions.items():
        act = parse_action(name)
        r = float(shares[act.stage]) if act.kind in FREEZABLE_KINDS else 0.0
        out[name] = a.w_max - r * (a.w_max - a.w_min)
    return out


@dataclass(frozen=True)
class PlacementPrediction:
    """Predicted batch times (ms) on one DAG: nothing frozen, the plan, and the plan's shares spread uniformly."""

    no_freeze_ms: float
    planned_ms: float
    uniform_ms: float

    @property
    def plan_speedup(self) -> float:
        return self.no_freeze_ms / self.planned_ms

    @property
    def uniform_speedup(self) -> float:
        return self.no_freeze_ms / self.uniform_ms

    @property
    def speedup_difference(self) -> float:
        """What the placement is predicted to buy: plan's speed-up minus the uniform assignment's."""
        return self.plan_speedup - self.uniform_speedup


def predict_placement(
    meta: TraceMeta, plan: Plan, shares: Sequence[float], edge_ms: EdgeDelays | None = None
) -> PlacementPrediction:
    """The three longest paths of ``meta``'s DAG: every action at ``w_max``, at the plan's durations, and at
    :func:`uniform_durations` of ``shares`` (one per global stage, e.g. the run's realised stable-phase shares,
    ``planner.trace.load.phase_stage_ratios``)."""
    if len(shares) != meta.num_stages:
        raise ValueError(f"{len(shares)} shares for {meta.num_stages} stages")
    return PlacementPrediction(
        no_freeze_ms=simulate_batch(meta, {a: p.w_max for a, p in plan.actions.items()}, edge_ms),
        planned_ms=simulate_batch(meta, {a: p.duration for a, p in plan.actions.items()}, edge_ms),
        uniform_ms=simulate_batch(meta, uniform_durations(plan, shares), edge_ms),
    )
