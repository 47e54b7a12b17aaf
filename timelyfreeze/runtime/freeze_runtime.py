"""The freezing runtime of one rank: it wires the method, the freezing hook, the profiler, the trace,
the metrics, the plan and the checkpointed state together, and says when each runs. Each of those
lives in its own module: ``outputs.metrics_row`` builds the step's metrics row, ``plan.coordinator`` owns
the plan's life (the plan, the re-plans and their state) and hands back a ``PlanUpdate`` or a
``PlanFailure`` that the runtime passes to the method, ``runtime.state`` is the checkpoint's format.

The trainer calls, every step: ``begin_step`` -> for every gradient-accumulation batch ``begin_batch``,
(the pipeline runs; the stage hooks fire), ``add_batch`` -> ``after_backward`` -> (optimizer step) ->
``end_step``. ``end_step`` gathers a few numbers over the whole job (every rank, same step: this rank's
metrics, on step 1 what the trace's ``meta.json`` needs, in the stable phase the drift scales; from
step 2 on one fixed-size float64 tensor, ``timelyfreeze.runtime.step_gather``), writes
the trace and the metrics row, and when the method asks for a plan (``FreezeMethod.needs_plan``) or the
plan in force stops matching the measurements, has the plan coordinator make one. The masks a plan
implies depend only on (seed, step, stage, microbatch, accumulation batch), so the replicas of a stage
(FSDP's shard and replicate groups, TP's group) leave out the same tensors in every microbatch.
"""

from __future__ import annotations

from typing import Any

from planner.errors import PlannerError
from planner.fileio import write_json_atomically
from planner.plan import load_plan
from planner.timing.spans import plan_f_factor
from planner.trace.load import Trace, trace_from_records
from timelyfreeze.config.freeze import Freeze, knob_of
from timelyfreeze.data.choice_task import Accuracy
from timelyfreeze.hooks import stage_hooks
from timelyfreeze.hooks.compile_watch import CompileWatch
from timelyfreeze.hooks.freezing import FreezingHook
from timelyfreeze.hooks.profiler import ActionProfiler, ActionRecord, TraceWriter, build_meta
from timelyfreeze.hooks.stage_layout import build_stage_views
from timelyfreeze.hooks.step_clock import StepClock
from timelyfreeze.job.collectives import JobGroup
from timelyfreeze.job.phases import Phases
from timelyfreeze.job.run_info import PipelinePart, RunInfo, TrainerHandles
from timelyfreeze.job.stage_view import StageView
from timelyfreeze.methods.base import FreezeMethod, MethodContext
from timelyfreeze.methods.registry import method_class
from timelyfreeze.outputs import summary as run_summary
from timelyfreeze.outputs import timeline
from timelyfreeze.outputs.metrics_log import MetricsLog
from timelyfreeze.outputs.metrics_row import StepMetrics, describe
from timelyfreeze.plan.coordinator import PlanCoordinator
from timelyfreeze.plan.outcome import PlanChange
from timelyfreeze.plan.planning import one_line
from timelyfreeze.plan.settings import PlanSettings
from timelyfreeze.runtime import state as saved_state
from timelyfreeze.runtime.clock_sync import ClockSync, gather_records, sync_steps
from timelyfreeze.runtime.state import FreezeStateError, RunState
from timelyfreeze.runtime.step_gather import StepGather


