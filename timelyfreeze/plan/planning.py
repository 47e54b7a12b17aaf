"""One plan solve of the runtime: measurements of every rank in, one :class:`PlanUpdate` out.

``solve`` runs on global rank 0 (``timelyfreeze.plan.coordinator`` gathers the records there and
broadcasts the result) with every rank's monitoring records (trace records of the upper- and
lower-bound phases): it builds the trace the offline planner would load, solves the LP, writes
``plan.json`` atomically and returns the :class:`PlanUpdate`. It never raises: the LP must not take training
down, so a failure comes back as a :class:`PlanFailure` and the run reports it. ``replan`` solves again
from rescaled node weights (online re-planning, ``timelyfreeze.plan.replan``). ``load_given`` reads a
plan file given with ``[freeze] plan``.
"""

from __future__ import annotations

from pathlib import Path

from planner.errors import PlannerError
from planner.plan import Plan as FreezePlan
from planner.plan import check_plan_matches, load_plan, make_plan, plan_from_trace, plan_summary, write_plan
from planner.schedule.dag import build_dag
from planner.timing.comm import estimate_edge_delays
from planner.timing.gaps import with_gap_costs
from planner.timing.jitter import jitter_factors
from planner.trace.load import NodeWeights, trace_from_records, validate_meta
from timelyfreeze.job.errors import FreezeConfigError
from timelyfreeze.plan.outcome import PlanFailure, PlanUpdate
from timelyfreeze.plan.settings import PlanSettings


def solve(
    meta: dict, records_by_rank: dict[int, list[dict]], settings: PlanSettings, trace_dir: Path, plan_path: Path
) -> PlanUpdate | PlanFailure:
    """The plan of ``settings.r_max`` from every rank's monitoring records, written to ``plan_path``.
    The node weights come from ``planner.timing.estimate.estimate_weights(trace, settings.estimator)``, as
    ``python -m planner plan --estimator`` makes them, after the lower-bound window is brought to the
    upper-bound window's machine speed where ``settings.anchor``; the plan records both. ``settings.gaps``:
    also the fixed costs between a rank's consecutive actions (``planner.timing.gaps``); the delays handed
    on for re-plans (``PlanUpdate.edge_ms``) then include them. ``settings.jitter``: the plan also records, and
    the result carries, the factors by which the monitoring windows' jitter lengthens each prediction
    (``planner.timing.jitter``; plan field ``jitter``). ``settings.cliff``: ``planner.timing.cliff`` (plan field
    ``cliff``). ``planner.defaults`` holds the defaults, shared with ``python -m planner plan``."""
    try:
        trace = trace_from_records(meta, records_by_rank, source=str(trace_dir))
        dag = build_dag(trace.meta)
        edge_ms = estimate_edge_delays(trace, dag)
        plan = plan_from_trace(
            trace,
            settings.r_max,
            solver=settings.solver,
            estimator=settings.estimator,
            edge_ms=edge_ms,
            dag=dag,
            gaps=settings.gaps,
            anchor=settings.anchor,
            cliff=settings.cliff,
        )
        if settings.gaps:
            edge_ms = with_gap_costs(trace, dag, edge_ms)[0]  # what the plan was made with (re-plans keep it)
        if settings.jitter:
            plan.extra["jitter"] = jitter_factors(trace, dag, plan, edge_ms)
        write_plan(plan, plan_path)
        return _as_plan(
            plan,
            edge_ms,
            monitoring=plan.extra["monitoring"],
            jitter=plan.extra.get("jitter"),
            summary=plan_summary(plan, trace.meta),
        )
    except Exception as e:
        return PlanFailure(f"planning failed: {one_line(e)}")


def replan(
    meta: dict,
    weights: NodeWeights,
    settings: PlanSettings,
    plan_path: Path,
    extra: dict,
    edge_ms: dict | None = None,
) -> PlanUpdate | PlanFailure:
    """Like ``solve``, from given node weights and delays on the DAG's edges (``planner.timing.comm``);
    ``extra`` goes into the plan file's top level (step, reason, scales). Never raises; a failure keeps
    the plan in force."""
    try:
        plan = make_plan(
            validate_meta(meta, "meta.json"), weights, settings.r_max, solver=settings.solver, edge_ms=edge_ms
        )
        plan.extra.update(extra)
        Path(plan_path).parent.mkdir(parents=True, exist_ok=True)
        write_plan(plan, plan_path)
        return _as_plan(plan, edge_ms)
    except Exception as e:
        return PlanFailure(f"re-planning failed: {one_line(e)}", keeps_plan=True)


def load_given(path: str, schedule: str, num_stages: int, num_microbatches: int) -> PlanUpdate:
    """The plan file ``path`` (``[freeze] plan``); ``FreezeConfigError`` naming the file if it cannot be
    read or does not match this run."""
    try:
        plan = load_plan(path)
        check_plan_matches(plan, schedule, num_stages, num_microbatches, path)
    except PlannerError as e:
        raise FreezeConfigError(f"[freeze] plan: {e}") from None
    return _as_plan(plan)


def _as_plan(plan: FreezePlan, edge_ms: dict | None = None, **extra) -> PlanUpdate:
    """What every rank needs of a planner plan: per-action freeze ratios, predicted batch times, node
    weights, and the delays on the DAG's edges it was made with."""
    return PlanUpdate(
        freeze_ratios={a: ap.freeze_ratio for a, ap in plan.actions.items()},
        batch_time_ms=dict(plan.batch_time_ms),
        weights={a: [ap.w_min, ap.w_max] for a, ap in plan.actions.items()},
        edge_ms=[[u, v, ms] for (u, v), ms in (edge_ms or {}).items()],
        **extra,
    )


def one_line(e: Exception) -> str:
    """A planner error's own one-line message; other exceptions with their type."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return msg if isinstance(e, PlannerError) else f"{type(e).__name__}: {msg}"
