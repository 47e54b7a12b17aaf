"""The plan and the re-plans of a run, made together by every rank of the job.

Every rank of every data-parallel replica of the pipeline contributes its measurements, global rank 0
solves the LP once on their combination (per action, the maximum over replicas:
``planner.trace.load.node_weights``; ``timelyfreeze.plan.solve`` solves and never raises), and the result is
broadcast, so every rank of every replica freezes by the same plan. A failure is broadcast the same
way: every rank goes on (without freezing, or with the plan in force) and keeps it in ``failures`` for
the summary. In the stable phase every rank feeds the same job-wide drift scales to its ``Replanner``
(``timelyfreeze.plan.replan``), so every rank decides alike when a re-plan is due, with no further collective.
"""

from __future__ import annotations

import time
from typing import Callable

from planner.errors import PlannerError
from planner.lp.budget import check_r_max
from planner.timing.drift import machine_factor, max_scales
from timelyfreeze.config.freeze import Freeze, FreezeConfigError
from timelyfreeze.hooks.profiler import ActionRecord
from timelyfreeze.methods.base import FreezeMethod
from timelyfreeze.plan import solve as planning
from timelyfreeze.plan.replan import Replanner, mean_ratio
from timelyfreeze.runtime.collectives import JobGroup
from timelyfreeze.runtime.run_info import RunInfo
from timelyfreeze.runtime.state import FreezeState


