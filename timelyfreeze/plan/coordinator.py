"""The plan's life in a run: the one owner of the measurements it is made from, the plan in force, the
re-planner, the failures, and their part of the checkpoint.

Every rank of every data-parallel replica of the pipeline contributes its measurements, global rank 0 solves
the LP once on their combination (per action, the maximum over replicas: ``planner.trace.load.node_weights``;
``timelyfreeze.plan.planning`` solves and never raises), and the result is broadcast, so every rank of every
replica freezes by the same plan. The coordinator talks to the runtime only through the typed values of
``timelyfreeze.plan.outcome``: a :class:`~timelyfreeze.plan.outcome.PlanUpdate` or
:class:`~timelyfreeze.plan.outcome.PlanFailure` when the plan changes, which the runtime hands to the method;
each stable step's :class:`~timelyfreeze.plan.outcome.DriftReport`; the run's
:class:`~timelyfreeze.plan.outcome.PlanRecord`. A failure is broadcast the same way: every rank goes on
(without freezing, or with the plan in force) and keeps it in ``failures`` for the summary. In the stable
phase every rank feeds the same job-wide drift scales to its ``Replanner`` (``timelyfreeze.plan.replan``), so
every rank decides alike when a re-plan is due, with no further collective.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

from planner.errors import PlannerError
from planner.timing.drift import max_scales
from timelyfreeze.hooks.profiler import ActionRecord
from timelyfreeze.job.collectives import JobGroup
from timelyfreeze.job.errors import FreezeStateError
from timelyfreeze.job.phases import Phases
from timelyfreeze.job.run_info import RunInfo
from timelyfreeze.plan import planning
from timelyfreeze.plan.outcome import DriftReport, PlanChange, PlanFailure, PlanRecord, PlanUpdate
from timelyfreeze.plan.replan import Replanner, mean_ratio, takes_effect
from timelyfreeze.plan.settings import PlanSettings

STATE_FIELDS: dict[str, tuple[type, ...]] = {
    "monitor_records": (list,),
    "plan_batch_ms": (dict, type(None)),
    "failures": (list,),
    "replan": (dict, type(None)),
    "monitoring": (dict, type(None)),
}
"""The coordinator's part of the checkpoint (``state_dict``), field -> accepted types. ``replan`` and
``monitoring`` are absent in states saved before they existed and load as None."""
OPTIONAL_FIELDS = ("replan", "monitoring")


class PlanCoordinator:
    def __init__(
        self,
        settings: PlanSettings,
        info: RunInfo,
        num_stages: int,
        monitor_phases: tuple[str, ...],
        *,
        job: JobGroup,
        log: Callable[[str], None],
    ):
        """``monitor_phases``: the phases whose records the method's plan is made from; ``log``: global rank
        0's log. A plan given with ``[freeze] plan`` is read here (``given``); ``FreezeConfigError`` where it
        does not fit the run."""
        self.settings, self.job, self.log = settings, job, log
        self.monitor_phases = monitor_phases
        self.paths = info.paths
        self.meta: dict | None = None
        """The trace's ``meta.json`` dict, handed over with the first gather."""
        self.monitor_records: list[dict] = []
        """This rank's trace records of the phases the plan is made from."""
        self.plan_batch_ms: dict[str, float] | None = None
        """The first plan's predicted batch times (``plan.json``: from monitoring, or the given plan)."""
        self.failures: list[str] = []
        """Problems the run survived (e.g. no plan): reported in the summary; a sweep marks the job failed."""
        self.replanner: Replanner | None = None
        """Online re-planning: the plan in force and its drift; None before a plan or with re-planning off."""
        self.monitoring: dict | None = None
        """The monitoring windows' F factors against the reference, the tolerance and the warnings (summary)."""
        self.given: PlanUpdate | None = None
        """The plan of ``[freeze] plan``, which the method freezes by from the start."""
        self._pending: PlanUpdate | None = None
        """A given plan waiting for ``meta`` (the end of step 1) before its re-planner can be made."""
        if settings.given_plan:
            self.given = planning.load_given(settings.given_plan, info.schedule, num_stages, info.num_microbatches)
            self.plan_batch_ms = self.given.batch_time_ms
            self._pending = self.given

    # -- every step ------------------------------------------------------------------------------
    def record(self, phase: str, records: list[ActionRecord]) -> None:
        """Keep this rank's records of a phase the plan is made from."""
        if phase in self.monitor_phases:
            self.monitor_records.extend(r.to_json() for r in records)

    def watching(self, phase: str) -> bool:
        """Whether this step's drift is checked (a stable step under a plan that re-planning watches)."""
        return phase == "stable" and self.replanner is not None

    def local_scales(self, records: list[ActionRecord]) -> dict[str, float] | None:
        """This rank's per-group drift scales of a watched step (``Replanner.local_scales``)."""
        return self.replanner.local_scales([(r.action, r.ms, r.freeze_ratio) for r in records])

    def after_gather(self, step: int, meta: dict, needs_plan: bool) -> PlanChange:
        """After the step's gather (``meta`` is known from then on): watch a given plan, and make the plan
        where the method asks for it (``needs_plan``; collective)."""
        self.meta = meta
        if self._pending is not None:
            self._start_replanner(self._pending)
        return self.make_plan(step) if needs_plan else None

    def predicted_ms(self) -> float | None:
        """The plan in force's predicted batch time (at the machine speed last seen, ``Replanner.rescale``)."""
        if self.replanner is not None and self.replanner.batch_ms:
            return self.replanner.predicted_ms()
        return self.plan_batch_ms["planned"] if self.plan_batch_ms else None

    def check_drift(self, step: int, scales: list[dict | None] | None) -> DriftReport:
        """The step's drift (``scales``: every rank's ``local_scales`` of a watched step, else None): observed,
        a re-plan made when one is due (collective), and the re-plans counted."""
        replanner = self.replanner
        if scales is None:
            return DriftReport(replans=len(replanner.events) if replanner is not None else None)
        step_seen = replanner.observe_step(max_scales(scales))
        factors = step_seen.rank_factors
        seen = {
            "watched": True,
            "drift": step_seen.drift,
            "machine_factor": step_seen.machine_factor,
            "rank_factors": {str(r): f for r, f in factors.items()} if factors else None,
        }
        if replanner.due():
            change, replan, rescale = self._replan(step)
            return DriftReport(**seen, replan=replan, rescale=rescale, replans=len(replanner.events), change=change)
        if (event := replanner.rescale(step)) is not None:
            self.log(
                f"[freeze] uniform change after step {step}: machine factor x{event['machine_factor']:.2f} "
                f"(each rank's groups alike, within its swings): plan kept, predicted batch "
                f"{event['old_predicted_ms']:.1f} -> "
                f"{event['new_predicted_ms']:.1f} ms"
            )
        return DriftReport(**seen, rescale=event, replans=len(replanner.events))

    def record_of_run(self) -> PlanRecord:
        """The plan's life over the run, for the summary."""
        replanner = self.replanner
        return PlanRecord(
            predicted_batch_ms=self.plan_batch_ms,
            failures=list(self.failures),
            replans=list(replanner.events) if replanner is not None else [],
            rescales=list(replanner.rescales) if replanner is not None else [],
            monitoring=self.monitoring,
        )

    def close(self) -> None:
        """Drop the job's process groups (see ``FreezeRuntime.close``)."""
        self.job = None

    # -- plan and re-plan (collective) -------------------------------------------------------------
    def make_plan(self, step: int) -> PlanUpdate | PlanFailure:
        """The plan from every rank's monitoring records, made after ``step``."""
        t0 = time.perf_counter()
        gathered = self.job.gather_to_zero(self.monitor_records)
        result = None
        if self.job.rank == 0:
            result = planning.solve(self.meta, gathered, self.settings, self.paths.trace, self.paths.plan)
        result = self.job.broadcast(result)
        if isinstance(result, PlanFailure):
            self.failures.append(f"{result.message} (step {step}); the run trained on without freezing")
            self.log(f"[freeze] ERROR {result.message}; training continues without freezing")
            return result
        self._note_monitoring(result.monitoring | ({"jitter": result.jitter} if result.jitter else {}))
        self.plan_batch_ms = self._expected(result.batch_time_ms)
        self._start_replanner(result)
        self.log(f"[freeze] plan written to {self.paths.plan} ({time.perf_counter() - t0:.2f} s)\n" + result.summary)
        return result

    def _start_replanner(self, plan: PlanUpdate) -> None:
        """Watch ``plan`` for drift, where re-planning is on."""
        self._pending = None
        self.replanner = Replanner.for_run(self.settings, self.meta)
        if self.replanner is not None:
            self.replanner.install(
                plan.weights,
                plan.freeze_ratios,
                self._expected(plan.batch_time_ms),
                plan.edge_ms,
                (plan.monitoring or {}).get("noise"),
                (plan.monitoring or {}).get("rank_noise"),
            )

    def _expected(self, batch_ms: dict[str, float]) -> dict[str, float]:
        """A plan's predicted batch times as steps will measure them: times the monitoring plan's jitter
        factors (``planner.timing.jitter``; kept in ``monitoring``, so re-plans after a resume use them
        too), unchanged without them (a given plan, ``jitter_model = false``)."""
        factors = (self.monitoring or {}).get("jitter") or {}
        return {k: v * factors.get(k, 1.0) for k, v in batch_ms.items()}

    def _note_monitoring(self, monitoring: dict) -> None:
        """Keep the windows' factors for the summary; flag a window off by more than ``monitor_tolerance``."""
        tol = self.settings.monitor_tolerance
        warnings = [
            f"the lower-bound window ran at F factor {f:.3f} against the upper-bound window"
            f"{f' (replica {d})' if len(monitoring['factors']['lower']) > 1 else ''}, beyond the {tol:.0%} "
            f"tolerance: {'its records were brought to' if monitoring['anchored'] else 'not anchored to'} the "
            "upper window's speed"
            for d, f in enumerate(monitoring["factors"]["lower"])
            if abs(f - 1.0) > tol
        ]
        self.monitoring = {**monitoring, "tolerance": tol, "warnings": warnings}
        for w in warnings:
            self.log(f"[freeze] WARNING {w}")

    def _replan(self, step: int) -> tuple[PlanChange, dict | None, dict | None]:
        """Re-plan after ``step``: from the current node weights rescaled by the drifting steps' median
        scales; the new plan applies from the next step. Returns (the change: None where the plan in force is
        kept because the re-plan buys less than ``replan_min_gain``; the re-plan's event where it took effect;
        the kept plan's event where it did not)."""
        replanner = self.replanner
        weights, scales = replanner.proposed_weights()
        old, kept = replanner.predicted_ms(), self._expected({"planned": replanner.kept_plan_ms(weights)})["planned"]
        machine = replanner.assess()["machine"]
        reason = replanner.reason()
        path = self.paths.replan(step)
        result = None
        if self.job.rank == 0:
            extra = {"replanned_at_step": step, "reason": reason, "scales": scales, "estimator": "rescaled"}
            result = planning.replan(self.meta, weights, self.settings, path, extra, replanner.edge_ms)
        result = self.job.broadcast(result)
        if isinstance(result, PlanFailure):
            replanner.restart_window()
            self.failures.append(f"{result.message} (step {step}); the run kept the plan in force")
            self.log(f"[freeze] ERROR {result.message}; the plan in force stays")
            return result, None, None
        expected = self._expected(result.batch_time_ms)
        new = expected["planned"]
        saves = 1.0 - new / kept if kept > 0 else 0.0
        frees = mean_ratio(replanner.ratios, weights) - mean_ratio(result.freeze_ratios, weights)
        if not takes_effect(saves, frees, self.settings.replan_min_gain):
            why = {"reason": reason, "machine_factor": machine, "saves": saves, "frees": frees}
            return None, None, self._keep(step, weights, {**expected, "planned": kept}, why)
        replanner.install(result.weights, result.freeze_ratios, expected, result.edge_ms)
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
        replanner.replanned(event)
        self.log(
            f"[freeze] re-plan after step {step}: {reason}; predicted batch {old:.1f} -> {new:.1f} ms "
            f"(scales {', '.join(f'{g} x{s:.2f}' for g, s in scales.items())}; {_gain(kept, new)}); {path}"
        )
        return result, event, None

    def _keep(self, step: int, weights, batch_ms: dict[str, float], why: dict) -> dict:
        """The due re-plan buys less than ``replan_min_gain``: keep the plan in force under the new weights,
        predicting ``batch_ms`` (``Replanner.keep``); rank 0 renames the candidate plan's file to
        ``kept_step<N>.json``. Returns the logged event."""
        path = self.paths.replan(step)
        candidate = path.with_name(f"kept_step{step}.json")
        if self.job.rank == 0 and path.exists():
            path.replace(candidate)
        event = self.replanner.keep(step, weights, batch_ms, **why, plan=str(candidate))
        self.log(
            f"[freeze] re-plan after step {step} not taken: {why['reason']}; the new plan would save "
            f"{100 * why['saves']:.1f} % of the batch and {why['frees']:+.3f} of freezing (< replan_min_gain "
            f"{self.settings.replan_min_gain:g}): plan kept, predicted batch {event['old_predicted_ms']:.1f} -> "
            f"{batch_ms['planned']:.1f} ms; candidate {candidate}"
        )
        return event

    # -- checkpoint ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The coordinator's part of the checkpoint (``STATE_FIELDS``), plain data."""
        return {
            "monitor_records": self.monitor_records,
            "plan_batch_ms": self.plan_batch_ms,
            "failures": self.failures,
            "replan": self.replanner.state_dict() if self.replanner is not None else None,
            "monitoring": self.monitoring,
        }

    def load_state_dict(self, st: dict[str, Any], meta: dict | None) -> None:
        """Restore ``state_dict``'s fields of a checked state (``check_state``) on this run's trace ``meta``:
        the re-planner is rebuilt with this run's settings (none where re-planning is off now), and replaces
        a given plan's pending one. ``FreezeStateError`` naming what does not fit."""
        self.meta = meta
        for name in ("monitor_records", "plan_batch_ms", "failures", "monitoring"):
            setattr(self, name, st[name])
        self.replanner = None
        if st["replan"] is not None and meta is not None:
            try:
                self.replanner = Replanner.for_run(self.settings, meta)
                if self.replanner is not None:
                    self.replanner.load_state_dict(st["replan"])
            except (PlannerError, ValueError, KeyError, TypeError, AttributeError) as e:
                raise FreezeStateError(f"saved freezing state: replan: {planning.one_line(e)}") from None
        if self.replanner is not None:
            self._pending = None


