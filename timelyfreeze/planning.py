"""One plan solve of the runtime: measurements of every rank in, one plan out.

``solve`` runs on global rank 0 (``timelyfreeze.plan_coordinator`` gathers the records there and
broadcasts the result) with every rank's monitoring records (trace records of the upper- and
lower-bound phases): it builds the trace the offline planner would load, solves the LP, writes
``plan.json`` atomically and returns what every rank needs. It never raises: the LP must not take
training down, so a failure comes back as ``{"failure": "planning failed: ..."}`` and the run reports it.
``replan`` solves again from rescaled node weights (online re-planning, ``timelyfreeze.replan``).
``load_given`` reads a plan file given with ``[freeze] plan`` (the coordinator installs it).
"""

from __future__ import annotations

from pathlib import Path

from planner.defaults import ANCHOR, CLIFF, DEFAULT_ESTIMATOR, GAPS, JITTER
from planner.errors import PlannerError
from timelyfreeze.errors import FreezeConfigError


def solve(
    meta: dict,
    records_by_rank: dict[int, list[dict]],
    r_max: float,
    solver: str,
    trace_dir: Path,
    plan_path: Path,
    estimator: str = DEFAULT_ESTIMATOR,
    gaps: bool = GAPS,
    anchor: bool = ANCHOR,
    jitter: bool = JITTER,
    cliff: bool = CLIFF,
) -> dict:
    """``{"ratios", "batch_time_ms", "weights", "edge_ms", "monitoring", "summary"}`` of the plan
    (``weights``: action -> [w_min, w_max] ms; ``monitoring``: the windows' machine factors and noise
    floors, ``planner.monitor``), or ``{"failure": message}``. The node weights come from
    ``planner.estimate.estimate_weights(trace, estimator)`` (``[freeze] estimator``), as ``python -m planner
    plan --estimator`` makes them, after the lower-bound window is brought to the upper-bound window's
    machine speed where ``anchor`` (``[freeze] anchor_monitoring``); the plan records both.  ``gaps``
    (``[freeze] gap_model``): also the fixed costs between a rank's consecutive actions
    (``planner.gap_model``, as ``python -m planner plan --gaps``); the delays handed on for re-plans
    (``edge_ms``) then include them. ``jitter`` (``[freeze] jitter_model``): the plan also records, and the
    result carries, the factors by which the monitoring windows' jitter lengthens each prediction
    (``planner.jitter``; plan field ``jitter``). ``cliff``: ``planner.cliff`` (plan field ``cliff``). The defaults
    are ``planner.defaults``, as ``python -m planner plan``'s."""
    try:
        from planner.comm import estimate_edge_delays
        from planner.dag import build_dag
        from planner.gap_model import with_gap_costs
        from planner.plan import plan_from_trace, plan_summary, write_plan
        from planner.trace import trace_from_records

        trace = trace_from_records(meta, records_by_rank, source=str(trace_dir))
        dag = build_dag(trace.meta)
        edge_ms = estimate_edge_delays(trace, dag)
        plan = plan_from_trace(
            trace,
            r_max,
            solver=solver,
            estimator=estimator,
            edge_ms=edge_ms,
            dag=dag,
            gaps=gaps,
            anchor=anchor,
            cliff=cliff,
        )
        if gaps:
            edge_ms = with_gap_costs(trace, dag, edge_ms)[0]  # what the plan was made with (re-plans keep it)
        if jitter:
            from planner.jitter import jitter_factors

            plan.extra["jitter"] = jitter_factors(trace, dag, plan, edge_ms)
        write_plan(plan, plan_path)
        return {
            **plan_result(plan, edge_ms),
            "jitter": plan.extra.get("jitter"),
            "monitoring": plan.extra["monitoring"],
            "summary": plan_summary(plan, trace.meta),
        }
    except Exception as e:
        return {"failure": f"planning failed: {one_line(e)}"}


def replan(
    meta: dict,
    weights,
    r_max: float,
    solver: str,
    plan_path: Path,
    extra: dict,
    edge_ms: dict | None = None,
) -> dict:
    """Like ``solve``, from given node weights (``planner.trace.NodeWeights``) and delays on cross-rank
    edges (``planner.comm``); ``extra`` goes into the plan file's top level (step, reason, scales). Never
    raises."""
    try:
        from planner.plan import make_plan, write_plan
        from planner.trace import validate_meta

        plan = make_plan(validate_meta(meta, "meta.json"), weights, r_max, solver=solver, edge_ms=edge_ms)
        plan.extra.update(extra)
        Path(plan_path).parent.mkdir(parents=True, exist_ok=True)
        write_plan(plan, plan_path)
        return plan_result(plan, edge_ms)
    except Exception as e:
        return {"failure": f"re-planning failed: {one_line(e)}"}


def plan_result(plan, edge_ms: dict | None = None) -> dict:
    """What every rank needs of a plan: per-action ratios, predicted batch times, node weights, and the
    delays on cross-rank edges it was made with (``[u, v, ms]`` triples)."""
    return {
        "ratios": {a: ap.freeze_ratio for a, ap in plan.actions.items()},
        "batch_time_ms": dict(plan.batch_time_ms),
        "weights": {a: [ap.w_min, ap.w_max] for a, ap in plan.actions.items()},
        "edge_ms": [[u, v, ms] for (u, v), ms in (edge_ms or {}).items()],
    }


def load_given(path: str, schedule: str, num_stages: int, num_microbatches: int) -> dict:
    """``plan_result`` of the plan file ``path``; ``FreezeConfigError`` naming the file if it cannot be read
    or does not match this run."""
    from planner.plan import check_plan_matches, load_plan

    try:
        plan = load_plan(path)
        check_plan_matches(plan, schedule, num_stages, num_microbatches, path)
    except PlannerError as e:
        raise FreezeConfigError(f"[freeze] plan: {e}") from None
    return plan_result(plan)


def one_line(e: Exception) -> str:
    """A planner error's own one-line message; other exceptions with their type."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return msg if isinstance(e, PlannerError) else f"{type(e).__name__}: {msg}"
