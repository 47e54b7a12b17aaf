"""The freezing runtime of one rank: it wires the method, the freezing hook, the profiler, the trace,
the plan step, the metrics and the checkpointed state together. Each of those lives in its own module;
this one only says when each runs.

The trainer calls, every step: ``begin_step`` -> for every gradient-accumulation batch ``begin_batch``,
(the pipeline runs; the stage hooks fire), ``add_batch`` -> ``after_backward`` -> (optimizer step) ->
``end_step``. ``end_step`` gathers a few numbers over the whole job (every rank, same step), writes the trace and
metrics, and when the method asks for a plan (``FreezeMethod.needs_plan``) makes it: every rank of every
data-parallel replica of the pipeline contributes its measurements, global rank 0 solves the LP once on
their combination (per action, the maximum over replicas: ``planner.trace.node_weights``), and the plan
is broadcast so every rank of every replica freezes by the same plan. The masks a plan implies depend
only on (seed, step, stage, microbatch, accumulation batch), so the replicas of a stage (FSDP's shard
and replicate groups, TP's group) leave out the same tensors in every microbatch. In the stable phase,
each rank's per-stage drift scales ride along in the same per-step gather, and when the plan stops
matching the measurements a re-plan is made the same way (``timelyfreeze.replan``).
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from planner.actions import parse_action
from planner.drift import max_scales
from planner.fileio import write_json_atomically

from timelyfreeze import freeze_state, planning, stage_hooks, summary as run_summary, timeline
from timelyfreeze.compile_watch import CompileWatch
from timelyfreeze.config import Freeze, knob_of
from timelyfreeze.phases import Phases
from timelyfreeze.freezing import FreezingHook
from timelyfreeze.methods.base import FreezeMethod, MethodContext, StageView
from timelyfreeze.methods.registry import method_class
from timelyfreeze.metrics_log import MetricsLog
from timelyfreeze.pipeline_group import JobGroup
from timelyfreeze.profiler import ActionProfiler, ActionRecord, TraceWriter, build_meta
from timelyfreeze.replan import Replanner
from timelyfreeze.stage_layout import build_stage_views
from timelyfreeze.state_codec import FreezeStateError

OUT_SUBDIR = "timelyfreeze"


@dataclass(frozen=True)
class RunInfo:
    """What the trainer knows about the job and the freezing runtime needs."""

    schedule: str
    num_microbatches: int
    total_steps: int
    tokens_per_step: int
    """Tokens one optimizer step trains on (all accumulation batches, all data-parallel ranks)."""
    lr_warmup_steps: int
    dump_folder: str
    n_layers: int
    use_cuda: bool
    dp_degree: int = 1
    """Data-parallel degree (TorchTitan's "batch" mesh): replicas that train on different samples.
    Replicas beyond it (tensor parallelism) compute the same loss."""
    unit: str = "tensor"
    """The freezing unit in force (``[freeze] unit`` resolved: ``tensor`` or ``block``)."""
    compiled: bool = False
    """The model's transformer blocks run under ``torch.compile``."""


class FreezeRuntime:
    def __init__(self, cfg: Freeze, phases: Phases, info: RunInfo, stages: list, pp_group, *,
                 get_lr: Callable[[], float], log: Callable[[str], None],
                 tb_log: Callable[[dict, int], None] | None = None, pairs: dict[str, str] | None = None):
        """``pairs``: ``stage_hooks.overlap_pairs`` of the schedule (DualPipeV's OVERLAP_F_B parts), so the
        profiler and the freezing hook name and time each pair as one action."""
        self.cfg, self.phases, self.info = cfg, phases, info
        self.job = JobGroup(pp_group)
        self.pg = self.job.pipeline
        self._log = log
        self.out_dir = Path(info.dump_folder) / OUT_SUBDIR
        self.trace_dir = self.out_dir / "trace"
        self.plan_path = self.out_dir / "plan.json"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.views: list[StageView] = build_stage_views(stages, info.n_layers, unit=info.unit)
        self.stage_to_rank = _stage_to_rank(self.pg.all_gather([v.stage for v in self.views]))
        self.num_stages = len(self.stage_to_rank)
        self.r_max = self._budgets()
        """``[freeze] r_max``, or the per-stage tuple of ``r_max_per_stage``, as the planner takes it."""
        self.ctx = MethodContext(
            stages=self.views, num_stages=self.num_stages, num_microbatches=info.num_microbatches,
            schedule=info.schedule, total_steps=info.total_steps, all_gather=self.pg.all_gather, get_lr=get_lr,
            pp_rank=self.pg.rank, pp_size=self.pg.size, lr_warmup_steps=info.lr_warmup_steps,
            compiled=info.compiled, extras={"phases": phases, "last_loss": None},
        )
        self.method: FreezeMethod = method_class(cfg.method)(cfg, self.ctx)
        self.compile_watch = CompileWatch(phases.warmup_end, [v.module for v in self.views]) if info.compiled else None
        self.step = 0
        self.accum = 0
        """Gradient-accumulation batch of the current step (0-based), set by ``begin_batch``."""
        self.profiler = ActionProfiler(self.pg.rank, use_cuda=info.use_cuda, pairs=pairs)
        self.hook = FreezingHook(self.views, self.method, lambda: self.step, lambda: self.accum, pairs=pairs)
        self._stages = stages
        self._hooks_on = False
        self.attach_hooks()
        self.trainable = {v.stage: sum(p.numel() for p in v.params.values()) for v in self.views}
        self.total_trainable = sum(self.pg.all_gather(sum(self.trainable.values())))
        self.metrics = MetricsLog(self.out_dir / "metrics.jsonl", write=self.job.rank == 0, tb_log=tb_log)
        self.writer: TraceWriter | None = None
        # -- the state a checkpoint carries (freeze_state.FIELDS) --
        self.meta: dict | None = None
        self.monitor_records: list[dict] = []
        """This rank's records of the phases the method's plan is made from."""
        self.plan_batch_ms: dict[str, float] | None = None
        """The first plan's predicted batch times (``plan.json``: from monitoring, or the given plan)."""
        self.replanner: Replanner | None = None
        """Online re-planning (``[freeze] replan``): the plan in force and its drift; None before a plan."""
        self._pending_plan: dict | None = None
        """A given plan waiting for ``meta`` (the end of step 1) before its replanner can be built."""
        self.history: list[dict] = []
        """Per-step metrics rows (identical on every rank)."""
        self.val_curve: list[list[float]] = []
        self.failures: list[str] = []
        """Problems the run survived (e.g. no plan): reported in the summary; a sweep marks the job failed."""
        self.refused = False
        """True once a checkpoint's freezing state was refused: the run ends without a summary."""
        self._batch_s = 0.0
        self._step_t0 = 0.0
        self._step_lr = 0.0
        self._losses: list[Any] = []
        if cfg.plan:
            given = planning.load_given(cfg.plan, info.schedule, self.num_stages, info.num_microbatches)
            self.plan_batch_ms = given["batch_time_ms"]
            self.method.set_plan(given["ratios"])
            self._pending_plan = given

    def log(self, msg: str) -> None:
        if self.job.rank == 0:
            self._log(msg)

    def attach_hooks(self) -> None:
        if not self._hooks_on:
            for st in self._stages:
                stage_hooks.install(st, [self.hook, self.profiler])
            self._hooks_on = True

    def detach_hooks(self) -> None:
        """Remove the stage hooks (plain compute; used by the overhead benchmark)."""
        for st in self._stages:
            stage_hooks.uninstall(st)
        self._hooks_on = False

    # -- per step --------------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        if self.writer is None and self.cfg.trace:
            self.writer = TraceWriter(self.trace_dir, self.pg.rank, replica=self.job.replica, resume_step=step - 1)
        self.history = [h for h in self.history if h["step"] < step]
        self.step = step
        self.accum = 0
        self._batch_s = 0.0
        self._losses = []
        self.profiler.reset_order()
        self.method.begin_step(step)
        self._step_lr = float(self.ctx.get_lr())  # the LR this step's optimizer update uses
        self._step_t0 = time.perf_counter()

    def begin_batch(self, index: int) -> None:
        """Gradient-accumulation batch ``index`` (0-based) of the step starts: methods draw fresh masks."""
        self.accum = index

    def add_batch(self, seconds: float, loss: Any | None) -> None:
        """One pipeline batch (``schedule.step`` call) finished: its wall time and local loss (a float or a
        0-d tensor, read once at the end of the step: no host synchronisation per batch on CUDA)."""
        self._batch_s += seconds
        if loss is not None:
            self._losses.append(loss)

    def after_backward(self, step: int) -> None:
        self.method.after_backward(step)

    def end_step(self, step: int) -> dict:
        """After the optimizer step. Collective over the pipeline group."""
        self.method.after_optimizer_step(step)
        if self.compile_watch is not None:
            self.compile_watch.end_step(step)
        step_s = time.perf_counter() - self._step_t0
        phase = self.method.phase(step)
        records = self._records(step, phase)
        if self.writer is not None:
            self.writer.write(records)
        if phase in self.method.monitor_phases:
            self.monitor_records.extend(r.to_json() for r in records)
        frozen = sum(r.freeze_ratio * self.trainable[parse_action(r.action).stage] for r in records)
        frozen /= max(1, self.accum + 1)
        watch = phase == "stable" and self.replanner is not None
        gathered = self.job.all_gather({
            "order": list(self.profiler.order), "frozen": frozen, "batch_s": self._batch_s, "step_s": step_s,
            "loss": sum(float(x) for x in self._losses) if self._losses else None,
            "tensors": self.hook.freezable_tensors() if self.meta is None else None,
            "host": socket.gethostname() if self.meta is None else None,
            "scales": self.replanner.local_scales([(r.action, r.ms, r.freeze_ratio) for r in records])
            if watch else None,
        })
        if self.meta is None:
            self._write_meta(gathered)
        if self._pending_plan is not None:
            self._start_replanner(self._pending_plan)
        if self.method.needs_plan(step):
            self._make_plan()
        replicas = self.job.replicas
        losses = [g["loss"] for g in gathered if g["loss"] is not None]
        # TorchTitan's loss is each rank's token-loss sum over the *global* token count: the job's loss is
        # the sum over data-parallel replicas (tensor-parallel copies hold the same value: averaged out)
        loss = sum(losses) * self.info.dp_degree / replicas if losses else None
        step_s = max(g["step_s"] for g in gathered)
        batch_s = [max(g["batch_s"] for g, place in zip(gathered, self.job.places) if place[0] == d)
                   for d in range(replicas)]
        denom = self.total_trainable * self.info.num_microbatches * replicas
        row = {
            "step": step,
            "phase": phase,
            "freeze_ratio": sum(g["frozen"] for g in gathered) / denom if denom else 0.0,
            "step_ms": step_s * 1e3,
            "batch_ms": max(batch_s) * 1e3,
            "tokens_per_s": self.info.tokens_per_step / step_s if step_s > 0 else None,
            "loss": loss,
            "predicted_batch_ms": self._predicted_ms(),
            "lr": self._step_lr,
        }
        if replicas > 1:
            row["replica_batch_ms"] = [round(b * 1e3, 3) for b in batch_s]
        if watch:
            row["drift"] = self.replanner.observe(max_scales(g["scales"] for g in gathered))
            if self.replanner.due():
                self._replan(step, row)
        if self.replanner is not None:
            row["replans"] = len(self.replanner.events)
        self.ctx.extras["last_loss"] = row["loss"]
        self.history.append(row)
        self.metrics.append(row)
        pred = f" predicted {row['predicted_batch_ms']:.1f} ms" if row["predicted_batch_ms"] else ""
        self.log(f"[freeze] step {step} {phase}: freeze ratio {row['freeze_ratio']:.3f}, "
                 f"batch {row['batch_ms']:.1f} ms{pred}, step {row['step_ms']:.1f} ms")
        return row

    def _records(self, step: int, phase: str) -> list[ActionRecord]:
        """The step's timed actions with the ratio each applied (one per accumulation batch, in order)."""
        applied = {a: list(v) for a, v in self.hook.end_step().items()}
        return [ActionRecord(step, a, ms, phase, *(applied[a].pop(0) if applied.get(a) else (0.0, None)), start)
                for a, ms, start in self.profiler.collect()]

    def _write_meta(self, gathered: list[dict]) -> None:
        """``meta.json`` from replica 0's ranks (every replica runs the same schedule)."""
        first = {pp_rank: g for g, (replica, pp_rank) in zip(gathered, self.job.places) if replica == 0}
        self.meta = build_meta(
            self.info.schedule, self.pg.size, self.num_stages, self.info.num_microbatches, self.stage_to_rank,
            {r: g["order"] for r, g in first.items()},
            replicas=self.job.replicas,
            freezable_tensors={str(s): n for g in first.values() for s, n in sorted(g["tensors"].items())},
            hosts=[first[r]["host"] for r in range(self.pg.size)],
            method=self.cfg.method,
        )
        if self.job.rank == 0 and self.cfg.trace:
            TraceWriter.write_meta(self.trace_dir, self.meta)

    def record_validation(self, step: int, loss: float) -> None:
        """Called by every rank after validation (collective): keeps the loss of the last stage's rank of
        replica 0 (TorchTitan's validator already reduces it over the data-parallel ranks)."""
        losses = self.job.all_gather(float(loss))
        loss = float(losses[self.job.places.index((0, self.stage_to_rank[-1]))])
        self.val_curve = [v for v in self.val_curve if v[0] < step] + [[step, loss]]
        self.metrics.append({"step": step, "val_loss": loss})

    # -- plan ------------------------------------------------------------------------------------
    def _budgets(self) -> float | tuple[float, ...]:
        from planner.budget import check_r_max
        from planner.errors import PlannerError

        from timelyfreeze.config import FreezeConfigError

        if not self.cfg.r_max_per_stage:
            return float(self.cfg.r_max)
        try:
            return check_r_max(list(self.cfg.r_max_per_stage), self.num_stages, "[freeze] r_max_per_stage")
        except PlannerError as e:
            raise FreezeConfigError(str(e)) from None

    def _predicted_ms(self) -> float | None:
        """The plan in force's predicted batch time."""
        if self.replanner is not None and self.replanner.batch_ms:
            return self.replanner.batch_ms["planned"]
        return self.plan_batch_ms["planned"] if self.plan_batch_ms else None

    def _start_replanner(self, result: dict) -> None:
        """Watch the plan ``result`` (``planning.plan_result``) for drift, where re-planning is on."""
        self._pending_plan = None
        self.replanner = Replanner.for_run(self.cfg, self.meta)
        if self.replanner is not None:
            self.replanner.install(result["weights"], result["ratios"], result["batch_time_ms"], result["edge_ms"])

    def _replan(self, step: int, row: dict) -> None:
        """Re-plan after ``step`` (every rank, collective): from the current node weights rescaled by the
        drifting steps' median scales; the new plan applies from the next step."""
        rp = self.replanner
        weights, scales = rp.proposed_weights()
        old = rp.batch_ms["planned"]
        reason = (f"median drift {rp.window_drift():+.1%} over the last {rp.patience} stable step"
                  f"{'s' if rp.patience > 1 else ''} (beyond {rp.threshold:.0%})")
        path = self.out_dir / "replans" / f"plan_step{step}.json"
        result = None
        if self.job.rank == 0:
            result = planning.replan(self.meta, weights, self.r_max, self.cfg.solver, path,
                                     {"replanned_at_step": step, "reason": reason, "scales": scales,
                                      "estimator": "rescaled"}, rp.edge_ms)
        result = self.job.broadcast(result)
        if "failure" in result:
            rp.window = []
            self.failures.append(f"{result['failure']} (step {step}); the run kept the plan in force")
            self.log(f"[freeze] ERROR {result['failure']}; the plan in force stays")
            return
        self.method.set_plan(result["ratios"])
        rp.install(result["weights"], result["ratios"], result["batch_time_ms"], result["edge_ms"])
        new = result["batch_time_ms"]["planned"]
        event = {"step": step, "reason": reason, "scales": scales, "old_planned_ms": old,
                 "new_planned_ms": new, "plan": str(path)}
        rp.events.append(event)
        row["replan"] = event
        self.log(f"[freeze] re-plan after step {step}: {reason}; predicted batch {old:.1f} -> {new:.1f} ms "
                 f"(scales {', '.join(f'{g} x{s:.2f}' for g, s in scales.items())}); {path}")

    def _make_plan(self) -> None:
        t0 = time.perf_counter()
        gathered = self.job.gather_to_zero(self.monitor_records)
        result = None
        if self.job.rank == 0:
            result = planning.solve(self.meta, gathered, self.r_max, self.cfg.solver,
                                    self.trace_dir, self.plan_path, self.cfg.estimator)
        result = self.job.broadcast(result)
        if "failure" in result:
            self.method.set_plan(None, result["failure"])
            self.failures.append(f"{result['failure']} (step {self.step}); the run trained on without freezing")
            self.log(f"[freeze] ERROR {result['failure']}; training continues without freezing")
            return
        self.method.set_plan(result["ratios"])
        self.plan_batch_ms = result["batch_time_ms"]
        self._start_replanner(result)
        self.log(f"[freeze] plan written to {self.plan_path} ({time.perf_counter() - t0:.2f} s)\n"
                 + result["summary"])

    # -- checkpoint ------------------------------------------------------------------------------
    def state_dict(self) -> str:
        """This rank's freezing state as JSON text (``timelyfreeze.freeze_state``; no pickle)."""
        return freeze_state.pack(
            step=self.step, run=self._identity(), method=self.method.state_dict(),
            monitor_records=self.monitor_records, plan_batch_ms=self.plan_batch_ms, history=self.history,
            val_curve=self.val_curve, meta=self.meta, failures=self.failures,
            replan=self.replanner.state_dict() if self.replanner is not None else None,
        )

    def load_state_dict(self, text: Any, step: int) -> None:
        """Restore what ``state_dict`` saved at ``step`` (TorchTitan's restored step). A state that is not
        this run's, or whose contents do not check out, raises ``FreezeStateError`` naming what is wrong."""
        problem = None
        try:
            st = freeze_state.unpack(text, self._identity(), step, self.phases)
            self.method.load_state_dict(st["method"])
            replanner = self._restore_replanner(st)
        except FreezeStateError as e:
            problem = str(e)
        except Exception as e:  # noqa: BLE001 -- a tampered method state: one error line, not a traceback
            problem = f"the {self.cfg.method} method state does not load: {planning.one_line(e)}"
        # every rank refuses together (one rank resuming alone would wait for the others in its first step)
        problems = [p for p in self.job.all_gather(problem) if p is not None]
        if problems:
            self.refused = True
            raise FreezeStateError(problem or problems[0])
        for name in ("monitor_records", "plan_batch_ms", "history", "val_curve", "meta", "failures"):
            setattr(self, name, st[name])
        self.replanner = replanner
        if replanner is not None:
            self._pending_plan = None
        self.step = step

    def _restore_replanner(self, st: dict) -> Replanner | None:
        """The saved re-planning state on this run's schedule (None where none was saved, or re-planning is
        off now); ``FreezeStateError`` naming what does not fit."""
        if st["replan"] is None or st["meta"] is None:
            return None
        from planner.errors import PlannerError

        try:
            rp = Replanner.for_run(self.cfg, st["meta"])
            if rp is not None:
                rp.load_state_dict(st["replan"])
        except (PlannerError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise FreezeStateError(f"saved freezing state: replan: {planning.one_line(e)}") from None
        return rp

    def _identity(self) -> dict:
        ident = {"method": self.cfg.method, "schedule": self.info.schedule, "num_stages": self.num_stages,
                 "num_microbatches": self.info.num_microbatches, "pp_rank": self.pg.rank, "pp_size": self.pg.size}
        if self.job.replicas > 1:  # (a single pipeline's state keeps the identity it always had)
            ident.update(replica=self.job.replica, replicas=self.job.replicas)
        return ident

    # -- end of run --------------------------------------------------------------------------------
    def finish(self) -> dict | None:
        """Write summary.json (and the timeline PNG) on global rank 0; returns the summary there."""
        if self.writer is not None:
            self.writer.close()
        medians = self.job.all_gather(timeline.phase_medians(self.writer.path if self.writer else None))
        compiled = self.job.all_gather(self.compile_watch.stats()) if self.compile_watch is not None else None
        if self.job.rank != 0:
            return None
        summary = run_summary.build(
            history=self.history,
            steady_phases=self.method.steady_phases({h["phase"] for h in self.history}),
            tokens_per_step=self.info.tokens_per_step,
            run={"method": self.cfg.method, "knob": knob_of(self.cfg), "schedule": self.info.schedule,
                 "pp_degree": self.pg.size, "replicas": self.job.replicas, "num_stages": self.num_stages,
                 "num_microbatches": self.info.num_microbatches, "seed": self.cfg.seed, "unit": self.info.unit}
            | ({"r_max_per_stage": list(self.r_max)} if isinstance(self.r_max, tuple) else {})
            | ({"stop_at_val_loss": self.cfg.stop_at_val_loss} if self.cfg.stop_at_val_loss > 0 else {}),
            predicted_batch_ms=self.plan_batch_ms, val_curve=self.val_curve,
            method_summary=self.method.summary(), failures=self.failures,
            replans=self.replanner.events if self.replanner is not None else [],
        )
        if compiled is not None:
            summary["compile"] = {k: [c[k] for c in compiled] for k in ("regions", "graphs", "graphs_after_warmup")}
        drawn = timeline.draw(self.meta, timeline.merge(medians), self.plan_path, self.trace_dir,
                              self.out_dir / "timeline.png", self.log)
        summary["paths"] = {
            "trace": str(self.trace_dir) if self.cfg.trace else None,
            "plan": str(self.plan_path) if self.plan_path.exists() else None,
            "timeline": drawn,
            "metrics": str(self.metrics.path),
        }
        write_json_atomically(self.out_dir / "summary.json", summary)
        return summary

    def close(self) -> None:
        """Stop the method, unhook the stages, close the trace, and drop every reference to the process
        group, so that TorchTitan's ``destroy_process_group()`` really destroys it and joins its threads
        now, not during interpreter shutdown (see ``torch_fixes.release_mesh_process_groups``)."""
        self.method.close()
        self.detach_hooks()
        if self.writer is not None:
            self.writer.close()
        self.ctx.all_gather = None
        self.pg = self.job = None


def _stage_to_rank(stages_by_rank: list[list[int]]) -> list[int]:
    """Pipeline rank of every global stage, from each rank's list of the stages it holds."""
    out = [0] * sum(len(s) for s in stages_by_rank)
    for rank, stages in enumerate(stages_by_rank):
        for s in stages:
            out[s] = rank
    return out