class PlanCoordinator:
    def __init__(
        self,
        cfg: Freeze,
        info: RunInfo,
        num_stages: int,
        *,
        job: JobGroup,
        method: FreezeMethod,
        state: FreezeState,
        log: Callable[[str], None],
    ):
        """``log``: global rank 0's log. A plan given with ``[freeze] plan`` is installed here;
        ``FreezeConfigError`` where it, or ``r_max_per_stage``, does not fit the run."""
        self.cfg, self.job, self.method, self.state, self.log = cfg, job, method, state, log
        self.paths = info.paths
        self.r_max = _budgets(cfg, num_stages)
        """``[freeze] r_max``, or the per-stage tuple of ``r_max_per_stage``, as the planner takes it."""
        self._pending: dict | None = None
        """A given plan waiting for ``meta`` (the end of step 1) before its re-planner can be made."""
        if cfg.plan:
            given = planning.load_given(cfg.plan, info.schedule, num_stages, info.num_microbatches)
            state.plan_batch_ms = given["batch_time_ms"]
            method.set_plan(given["ratios"])
            self._pending = given

    # -- every step ------------------------------------------------------------------------------
    def record(self, phase: str, records: list[ActionRecord]) -> None:
        """Keep this rank's records of a phase the method's plan is made from."""
        if phase in self.method.monitor_phases:
            self.state.monitor_records.extend(r.to_json() for r in records)

    def watching(self, phase: str) -> bool:
        """Whether this step's drift is checked (a stable step under a plan that re-planning watches)."""
        return phase == "stable" and self.state.replanner is not None

    def local_scales(self, records: list[ActionRecord]) -> dict[str, float] | None:
        """This rank's per-group drift scales of a watched step (``Replanner.local_scales``)."""
        return self.state.replanner.local_scales([(r.action, r.ms, r.freeze_ratio) for r in records])

    def after_gather(self, step: int) -> None:
        """After the step's gather (``meta`` is known from then on): watch a given plan, and make the plan
        where the method asks for it (collective)."""
        if self._pending is not None:
            self._start_replanner(self._pending)
        if self.method.needs_plan(step):
            self.make_plan(step)

    def predicted_ms(self) -> float | None:
        """The plan in force's predicted batch time (at the machine speed last seen, ``Replanner.rescale``)."""
        replanner, first = self.state.replanner, self.state.plan_batch_ms
        if replanner is not None and replanner.batch_ms:
            return replanner.predicted_ms()
        return first["planned"] if first else None

    def check_drift(self, step: int, row: dict, scales: list[dict | None] | None) -> None:
        """Add the step's drift to its metrics ``row`` (``scales``: every rank's ``local_scales`` of a
        watched step, else None), re-plan when one is due (collective), and count the re-plans."""
        replanner = self.state.replanner
        if scales is not None:
            job_scales = max_scales(scales)
            row["drift"] = replanner.observe(job_scales)
            machine = machine_factor(job_scales)
            if machine is not None:
                row["machine_factor"] = machine
            if replanner.due():
                self._replan(step, row)
            elif (event := replanner.rescale(step)) is not None:
                row["rescale"] = event
                self.log(
                    f"[freeze] uniform change after step {step}: machine factor x{event['machine_factor']:.2f} "
                    f"(every group alike): plan kept, predicted batch {event['old_predicted_ms']:.1f} -> "
                    f"{event['new_predicted_ms']:.1f} ms"
                )
        if replanner is not None:
            row["replans"] = len(replanner.events)

    def resumed(self) -> None:
        """A checkpoint's re-planner (``FreezeState.restore``) replaces a given plan's pending one."""
        if self.state.replanner is not None:
            self._pending = None

    def close(self) -> None:
        """Drop the job's process groups (see ``FreezeRuntime.close``)."""
        self.job = None

    # -- plan and re-plan (collective) -------------------------------------------------------------
    def make_plan(self, step: int) -> None:
        """The plan from every rank's monitoring records, made after ``step``."""
        t0 = time.perf_counter()
        gathered = self.job.gather_to_zero(self.state.monitor_records)
        result = None
        if self.job.rank == 0:
            result = planning.solve(
                self.state.meta,
                gathered,
                self.r_max,
                self.cfg.solver,
                self.paths.trace,
                self.paths.plan,
                self.cfg.estimator,
                self.cfg.gap_model,
                self.cfg.anchor_monitoring,
                self.cfg.jitter_model,
            )
        result = self.job.broadcast(result)
        if "failure" in result:
            self.method.set_plan(None, result["failure"])
            self.state.failures.append(f"{result['failure']} (step {step}); the run trained on without freezing")
            self.log(f"[freeze] ERROR {result['failure']}; training continues without freezing")
            return
        self.method.set_plan(result["ratios"])
        self._note_monitoring(result["monitoring"] | ({"jitter": result["jitter"]} if result.get("jitter") else {}))
        self.state.plan_batch_ms = self._expected(result["batch_time_ms"])
        self._start_replanner(result)
        self.log(f"[freeze] plan written to {self.paths.plan} ({time.perf_counter() - t0:.2f} s)\n" + result["summary"])

    def _start_replanner(self, result: dict) -> None:
        """Watch the plan ``result`` (``planning.plan_result``) for drift, where re-planning is on."""
        self._pending = None
        self.state.replanner = Replanner.for_run(self.cfg, self.state.meta)
        if self.state.replanner is not None:
            self.state.replanner.install(
                result["weights"],
                result["ratios"],
                self._expected(result["batch_time_ms"]),
                result["edge_ms"],
                (result.get("monitoring") or {}).get("noise"),
            )

    def _expected(self, batch_ms: dict[str, float]) -> dict[str, float]:
        """A plan's predicted batch times as steps will measure them: times the monitoring plan's jitter
        factors (``planner.timing.jitter``; kept in ``state.monitoring``, so re-plans after a resume use them too),
        unchanged without them (a given plan, ``[freeze] jitter_model = false``)."""
        factors = (self.state.monitoring or {}).get("jitter") or {}
        return {k: v * factors.get(k, 1.0) for k, v in batch_ms.items()}

    def _note_monitoring(self, monitoring: dict) -> None:
        """Keep the windows' factors for the summary; flag a window off by more than ``monitor_tolerance``."""
        tol = self.cfg.monitor_tolerance
        warnings = [
            f"the lower-bound window ran at F factor {f:.3f} against the upper-bound window"
            f"{f' (replica {d})' if len(monitoring['factors']['lower']) > 1 else ''}, beyond the {tol:.0%} "
            f"tolerance: {'its records were brought to' if monitoring['anchored'] else 'not anchored to'} the "
            "upper window's speed"
            for d, f in enumerate(monitoring["factors"]["lower"])
            if abs(f - 1.0) > tol
        ]
        self.state.monitoring = {**monitoring, "tolerance": tol, "warnings": warnings}
        for w in warnings:
            self.log(f"[freeze] WARNING {w}")

    def _replan(self, step: int, row: dict) -> None:
        """Re-plan after ``step``: from the current node weights rescaled by the drifting steps' median
        scales; the new plan applies from the next step."""
        replanner = self.state.replanner
        weights, scales = replanner.proposed_weights()
        old, kept = replanner.predicted_ms(), self._expected({"planned": replanner.kept_plan_ms(weights)})["planned"]
        machine = replanner.assess()["machine"]
        reason = replanner.reason()
        path = self.paths.replan(step)
        result = None
        if self.job.rank == 0:
            result = planning.replan(
                self.state.meta,
                weights,
                self.r_max,
                self.cfg.solver,
                path,
                {"replanned_at_step": step, "reason": reason, "scales": scales, "estimator": "rescaled"},
                replanner.edge_ms,
            )
        result = self.job.broadcast(result)
        if "failure" in result:
            replanner.window = []
            self.state.failures.append(f"{result['failure']} (step {step}); the run kept the plan in force")
            self.log(f"[freeze] ERROR {result['failure']}; the plan in force stays")
            return
        expected = self._expected(result["batch_time_ms"])
        new = expected["planned"]
        saves = 1.0 - new / kept if kept > 0 else 0.0
        frees = mean_ratio(replanner.ratios, weights) - mean_ratio(result["ratios"], weights)
        if max(saves, frees) < self.cfg.replan_min_gain:
            why = {"reason": reason, "machine_factor": machine, "saves": saves, "frees": frees}
            self._keep(step, row, weights, {**expected, "planned": kept}, why)
            return
        self.method.set_plan(result["ratios"])
        replanner.install(result["weights"], result["ratios"], expected, result["edge_ms"])
        event = {
            "step": step,
            "reason": reason,
            "scales": scales,
            "machine_factor": machine,
            "old_planned_ms": old,
            "new_planned_ms": new,
            "kept_plan_ms": kept,
            "plan": str(path),
        }
        replanner.events.append(event)
        row["replan"] = event
        self.log(
            f"[freeze] re-plan after step {step}: {reason}; predicted batch {old:.1f} -> {new:.1f} ms "
            f"(scales {', '.join(f'{g} x{s:.2f}' for g, s in scales.items())}; {_gain(kept, new)}); {path}"
        )

    def _keep(self, step: int, row: dict, weights, batch_ms: dict[str, float], why: dict) -> None:
        """The due re-plan buys less than ``replan_min_gain``: keep the plan in force under the new weights,
        predicting ``batch_ms`` (``Replanner.keep``); rank 0 renames the candidate plan's file to
        ``kept_step<N>.json``."""
        path = self.paths.replan(step)
        candidate = path.with_name(f"kept_step{step}.json")
        if self.job.rank == 0 and path.exists():
            path.replace(candidate)
        event = self.state.replanner.keep(step, weights, batch_ms, **why, plan=str(candidate))
        row["rescale"] = event
        self.log(
            f"[freeze] re-plan after step {step} not taken: {why['reason']}; the new plan would save "
            f"{100 * why['saves']:.1f} % of the batch and {why['frees']:+.3f} of freezing (< replan_min_gain "
            f"{self.cfg.replan_min_gain:g}): plan kept, predicted batch {event['old_predicted_ms']:.1f} -> "
            f"{batch_ms['planned']:.1f} ms; candidate {candidate}"
        )


def _gain(kept: float, new: float) -> str:
    """What a re-plan buys: the plan in force against the new plan, both under the new weights."""
    return f"kept, the plan in force would take {kept:.1f} ms: the re-plan saves {100 * (1 - new / kept):.1f} %"


def _budgets(cfg: Freeze, num_stages: int) -> float | tuple[float, ...]:
    if not cfg.r_max_per_stage:
        return float(cfg.r_max)
    try:
        return check_r_max(list(cfg.r_max_per_stage), num_stages, "[freeze] r_max_per_stage")
    except PlannerError as e:
        raise FreezeConfigError(str(e)) from None