class FreezeRuntime:
    def __init__(self, cfg: Freeze, phases: Phases, info: RunInfo, pipeline: PipelinePart, trainer: TrainerHandles):
        """Collective over the job (every rank builds its runtime at the same point)."""
        self.cfg, self.phases, self.info = cfg, phases, info
        self.job = JobGroup(pipeline.group)
        self.pg = self.job.pipeline
        # -- clocks across hosts (timelyfreeze.runtime.clock_sync): the clock of every rank, its offset later
        self.clocks = ClockSync(self.job.places)
        self._sync_at = sync_steps(phases.warmup_end, phases.upper_end, phases.lower_end)
        self._log = trainer.log
        self.paths = info.paths
        self.paths.out.mkdir(parents=True, exist_ok=True)
        self.views: list[StageView] = build_stage_views(pipeline.stages, info.n_layers, unit=info.unit)
        self.stage_to_rank = _stage_to_rank(self.pg.all_gather([v.stage for v in self.views]))
        self.num_stages = len(self.stage_to_rank)
        self.ctx = MethodContext(
            stages=self.views,
            num_stages=self.num_stages,
            num_microbatches=info.num_microbatches,
            schedule=info.schedule,
            total_steps=info.total_steps,
            all_gather=self.pg.all_gather,
            get_lr=trainer.get_lr,
            pp_rank=self.pg.rank,
            pp_size=self.pg.size,
            lr_warmup_steps=info.lr_warmup_steps,
            phases=phases,
            compiled=info.compiled,
        )
        self.method: FreezeMethod = method_class(cfg.method)(cfg, self.ctx)
        self.compile_watch = CompileWatch(phases.warmup_end, [v.module for v in self.views]) if info.compiled else None
        self.step = 0
        self.accum = 0
        """Gradient-accumulation batch of the current step (0-based), set by ``begin_batch``."""
        self.clock = StepClock(info.use_cuda)
        """The step's marks (host clock on CPU, CUDA events on CUDA), shared by the profiler and the metrics."""
        self.profiler = ActionProfiler(self.pg.rank, use_cuda=info.use_cuda, pairs=pipeline.pairs, clock=self.clock)
        self.hook = FreezingHook(
            self.views,
            self.method,
            lambda: self.step,
            lambda: self.accum,
            pairs=pipeline.pairs,
            num_microbatches=info.num_microbatches,
            draw_ahead=not info.use_cuda,  # on a CPU a batch's draws are made at once
        )
        self._stages = pipeline.stages
        self._hooks_on = False
        self.attach_hooks()
        self.meter = StepMetrics(self.views, self.job, info, self.clock)
        self.metrics = MetricsLog(self.paths.metrics, write=self.job.rank == 0, tb_log=trainer.tb_log)
        self.writer: TraceWriter | None = None
        self.state = RunState()
        """The runtime's own part of a checkpoint (``state_dict``); the plan's part is the coordinator's."""
        self.plan_settings = PlanSettings.from_config(cfg, self.num_stages)
        self.plans = PlanCoordinator(
            self.plan_settings,
            info,
            self.num_stages,
            self.method.monitor_phases,
            job=self.job,
            log=self.log,
        )
        if self.plans.given is not None:
            self.plans.given.apply_to(self.method)
        self._gather: StepGather | None = None
        """The per-step gather's fixed layout, once ``meta`` is known (``timelyfreeze.runtime.step_gather``)."""
        self.refused = False
        """True once a checkpoint's freezing state was refused: the run ends without a summary."""

    def log(self, msg: str) -> None:
        if self.job.rank == 0:
            self._log(msg)

    def attach_hooks(self) -> None:
        if not self._hooks_on:
            for st in self._stages:
                stage_hooks.install(st, [self.hook, self.profiler])
            self._hooks_on = True

    def detach_hooks(self) -> None:
        """Remove the stage hooks (plain compute; used by the overhead benchmark and ``close``), every tensor on."""
        for st in self._stages:
            stage_hooks.uninstall(st)
        self.hook.all_on()
        self._hooks_on = False

    # -- per step --------------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        if self.writer is None and self.cfg.advanced.trace:
            self.writer = TraceWriter(self.paths.trace, self.pg.rank, replica=self.job.replica, resume_step=step - 1)
        self.state.history = rows_before(self.state.history, step)
        self.step = step
        self.accum = 0
        self.profiler.reset_order()
        self.method.begin_step(step)
        self.meter.begin(float(self.ctx.get_lr()))  # the LR this step's optimizer update uses

    def begin_batch(self, index: int) -> None:
        """Gradient-accumulation batch ``index`` (0-based) of the step starts: methods draw fresh masks (on a CPU the
        freezing hook draws them all here, ``FreezingHook.prepare``)."""
        self.accum = index
        self.hook.prepare(self.step, index)

    def add_batch(self, time: float | tuple[Any, Any], loss: Any | None) -> None:
        """One pipeline batch (``schedule.step`` call) finished: its wall time (seconds, or two marks of
        ``self.clock``) and local loss (a float or a 0-d tensor, read once at the end of the step: no host
        synchronisation per batch on CUDA)."""
        self.meter.add_batch(time, loss)

    def after_backward(self, step: int) -> None:
        self.method.after_backward(step)

    def end_step(self, step: int) -> dict:
        """After the optimizer step. Collective over the job."""
        self.method.after_optimizer_step(step)
        if self.compile_watch is not None:
            self.compile_watch.end_step(step)
        self.meter.end()
        phase = self.method.phase(step)
        records = self._records(step, phase)
        watch = self.plans.watching(phase)
        local = self.meter.local(records, self.accum + 1)
        scales = self.plans.local_scales(records) if watch else None
        method = self.method.step_metrics()
        pending = None
        if self.state.meta is not None:  # a fixed layout: one float64 tensor collective, started here
            if self._gather is None:
                self._gather = StepGather(_all_actions(self.state.meta), type(self.method).step_metric_names)
            pending = self.job.start_gather_floats(self._gather.pack(local, scales, method))
        # this rank's own work while the other ranks reach the gather: off the step's critical path
        if self.writer is not None:
            self.writer.write(records)
        self.plans.record(phase, records)
        if pending is not None:  # timelyfreeze.runtime.step_gather
            gathered = self._gather.unpack(pending.result())
        else:  # step 1: meta.json needs every rank's order, tensors and host
            gathered = self.job.all_gather(
                {
                    **local,
                    "order": list(self.profiler.order),
                    "tensors": self.hook.freezable_tensors(),
                    "host": self.clocks.id,
                    "scales": scales,
                    "method": method,
                }
            )
            self._write_meta(gathered)
        if step in self._sync_at:  # before any plan is made from the window's records
            self._measure_clocks(step)
        self._apply(self.plans.after_gather(step, self.state.meta, self.method.needs_plan(step)))
        predicted = self.plans.predicted_ms()  # the plan's prediction for this step, before a re-plan after it
        drift = self.plans.check_drift(step, [g["scales"] for g in gathered] if watch else None)
        self._apply(drift.change)
        row = self.meter.row(step, phase, gathered, predicted, drift.row_fields())
        self.method.observe_loss(step, row["loss"])
        self.state.history.append(row)
        self.metrics.append(row)
        self.log(describe(row))
        return row

    def _apply(self, change: PlanChange) -> None:
        """A new plan, or a failure, from the plan coordinator: the method takes it from the next step."""
        if change is not None:
            change.apply_to(self.method)

    def _records(self, step: int, phase: str) -> list[ActionRecord]:
        """The step's timed actions with the ratio each applied (one per accumulation batch, in order)."""
        applied = {a: iter(v) for a, v in self.hook.end_step().items()}
        none = iter(())
        return [
            ActionRecord(step, a, ms, phase, *next(applied.get(a, none), (0.0, None)), start)
            for a, ms, start in self.profiler.collect()
        ]

    def _write_meta(self, gathered: list[dict]) -> None:
        """``meta.json`` from replica 0's ranks (every replica runs the same schedule)."""
        first = {pp_rank: g for g, (replica, pp_rank) in zip(gathered, self.job.places) if replica == 0}
        self.state.meta = build_meta(
            self.info.schedule,
            self.pg.size,
            self.num_stages,
            self.info.num_microbatches,
            self.stage_to_rank,
            {r: g["order"] for r, g in first.items()},
            replicas=self.job.replicas,
            freezable_tensors={str(s): n for g in first.values() for s, n in sorted(g["tensors"].items())},
            hosts=[first[r]["host"] for r in range(self.pg.size)],
            method=self.cfg.method,
        )
        if self.job.rank == 0 and self.cfg.advanced.trace:
            TraceWriter.write_meta(self.paths.trace, self.state.meta)

    def _measure_clocks(self, step: int) -> None:
        """Measure every clock's offset to rank 0's (collective; nothing when one clock serves every rank) and
        put them in a new ``meta`` (``clock_sync``), which ``meta.json`` carries from then on and the plans
        from the next ``after_gather`` (the dict they hold is never changed under them)."""
        if self.clocks.measure(step) is None or self.state.meta is None:
            return
        self.state.meta = {**self.state.meta, "clock_sync": self.clocks.meta()}
        if self.job.rank == 0 and self.cfg.advanced.trace:
            TraceWriter.write_meta(self.paths.trace, self.state.meta)

    def gathered_val_loss(self, loss: float) -> float:
        """The validation loss as the last stage's rank of replica 0 has it (TorchTitan's other pipeline ranks
        hold -1), on every rank: a collective, like :meth:`record_validation`."""
        return float(self._of_last_stage(self.job.all_gather(float(loss))))

    def _of_last_stage(self, gathered: list):
        """The entry of the last stage's rank of replica 0 in a list gathered from every rank."""
        return gathered[self.job.places.index((0, self.stage_to_rank[-1]))]

    def record_validation(self, step: int, loss: float, accuracy: Accuracy | None = None) -> None:
        """Called by every rank after validation (collective): keeps the loss, and the held-out accuracy when
        it was scored, of the last stage's rank of replica 0 (TorchTitan's validator already reduces the loss
        over the data-parallel ranks; every replica scores the same accuracy)."""
        gathered = self.job.all_gather((float(loss), accuracy.row() if accuracy is not None else None))
        loss, acc = self._of_last_stage(gathered)
        self.state.val_curve = [v for v in self.state.val_curve if v[0] < step] + [[step, float(loss)]]
        row = {"step": step, "val_loss": float(loss)}
        if acc is not None:
            self.state.acc_curve = [a for a in self.state.acc_curve if a["step"] < step] + [{"step": step, **acc}]
            row |= acc
        self.metrics.append(row)

    # -- checkpoint ------------------------------------------------------------------------------
    def state_dict(self) -> str:
        """This rank's freezing state as JSON text (``timelyfreeze.runtime.state``; no pickle)."""
        return saved_state.pack(
            step=self.step,
            run=self._identity(),
            method=self.method.state_dict(),
            history=self.state.history,
            val_curve=self.state.val_curve,
            acc_curve=self.state.acc_curve,
            meta=self.state.meta,
            **self.plans.state_dict(),
        )

    def load_state_dict(self, text: Any, step: int) -> None:
        """Restore what ``state_dict`` saved at ``step`` (TorchTitan's restored step). A state that is not
        this run's, or whose contents do not check out, raises ``FreezeStateError`` naming what is wrong."""
        problem = None
        try:
            saved = saved_state.unpack(text, self._identity(), step, self.phases)
            try:
                self.method.load_state_dict(saved["method"])
            except Exception as e:
                raise FreezeStateError(f"the {self.cfg.method} method state does not load: {one_line(e)}") from None
            self.plans.load_state_dict(saved, saved["meta"])
        except FreezeStateError as e:
            problem = str(e)
        # every rank refuses together (one rank resuming alone would wait for the others in its first step)
        problems = [p for p in self.job.all_gather(problem) if p is not None]
        if problems:
            self.refused = True
            raise FreezeStateError(problem or problems[0])
        self.state.restore(saved)
        self.step = step

    def _identity(self) -> dict:
        ident = {
            "method": self.cfg.method,
            "schedule": self.info.schedule,
            "num_stages": self.num_stages,
            "num_microbatches": self.info.num_microbatches,
            "pp_rank": self.pg.rank,
            "pp_size": self.pg.size,
        }
        if self.job.replicas > 1:  # (a single pipeline's state keeps the identity it always had)
            ident.update(replica=self.job.replica, replicas=self.job.replicas)
        return ident

    # -- end of run --------------------------------------------------------------------------------
    def finish(self) -> dict | None:
        """Write summary.json (and the timeline PNG) on global rank 0; returns the summary there."""
        if self.writer is not None:
            self.writer.close()
        if self.step not in self._sync_at and (not self.clocks.samples or self.clocks.samples[-1]["step"] < self.step):
            self._measure_clocks(self.step)  # the last clock sample: drift over the whole run
        records = gather_records(self.writer.path if self.writer else None, self.clocks.group)
        medians = self.job.all_gather(timeline.phase_medians(self.writer.path if self.writer else None))
        compiled = self.job.all_gather(self.compile_watch.stats()) if self.compile_watch is not None else None
        if self.job.rank != 0:
            return None
        trace = _gathered_trace(self.state.meta, records, self.job.places, self.log)
        state, plans, r_max = self.state, self.plans.record_of_run(), self.plan_settings.r_max
        summary = run_summary.build(
            history=state.history,
            steady_phases=self.method.steady_phases({h["phase"] for h in state.history}),
            tokens_per_step=self.info.tokens_per_step,
            run={
                "method": self.cfg.method,
                "knob": knob_of(self.cfg),
                "schedule": self.info.schedule,
                "pp_degree": self.pg.size,
                "replicas": self.job.replicas,
                "num_stages": self.num_stages,
                "num_microbatches": self.info.num_microbatches,
                "seed": self.cfg.seed,
                "unit": self.info.unit,
            }
            | ({"r_max_per_stage": list(r_max)} if isinstance(r_max, tuple) else {})
            | ({"stop_at_val_loss": self.info.stop_at_val_loss} if self.info.stop_at_val_loss > 0 else {}),
            predicted_batch_ms=plans.predicted_batch_ms,
            val_curve=state.val_curve,
            acc_curve=state.acc_curve,
            method_summary=self.method.summary(),
            failures=plans.failures,
            replans=plans.replans,
            trace=trace,
            monitoring=plans.monitoring,
            rescales=plans.rescales,
            f_factor_dag=_plan_f_factor(trace, self.paths.plan, self.log) if trace is not None else None,
        )
        if compiled is not None:
            summary["compile"] = {k: [c[k] for c in compiled] for k in ("regions", "graphs", "graphs_after_warmup")}
        drawn = timeline.draw(
            state.meta, timeline.merge(medians), self.paths.plan, self.paths.trace, self.paths.timeline, self.log, trace
        )
        summary["paths"] = {
            "trace": str(self.paths.trace) if self.cfg.advanced.trace else None,
            "plan": str(self.paths.plan) if self.paths.plan.exists() else None,
            "timeline": drawn,
            "metrics": str(self.metrics.path),
        }
        write_json_atomically(self.paths.summary, summary)
        return summary

    def close(self) -> None:
        """Stop the method, unhook the stages, close the trace, and drop every reference to the process
        group, so that TorchTitan's ``destroy_process_group()`` really destroys it and joins its threads
        now, not during interpreter shutdown (see ``torch_fixes.release_mesh_process_groups``)."""
        self.method.close()
        self.detach_hooks()
        if self.writer is not None:
            self.writer.close()
        self.metrics.close()
        self.ctx.all_gather = None
        self.meter.close()
        self.plans.close()
        self.clocks.close()
        self.pg = self.job = None


