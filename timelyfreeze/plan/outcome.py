"""What a plan solve hands the runtime: a :class:`PlanUpdate` to freeze by, or a :class:`PlanFailure`.

These two types are the whole boundary between the plan's life (``timelyfreeze.plan.coordinator``) and
the rest of the runtime: the coordinator returns one when something changes, and the runtime hands it
to the method with :meth:`apply_to`. Both are plain data, identical on every rank (rank 0 solves, the
job broadcasts).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from timelyfreeze.methods.base import FreezeMethod


@dataclass(frozen=True)
class PlanUpdate:
    freeze_ratios: dict[str, float]
    """Per backward action (``"1B3"``), the share of its stage's parameters it leaves out (``plan.json``'s
    ``freeze_ratio``)."""
    batch_time_ms: dict[str, float]
    """The LP's predicted batch times: ``no_freeze``, ``all_frozen``, ``planned``."""
    weights: dict[str, list[float]]
    """Per action, ``[w_min, w_max]`` in ms: the node weights the plan was made from."""
    edge_ms: list[list] = field(default_factory=list)
    """The delays on the DAG's edges it was made with, ``[u, v, ms]`` triples (re-plans keep them)."""
    monitoring: dict | None = None
    """The monitoring windows' machine factors and noise floors (``planner.timing.monitor``), for a plan
    made from this run's windows."""
    jitter: dict | None = None
    """The factors by which the windows' jitter lengthens each prediction (``planner.timing.jitter``)."""
    summary: str = ""
    """The plan's printed summary (``planner.plan.plan_summary``)."""

    def apply_to(self, method: FreezeMethod) -> None:
        """The method freezes by this plan from the next step on."""
        method.set_plan(self.freeze_ratios)


@dataclass(frozen=True)
class PlanFailure:
    message: str
    """One line: ``planning failed: ...`` or ``re-planning failed: ...``."""
    keeps_plan: bool = False
    """True for a failed re-plan (the plan in force stays); False for a failed first plan (the run trains
    on without freezing)."""

    def apply_to(self, method: FreezeMethod) -> None:
        """Without a plan the method stops waiting for one; a failed re-plan changes nothing."""
        if not self.keeps_plan:
            method.set_plan(None, self.message)
