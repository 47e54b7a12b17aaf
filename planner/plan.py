"""Freeze plans (``timelyfreeze-plan/1``, see ``docs/formats.md``): make one from node weights, write/load/check
it, summarise it."""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner.errors import PlannerError
from planner.fileio import Rows, read_json, write_json_atomically
from planner.lp.budget import SENSITIVITY_STEP, check_r_max, format_r_max, stage_r_max
from planner.lp.problem import Problem, build_problem
from planner.lp.solve import solve_problem
from planner.schedule.actions import FREEZABLE_KINDS, action_fields, parse_action
from planner.schedule.dag import BatchDag, EdgeDelays, build_dag, longest_path
from planner.timing import monitor
from planner.timing.cliff import apply_cliffs, find_cliffs
from planner.timing.comm import estimate_edge_delays
from planner.timing.estimate import DEFAULT_ESTIMATOR, estimate_weights
from planner.timing.gaps import delay_fields, with_gap_costs
from planner.timing.jitter import jitter_factors
from planner.trace.load import NodeWeights, Trace, TraceMeta, freezable_mask

PLAN_FORMAT = "timelyfreeze-plan/1"
_TOL = 1e-9  # relative tolerance of load-time checks
_ACTION_FIELDS = ("w_min", "w_max", "start", "duration", "freeze_ratio")
_ACTION_ROW = operator.attrgetter(*_ACTION_FIELDS)
_PLAN_FIELDS = ("schedule", "num_stages", "num_microbatches", "r_max", "batch_time_ms", "actions", "solver")
_BATCH_TIME_FIELDS = ("no_freeze", "all_frozen", "planned")
_SOLVER_FIELDS = ("name", "status", "seconds")
SENSITIVITY_FIELD = "budget_sensitivity"  # writer field (unchecked): stage -> ms saved per +0.01 of its r_max
# Required field names: top level (_PLAN_FIELDS, plus "format"), per action (_ACTION_FIELDS), in
# batch_time_ms (_BATCH_TIME_FIELDS) and in solver (_SOLVER_FIELDS); see docs/formats.md.


@dataclass
class ActionPlan:
    """One action's bounds, planned start/duration (ms) and freeze ratio."""

    w_min: float
    w_max: float
    start: float
    duration: float
    freeze_ratio: float


@dataclass
class Plan:
    """A freeze plan as the spec lays it out; ``extra`` keeps unknown top-level fields.

    ``r_max``: one number (every stage's budget) or a list of ``num_stages`` numbers (each stage's own).
    ``budget_sensitivity``: per stage, ms of batch time one more 0.01 of its ``r_max`` would save
    (:func:`planner.lp.solve.solve_freeze_lp`); ``None`` for a plan file written without it.
    ``critical_path``: the actions of one longest path of the planned durations, as the planner found it
    (not part of the file; ``None`` for a loaded plan)."""

    schedule: str
    num_stages: int
    num_microbatches: int
    r_max: float | list[float]
    batch_time_ms: dict[str, float]
    actions: dict[str, ActionPlan]
    solver: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)
    budget_sensitivity: dict[int, float] | None = None
    critical_path: list[str] | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        return self._json(self.action_rows().as_dict())

    def action_rows(self) -> Rows:
        """The ``actions`` field as rows of ``_ACTION_FIELDS`` (what :func:`write_plan` writes without a dict per
        action)."""
        return Rows(list(self.actions), _ACTION_FIELDS, list(map(_ACTION_ROW, self.actions.values())))

    def _json(self, actions: Any) -> dict[str, Any]:
        """:meth:`to_json` with ``actions`` as the value of its ``actions`` field."""
        d: dict[str, Any] = dict(self.extra)
        d.update(
            {
                "format": PLAN_FORMAT,
                "schedule": self.schedule,
                "num_stages": self.num_stages,
                "num_microbatches": self.num_microbatches,
                "r_max": self.r_max if isinstance(self.r_max, (int, float)) else list(self.r_max),
                "batch_time_ms": dict(self.batch_time_ms),
                "actions": actions,
                "solver": dict(self.solver),
            }
        )
        if self.budget_sensitivity is not None:
            d[SENSITIVITY_FIELD] = {str(s): v for s, v in sorted(self.budget_sensitivity.items())}
        return d


