"""What the plan's life hands the runtime: a :class:`PlanUpdate` to freeze by or a :class:`PlanFailure`
(together a :data:`PlanChange`), a step's :class:`DriftReport`, and the run's :class:`PlanRecord`.

These types are the whole boundary between the plan's life (``timelyfreeze.plan.coordinator``) and the
rest of the runtime: the coordinator returns a change when the plan changes, and the runtime hands it to
the method with :meth:`apply_to`; a step's drift check comes back as a report whose fields the runtime puts
in the step's metrics row; the end of the run reads the plan's record. All are plain data, identical on
every rank (rank 0 solves, the job broadcasts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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


PlanChange = PlanUpdate | PlanFailure | None
"""What a call that can change the plan returns: the new plan, a failure, or None (nothing changed)."""


@dataclass(frozen=True)
class DriftReport:
    """One step's drift check (``PlanCoordinator.check_drift``): what the step's metrics row records about
    the plan in force, and the plan change it caused."""

    watched: bool = False
    """The step's drift was checked (a stable step under a plan that re-planning watches)."""
    drift: float | None = None
    """How much the plan in force would stretch the batch under the step's scales (``Replanner.observe``)."""
    machine_factor: float | None = None
    """The job's median F/I scale of the step (``planner.timing.drift.machine_factor``), where it has one."""
    rank_factors: dict[str, float] | None = None
    """Per pipeline rank (as a string), the median of its F/I groups' scales, where any."""
    replan: dict[str, Any] | None = None
    """The re-plan that took effect after this step (its logged event)."""
    rescale: dict[str, Any] | None = None
    """The rescaled prediction, or the re-plan not taken, after this step (its logged event)."""
    replans: int | None = None
    """Re-plans taken so far in the run; None where re-planning watches no plan."""
    change: PlanChange = None
    """The new plan, or a failed re-plan, for the method; None where the plan stays."""

    def row_fields(self) -> dict[str, Any]:
        """The fields of the step's metrics row this check gives (only those it measured)."""
        out: dict[str, Any] = {"drift": self.drift} if self.watched else {}
        if self.machine_factor is not None:
            out["machine_factor"] = self.machine_factor
        if self.rank_factors:
            out["rank_factors"] = self.rank_factors
        for name in ("replan", "rescale", "replans"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


@dataclass(frozen=True)
class PlanRecord:
    """The plan's life over the run, for the summary (``PlanCoordinator.record_of_run``)."""

    predicted_batch_ms: dict[str, float] | None
    """The first plan's predicted batch times (``no_freeze``, ``all_frozen``, ``planned``), if any."""
    failures: list[str]
    """Problems the run survived (no plan, a failed re-plan)."""
    replans: list[dict[str, Any]]
    """The re-plans that took effect, as logged."""
    rescales: list[dict[str, Any]]
    """The rescaled predictions and the re-plans not taken, as logged."""
    monitoring: dict | None
    """The monitoring windows' F factors against the reference, the tolerance and the warnings."""
