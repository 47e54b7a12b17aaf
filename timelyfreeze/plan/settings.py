"""How a run plans and re-plans: the ``[freeze]`` settings the plan's life reads, taken once.

:class:`PlanSettings` is built from the checked ``[freeze]`` section when the run starts
(:meth:`PlanSettings.from_config`); the coordinator, the solves and the re-planner read this object and
nothing else of the configuration.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.defaults import CLIFF
from planner.errors import PlannerError
from planner.lp.budget import check_r_max
from timelyfreeze.config.freeze import PLANNED_METHODS, Freeze
from timelyfreeze.job.errors import FreezeConfigError


@dataclass(frozen=True)
class PlanSettings:
    r_max: float | tuple[float, ...]
    """``[freeze] r_max``, or the per-stage tuple of ``r_max_per_stage``, as the planner takes it."""
    solver: str
    """LP solver (``planner.lp.solve.SOLVERS``)."""
    estimator: str
    """Node-weight estimator (``planner.timing.estimate.ESTIMATORS``)."""
    gaps: bool
    """Plan with the fixed costs between a rank's consecutive actions (``planner.timing.gaps``)."""
    anchor: bool
    """Bring the lower-bound window to the upper-bound window's machine speed (``planner.timing.monitor``)."""
    jitter: bool
    """Carry the monitoring windows' jitter factors in every prediction (``planner.timing.jitter``)."""
    cliff: bool
    """Plan a stage whose all-frozen backward also drops its input-gradient work on the other stages' floor
    (``planner.timing.cliff``); the runtime takes the planner's default (``planner.defaults.CLIFF``)."""
    monitor_tolerance: float
    """A monitoring window whose F factor departs from 1 by more than this is flagged in the summary."""
    replan: bool
    """Watch the plan in force and re-plan (re-planning on, and a method that plans)."""
    replan_threshold: float
    replan_patience: int
    replan_noise_k: float
    replan_min_gain: float
    """The re-planner's rules (``timelyfreeze.plan.replan``; ``docs/config.md``)."""
    given_plan: str
    """A plan file to freeze by (``[freeze] plan``), or ``""``: plan from this run's measurements."""

    @classmethod
    def from_config(cls, cfg: Freeze, num_stages: int) -> PlanSettings:
        """The settings of a checked ``[freeze]`` section on a pipeline of ``num_stages`` stages;
        ``FreezeConfigError`` where ``r_max_per_stage`` does not fit it."""
        r_max: float | tuple[float, ...] = float(cfg.r_max)
        if cfg.r_max_per_stage:
            try:
                r_max = check_r_max(list(cfg.r_max_per_stage), num_stages, "[freeze] r_max_per_stage")
            except PlannerError as e:
                raise FreezeConfigError(str(e)) from None
        adv = cfg.advanced
        return cls(
            r_max=r_max,
            solver=adv.solver,
            estimator=adv.estimator,
            gaps=adv.gap_model,
            anchor=adv.anchor_monitoring,
            jitter=adv.jitter_model,
            cliff=CLIFF,
            monitor_tolerance=adv.monitor_tolerance,
            replan=cfg.replan and cfg.method in PLANNED_METHODS,
            replan_threshold=adv.replan_threshold,
            replan_patience=adv.replan_patience,
            replan_noise_k=adv.replan_noise_k,
            replan_min_gain=adv.replan_min_gain,
            given_plan=cfg.plan,
        )