def make_plan(
    meta: TraceMeta,
    weights: NodeWeights,
    r_max: float | Sequence[float],
    *,
    solver: str = "auto",
    edge_ms: EdgeDelays | None = None,
    gap: float | None = None,
) -> Plan:
    """Build the problem (DAG, checked budget and delays, :func:`planner.lp.problem.build_problem`), solve the LP,
    and assemble the plan with the no-freeze/all-frozen batch times (:func:`plan_problem`).

    ``r_max``: one budget for every stage, or a sequence of ``meta.num_stages`` budgets, one per stage
    (:func:`planner.lp.budget.check_r_max`; the plan's ``r_max`` is then the list).  The plan's
    ``budget_sensitivity`` says per stage how many ms of batch time one more 0.01 of its ``r_max`` saves.
    ``edge_ms`` (:mod:`planner.timing.comm`): delays (ms) on DAG edges, in every batch time and in the LP; when
    non-empty the plan's top-level ``comm`` field summarises those on cross-rank edges and ``gaps`` those on
    same-rank edges (``planner.timing.comm.summarize``).
    ``gap``: certified relative gap accepted (:func:`planner.lp.solve.solve_freeze_lp`); the plan's ``solver`` records
    the lower bound and the gap reached (``lower_bound_ms``, ``gap``)."""
    return plan_problem(build_problem(build_dag(meta), weights, r_max, edge_ms), solver=solver, gap=gap)


def plan_problem(problem: Problem, *, solver: str = "auto", gap: float | None = None) -> Plan:
    """The plan of one built problem (:func:`make_plan` has the arguments)."""
    weights, budget = problem.weights, problem.r_max
    sol = solve_problem(problem, solver=solver, gap=gap)
    table = problem.meta.action_table()
    names = table.names
    hi, lo, d, start = (
        np.fromiter(map(m.__getitem__, names), np.float64, len(names))
        for m in (weights.w_max, weights.w_min, sol.durations, sol.starts)
    )
    frz = freezable_mask(table.kind, hi, lo)  # weights.freezable of each action, its kind as the metadata read it
    ratio = np.zeros(len(names))
    ratio[frz] = np.minimum(1.0, np.maximum(0.0, (hi[frz] - d[frz]) / (hi[frz] - lo[frz])))
    actions = dict(zip(names, map(ActionPlan, lo.tolist(), hi.tolist(), start.tolist(), d.tolist(), ratio.tolist())))
    return Plan(
        schedule=problem.meta.schedule,
        num_stages=problem.num_stages,
        num_microbatches=problem.meta.num_microbatches,
        r_max=budget if isinstance(budget, float) else list(budget),
        batch_time_ms={
            "no_freeze": problem.no_freeze,
            "all_frozen": problem.makespan(weights.w_min),
            "planned": sol.makespan,
        },
        actions=actions,
        solver={
            "name": "highs",
            "status": sol.status,
            "seconds": sol.seconds,
            "method": sol.solver,
            "lower_bound_ms": sol.lower_bound,
            "gap": sol.gap,
            **({} if sol.gap_target is None else {"gap_target": sol.gap_target}),
        },
        extra=delay_fields(problem.dag, problem.edge_ms),
        budget_sensitivity=sol.budget_sensitivity,
        critical_path=sol.critical_path,
    )


def plan_from_trace(
    trace: Trace,
    r_max: float | Sequence[float],
    *,
    estimator: str = DEFAULT_ESTIMATOR,
    comm: bool = True,
    edge_ms: EdgeDelays | None = None,
    solver: str = "auto",
    gap: float | None = None,
    dag: BatchDag | None = None,
    gaps: bool = False,
    anchor: bool | None = None,
    jitter: bool = False,
    cliff: bool = False,
) -> Plan:
    """:func:`make_plan` on a loaded trace, node weights by ``estimator`` (recorded as the plan's ``estimator``).
    ``comm``: the delays on cross-rank edges measured in the trace (``planner.timing.comm``; none without ``start_ms``),
    or ``edge_ms`` when given; False ignores them. ``dag``: ``build_dag(trace.meta)`` when the caller has it.
    ``gaps`` (with ``comm``): also the fixed costs between a rank's consecutive actions (``planner.timing.gaps``;
    the plan's ``gaps`` field). ``anchor`` (``planner.timing.monitor``): True brings the lower-bound window to the
    upper window's machine speed before estimating, False does not; either way the plan records the factors
    and noise floors (``monitoring``). None (the default): neither. ``jitter`` (``planner.timing.jitter``): the plan
    also records the factors the monitoring windows' jitter adds to its predictions (field ``jitter``).
    ``cliff`` (``planner.timing.cliff``): a stage whose all-frozen backward drops its input-gradient work plans on the
    floor of the other stages (field ``cliff``, written whenever ``cliff`` is on). :data:`planner.defaults.
    PLAN_DEFAULTS` are the arguments the runtime and ``python -m planner plan`` use."""
    monitoring = monitor.monitoring_summary(trace, bool(anchor)) if anchor is not None else None
    weights = estimate_weights(monitor.anchored(trace, monitoring["factors"]) if anchor else trace, estimator)
    cliffs = None
    if cliff:
        cliffs = find_cliffs(weights)
        weights = apply_cliffs(weights, cliffs)
    dag = build_dag(trace.meta) if dag is None else dag
    edge_ms = None if not comm else edge_ms if edge_ms is not None else estimate_edge_delays(trace, dag)
    model = None
    if gaps and comm:
        edge_ms, model = with_gap_costs(trace, dag, edge_ms)
    plan = plan_problem(build_problem(dag, weights, r_max, edge_ms), solver=solver, gap=gap)
    plan.extra["estimator"] = estimator
    if model is not None:
        plan.extra["gaps"] = {**plan.extra.get("gaps", {"edges": 0}), **model.summary()}
    if monitoring is not None:
        plan.extra["monitoring"] = monitoring
    if cliffs is not None:
        plan.extra["cliff"] = cliffs
    if jitter:
        plan.extra["jitter"] = jitter_factors(trace, dag, plan, edge_ms)
    return plan