def rows_before(history: list[dict], step: int) -> list[dict]:
    """The metrics rows of the steps before ``step``: ``history`` itself where its last row is before ``step`` (every
    new step: no pass over a list that grows with the run), else its rows before ``step`` (a resumed run doing steps
    again). ``history`` is in step order (appended step by step; a restored one is checked so: ``runtime.state``)."""
    if history and history[-1]["step"] >= step:
        return [h for h in history if h["step"] < step]
    return history


def _all_actions(meta: dict) -> list[str]:
    """Every action of ``meta.json``'s ``rank_orders``."""
    return [a for order in meta["rank_orders"].values() for a in order]


def _stage_to_rank(stages_by_rank: list[list[int]]) -> list[int]:
    """Pipeline rank of every global stage, from each rank's list of the stages it holds."""
    out = [0] * sum(len(s) for s in stages_by_rank)
    for rank, stages in enumerate(stages_by_rank):
        for s in stages:
            out[s] = rank
    return out


def _gathered_trace(meta: dict | None, records: list | None, places: list, log) -> Trace | None:
    """The whole trace on global rank 0, from every rank's records as ``clock_sync.gather_records`` brought
    them (no other rank's file is read: node-local dump folders work), for the pipeline spans, the F factor
    and the measured timeline panels; loading aligns the clocks (``planner.trace.clocks``). None without a
    trace (``[freeze.advanced] trace = false`` or no ``meta`` yet) or where the records do not check out (logged)."""
    if meta is None or records is None or any(r is None for r in records):
        return None
    try:
        return trace_from_records(meta, {place: recs for place, recs in zip(places, records)}, source="<gathered>")
    except PlannerError as e:
        log(f"[freeze] no spans or F factor: trace not read: {e}")
        return None


def _plan_f_factor(trace: Trace, plan_path, log) -> float | None:
    """``planner.timing.spans.plan_f_factor`` of the stable phase against the upper bound, over the monitoring plan's
    durations (``plan.json``) with the delays it was made with (estimated again from the trace's monitoring
    windows, as ``planning.solve`` did; the gap costs where the plan has them). None without that plan or
    where it does not fit the trace (logged: the shares then take the pooled F factor out)."""
    if not plan_path.exists():
        return None
    try:
        return plan_f_factor(trace, load_plan(plan_path))
    except (PlannerError, KeyError, ValueError) as e:
        log(f"[freeze] no F factor through the plan's DAG ({plan_path}): {e}")
        return None