_RECORD_TYPES = {"step": int, "action": str, "ms": (int, float), "phase": str, "freeze_ratio": (int, float)}


def check_state(st: dict, step: int, phases: Phases | None = None) -> None:
    """The contents of the coordinator's fields of a decoded state saved at ``step`` (their types are
    checked with the rest, ``timelyfreeze.runtime.state.check``); with ``phases``, also that every
    measurement belongs to the phase this run's settings give its step."""

    def fail(msg: str):
        raise FreezeStateError(f"saved freezing state: {msg}")

    for i, rec in enumerate(st["monitor_records"]):
        if not isinstance(rec, dict) or any(
            not isinstance(rec.get(f), t) or isinstance(rec.get(f), bool) for f, t in _RECORD_TYPES.items()
        ):
            fail(f"monitor_records[{i}] is not a trace record ({', '.join(_RECORD_TYPES)})")
        if rec["phase"] not in ("upper", "lower") or not 1 <= rec["step"] <= step or not math.isfinite(rec["ms"]):
            fail(f"monitor_records[{i}] = {rec}: must be an upper/lower record of a step <= {step} with finite ms")
    if st["plan_batch_ms"] is not None and not all(
        isinstance(st["plan_batch_ms"].get(k), (int, float)) and math.isfinite(st["plan_batch_ms"][k])
        for k in ("no_freeze", "all_frozen", "planned")
    ):
        fail("plan_batch_ms needs finite no_freeze, all_frozen and planned times")
    if not all(isinstance(f, str) for f in st["failures"]):
        fail("failures must be strings")
    if phases is not None:
        for rec in st["monitor_records"]:
            if phases.phase(rec["step"]) != rec["phase"]:
                fail(
                    f"a {rec['phase']} measurement of step {rec['step']}, which is in the "
                    f"{phases.phase(rec['step'])} phase of this run's [freeze] settings (changed since the checkpoint?)"
                )


def _gain(kept: float, new: float) -> str:
    """What a re-plan buys: the plan in force against the new plan, both under the new weights."""
    return f"kept, the plan in force would take {kept:.1f} ms: the re-plan saves {100 * (1 - new / kept):.1f} %"