def write_plan(plan: Plan, path: str | os.PathLike[str]) -> None:
    """Write atomically (temp file in the same directory, fsync, ``os.replace``); a failure is a
    one-line PlannerError naming ``path``."""
    write_json_atomically(path, plan._json(plan.action_rows()), one_line="actions")


def stage_mean_ratios(plan: Plan, meta: TraceMeta | None = None) -> dict[int, float]:
    """Mean freeze ratio per stage over its freezable actions (``w_max > w_min`` and a freezable kind: B, W,
    or an OVERLAP_F_B pair, whose stage is its backward part's). ``meta``: the trace metadata the plan was made
    for, whose action table gives the stages and kinds when it lists the plan's actions (else they are read)."""
    sums: dict[int, list[float]] = {}
    names = list(plan.actions)
    table = None if meta is None else meta.action_table()
    if table is not None and table.names == names:
        stages, kinds = table.stage, table.kind
    else:
        stages, kinds, _ = action_fields(names)
    for stage, kind, p in zip(stages, kinds, plan.actions.values()):
        if kind in FREEZABLE_KINDS and p.w_max - p.w_min > 0:
            sums.setdefault(stage, []).append(p.freeze_ratio)
    return {s: sum(v) / len(v) for s, v in sorted(sums.items())}


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _close_le(a: float, b: float) -> bool:
    return a <= b + _TOL * max(1.0, abs(a), abs(b))


def validate_plan(d: Any, source: str) -> Plan:
    """Check a plan dict against the spec; raises a one-line :class:`PlannerError` naming ``source``."""

    def err(msg: str) -> PlannerError:
        return PlannerError(f"{source}: {msg}")

    if not isinstance(d, dict):
        raise err(f"expected a JSON object, got {type(d).__name__}")
    if d.get("format") != PLAN_FORMAT:
        what = "missing" if "format" not in d else f"is {d.get('format')!r}"
        raise err(f"field 'format' {what}, expected {PLAN_FORMAT!r}")
    for k in _PLAN_FIELDS:
        if k not in d:
            raise err(f"missing field '{k}'")
    if not isinstance(d["schedule"], str):
        raise err("field 'schedule' must be a string")
    for k in ("num_stages", "num_microbatches"):
        if not isinstance(d[k], int) or isinstance(d[k], bool) or d[k] < 1:
            raise err(f"field '{k}' must be a positive integer, got {d[k]!r}")
    try:
        r_max = check_r_max(d["r_max"], d["num_stages"], "field 'r_max'")
    except PlannerError as e:
        raise err(str(e)) from None
    bt = d["batch_time_ms"]
    if not isinstance(bt, dict):
        raise err("field 'batch_time_ms' must be an object")
    for k in _BATCH_TIME_FIELDS:
        if not _num(bt.get(k)) or bt[k] < 0:
            raise err(f"field 'batch_time_ms.{k}' must be a finite number >= 0, got {bt.get(k)!r}")
    if not (_close_le(bt["all_frozen"], bt["planned"]) and _close_le(bt["planned"], bt["no_freeze"])):
        raise err(
            f"batch_time_ms: planned {bt['planned']} is not between all_frozen {bt['all_frozen']} "
            f"and no_freeze {bt['no_freeze']}"
        )
    solver = d["solver"]
    if not isinstance(solver, dict) or not all(k in solver for k in _SOLVER_FIELDS):
        raise err("field 'solver' must be an object with name, status and seconds")
    acts = d["actions"]
    if not isinstance(acts, dict) or not acts:
        raise err("field 'actions' must be a non-empty object")
    actions: dict[str, ActionPlan] = {}
    for a, p in acts.items():
        try:
            act = parse_action(a)
        except ValueError as e:
            raise err(f"field 'actions': {e}") from None
        if any(p.stage >= d["num_stages"] or p.microbatch >= d["num_microbatches"] for p in act.parts):
            raise err(
                f"field 'actions': action {a!r} is outside num_stages={d['num_stages']} / "
                f"num_microbatches={d['num_microbatches']}"
            )
        if not isinstance(p, dict):
            raise err(f"actions[{a!r}] must be an object")
        for k in _ACTION_FIELDS:
            if not _num(p.get(k)):
                raise err(f"actions[{a!r}].{k} must be a finite number, got {p.get(k)!r}")
        ap = ActionPlan(*(float(p[k]) for k in _ACTION_FIELDS))
        if ap.w_min < 0 or not _close_le(ap.w_min, ap.w_max):
            raise err(f"actions[{a!r}]: w_min {ap.w_min} must be within [0, w_max={ap.w_max}]")
        if not (_close_le(ap.w_min, ap.duration) and _close_le(ap.duration, ap.w_max)):
            raise err(f"actions[{a!r}]: duration {ap.duration} is outside [w_min, w_max] = [{ap.w_min}, {ap.w_max}]")
        if act.kind in FREEZABLE_KINDS and ap.w_max - ap.w_min > 0:
            expect = (ap.w_max - ap.duration) / (ap.w_max - ap.w_min)
        else:
            expect = 0.0
        if not 0 <= ap.freeze_ratio <= 1 or abs(ap.freeze_ratio - expect) > 1e-6:
            raise err(
                f"actions[{a!r}]: freeze_ratio {ap.freeze_ratio} does not match the duration (expected {expect:.9g})"
            )
        actions[a] = ap
    extra = {k: v for k, v in d.items() if k not in _PLAN_FIELDS and k != "format"}
    sens = _sensitivity(extra.get(SENSITIVITY_FIELD), d["num_stages"])
    if sens is not None:
        del extra[SENSITIVITY_FIELD]  # well-formed: parsed; anything else stays an unknown field, kept as is
    plan = Plan(
        d["schedule"],
        d["num_stages"],
        d["num_microbatches"],
        r_max if isinstance(r_max, float) else list(r_max),
        {k: float(bt[k]) for k in _BATCH_TIME_FIELDS} | {k: v for k, v in bt.items() if k not in _BATCH_TIME_FIELDS},
        actions,
        dict(solver),
        extra,
        sens,
    )
    for s, mean in stage_mean_ratios(plan).items():
        if isinstance(r_max, float):
            if mean > r_max + 1e-6:
                raise err(f"stage {s}: mean freeze ratio {mean:.6g} exceeds r_max={r_max}")
        elif mean > r_max[s] + 1e-6:
            raise err(f"stage {s}: mean freeze ratio {mean:.6g} exceeds its r_max={r_max[s]} (r_max[{s}])")
    return plan


def _sensitivity(v: Any, num_stages: int) -> dict[int, float] | None:
    """The writer's ``budget_sensitivity`` (``{"<stage>": ms}`` with canonical stage keys below
    ``num_stages``) as ``{stage: ms}``; ``None`` when absent or not of that form."""
    if not isinstance(v, dict):
        return None
    out: dict[int, float] = {}
    for k, x in v.items():
        if not (isinstance(k, str) and k.isdigit() and str(int(k)) == k and int(k) < num_stages and _num(x)):
            return None
        out[int(k)] = float(x)
    return out


def load_plan(path: str | os.PathLike[str]) -> Plan:
    """Read and validate a plan file."""
    path = os.fspath(path)
    return validate_plan(read_json(path, "plan file does not exist"), path)


def check_plan_matches(plan: Plan, schedule: str, num_stages: int, num_microbatches: int, source: str) -> None:
    """Raise :class:`PlannerError` if the plan was made for another schedule/stage count/microbatch count."""
    for what, have, want in (
        ("schedule", plan.schedule, schedule),
        ("num_stages", plan.num_stages, num_stages),
        ("num_microbatches", plan.num_microbatches, num_microbatches),
    ):
        if have != want:
            raise PlannerError(f"{source}: plan is for {what}={have!r}, but this run has {what}={want!r}")


def _abbrev(path: list[str], keep: int = 6) -> str:
    if len(path) <= 2 * keep:
        return " -> ".join(path)
    return " -> ".join(path[:keep]) + f" -> ... ({len(path) - 2 * keep} more) -> " + " -> ".join(path[-keep:])


def plan_summary(plan: Plan, meta: TraceMeta, edge_ms: EdgeDelays | None = None) -> str:
    """Human-readable multi-line summary of a plan; its critical path is the planner's
    (``plan.critical_path``), or for a loaded plan the longest path of its durations on ``meta``'s DAG with
    ``edge_ms``, the delays it was made with."""
    bt = plan.batch_time_ms
    speedup = bt["no_freeze"] / bt["planned"] if bt["planned"] > 0 else float("nan")
    lines = [
        f"schedule {plan.schedule}: {plan.num_stages} stages x {plan.num_microbatches} microbatches, "
        f"{len(plan.actions)} actions, r_max {format_r_max(plan.r_max)}",
        f"batch time (ms): no-freeze {bt['no_freeze']:.3f}, all-frozen {bt['all_frozen']:.3f}, "
        f"planned {bt['planned']:.3f}  (predicted speedup x{speedup:.3f}, "
        f"{100 * (1 - bt['planned'] / bt['no_freeze']) if bt['no_freeze'] > 0 else 0.0:.1f}% less time)",
    ]
    means = stage_mean_ratios(plan, meta)
    if means:
        lines.append("mean freeze ratio per stage: " + ", ".join(f"{s}: {m:.3f}" for s, m in means.items()))
    else:
        lines.append("mean freeze ratio per stage: no freezable actions")
    if plan.budget_sensitivity is not None:
        lines.append(sensitivity_line(plan, means))
    try:
        path = plan.critical_path
        if path is None:
            path = longest_path(build_dag(meta), {a: p.duration for a, p in plan.actions.items()}, edge_ms)[2]
        lines.append(f"critical path ({len(path)} actions): {_abbrev(path)}")
    except PlannerError as e:
        lines.append(f"critical path: unavailable ({e})")
    s = plan.solver
    lines.append(
        f"solver: {s.get('name')} {s.get('method', '')} status {s.get('status')}, "
        f"{float(s.get('seconds', 0.0)):.3f} s".replace("  ", " ")
    )
    if s.get("method") == "highs-region-bounded" and _num(s.get("lower_bound_ms")) and _num(s.get("gap")):
        lines.append(
            f"certified: planned batch time within {100 * s['gap']:.3f} % of the optimum (lower bound "
            f"{s['lower_bound_ms']:.3f} ms); total freezing reduced greedily, not certified least "
            f"(--gap 0: exact)"
        )
        if _num(s.get("gap_target")) and s["gap"] > s["gap_target"]:
            lines.append(
                f"gap target {100 * s['gap_target']:.3f} % not reached: most ranks are co-critical (nearly "
                f"balanced stages); --gap {s['gap_target']:g} insists (the whole LP if need be: minutes at "
                f"this size), --gap 0 gives the exact optimum"
            )
    return "\n".join(lines)


def sensitivity_line(plan: Plan, means: dict[int, float] | None = None) -> str:
    """One line: per stage, ms of batch time one more 0.01 of its ``r_max`` saves, e.g.
    ``budget sensitivity (ms of batch time saved per +0.01 of r_max): stage 0: 3.2, stage 1: 0 (slack)``.
    A zero says why: ``slack`` (more budget buys nothing now), ``r_max 1`` (everything may be frozen
    already) or ``nothing to freeze``. ``means``: :func:`stage_mean_ratios` of ``plan``, when the caller has it."""
    means = stage_mean_ratios(plan) if means is None else means
    parts = []
    for s, ms in sorted((plan.budget_sensitivity or {}).items()):
        if ms > 0:
            parts.append(f"stage {s}: {ms:.4g}")
        elif s not in means:
            parts.append(f"stage {s}: 0 (nothing to freeze)")
        elif stage_r_max(plan.r_max, s) >= 1.0:
            parts.append(f"stage {s}: 0 (r_max 1)")
        else:
            parts.append(f"stage {s}: 0 (slack)")
    return f"budget sensitivity (ms of batch time saved per +{SENSITIVITY_STEP:g} of r_max): " + ", ".join(parts)
