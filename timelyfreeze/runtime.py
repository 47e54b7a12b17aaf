"""The freezing runtime of one rank: method + freezing hook + profiler + trace + plan + metrics.

The trainer calls, every step: ``begin_step`` -> (pipeline batches run; the stage hooks fire) ->
``after_backward`` -> (optimizer step) -> ``end_step``. ``end_step`` gathers a few numbers over the
pipeline group (all ranks, same step), writes the trace and metrics, and at the end of lower-bound
monitoring makes the plan: every rank contributes its measurements, pipeline rank 0 solves the LP
once, and the plan is broadcast so all ranks freeze by the same plan.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from planner.fileio import write_json_atomically

from timelyfreeze import stage_hooks, state_codec
from timelyfreeze.config import PLANNED_METHODS, Freeze, Phases, knob_of
from timelyfreeze.freezing import FreezingHook
from timelyfreeze.methods.base import FreezeMethod, MethodContext, StageView
from timelyfreeze.methods.registry import method_class
from timelyfreeze.methods.timely import TimelyFreezeMethod
from timelyfreeze.profiler import ActionProfiler, ActionRecord, TraceWriter, build_meta
from timelyfreeze.stage_layout import build_stage_views
from timelyfreeze.state_codec import FreezeStateError

OUT_SUBDIR = "timelyfreeze"


class FreezeRuntime:
    def __init__(
        self,
        cfg: Freeze,
        phases: Phases,
        *,
        stages: list,
        n_layers: int,
        schedule: str,
        num_microbatches: int,
        pp_group,
        dump_folder: str,
        total_steps: int,
        tokens_per_step: int,
        get_lr,
        lr_warmup_steps: int,
        use_cuda: bool,
        log,
        tb_log=None,
    ):
        self.cfg = cfg
        self.phases = phases
        self.schedule = schedule
        self.num_microbatches = num_microbatches
        self.group = pp_group
        self.pp_rank = dist.get_rank(pp_group)
        self.pp_size = dist.get_world_size(pp_group)
        self.total_steps = total_steps
        self.tokens_per_step = tokens_per_step
        self._log = log
        self.tb_log = tb_log
        self.out_dir = Path(dump_folder) / OUT_SUBDIR
        self.trace_dir = self.out_dir / "trace"
        self.plan_path = self.out_dir / "plan.json"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        # global stage indices held by every pipeline rank -> stage_to_rank
        self.views: list[StageView] = build_stage_views(stages, n_layers)
        local = [v.stage for v in self.views]
        all_local = self.all_gather(local)
        self.num_stages = sum(len(x) for x in all_local)
        self.stage_to_rank = [0] * self.num_stages
        for r, ss in enumerate(all_local):
            for s in ss:
                self.stage_to_rank[s] = r
        self.ctx = MethodContext(
            stages=self.views,
            num_stages=self.num_stages,
            num_microbatches=num_microbatches,
            schedule=schedule,
            total_steps=total_steps,
            all_gather=self.all_gather,
            get_lr=get_lr,
            pp_rank=self.pp_rank,
            pp_size=self.pp_size,
            lr_warmup_steps=lr_warmup_steps,
            extras={"phases": phases, "last_loss": None},
        )
        self.method: FreezeMethod = method_class(cfg.method)(cfg, self.ctx)
        self.step = 0
        self.profiler = ActionProfiler(self.pp_rank, use_cuda=use_cuda)
        self.accum = 0
        """Gradient-accumulation batch of the current step (0-based), set by ``begin_batch``."""
        self.hook = FreezingHook(self.views, self.method, lambda: self.step, lambda: self.accum)
        self._stages = stages
        self._uninstall: list = []
        self.attach_hooks()
        self.trainable = {v.stage: sum(p.numel() for p in v.params.values()) for v in self.views}
        self.total_trainable = sum(self.all_gather(sum(self.trainable.values())))
        self.writer: TraceWriter | None = None
        self.meta: dict | None = None
        self.monitor_records: list[dict] = []  # this rank's upper/lower records (for the plan)
        self.plan_batch_ms: dict[str, float] | None = None
        self.history: list[dict] = []  # per-step metrics (identical on every rank)
        self.val_curve: list[list[float]] = []
        self._batch_s = 0.0
        self._step_t0 = 0.0
        self._losses: list[float] = []
        self.failures: list[str] = []
        """Problems the run survived (e.g. no plan): reported in the summary, and a sweep marks the job failed."""
        if cfg.plan and isinstance(self.method, TimelyFreezeMethod):
            self._install_given_plan(cfg.plan)

    def log(self, msg: str) -> None:
        if self.pp_rank == 0:
            self._log(msg)

    def attach_hooks(self) -> None:
        if not self._uninstall:
            self._uninstall = [stage_hooks.install(st, [self.hook, self.profiler]) for st in self._stages]

    def detach_hooks(self) -> None:
        """Remove the stage hooks (plain TorchTitan compute; used by the overhead benchmark)."""
        for u in self._uninstall:
            u()
        self._uninstall = []

    # -- process group -------------------------------------------------------------------------
    def all_gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def _broadcast(self, obj: Any) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, group_src=0, group=self.group)
        return box[0]

    # -- per step --------------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        if self.writer is None and self.cfg.trace:
            self.writer = TraceWriter(self.trace_dir, self.pp_rank, resume_step=step - 1)
            if step > 1:
                self.history = [h for h in self.history if h["step"] < step]
        self.step = step
        self.accum = 0
        self._batch_s = 0.0
        self._losses = []
        self.profiler.reset_order()
        self.method.begin_step(step)
        self._step_t0 = time.perf_counter()

    def begin_batch(self, index: int) -> None:
        """Gradient-accumulation batch ``index`` (0-based) of the step starts: methods draw fresh masks."""
        self.accum = index

    def add_batch(self, seconds: float, loss: Any | None) -> None:
        """One pipeline batch (``schedule.step`` call) finished: its wall time and local loss (a float or a
        0-d tensor, read once at the end of the step)."""
        self._batch_s += seconds
        if loss is not None:
            self._losses.append(loss)

    def after_backward(self, step: int) -> None:
        self.method.after_backward(step)

    def end_step(self, step: int) -> dict:
        """After the optimizer step. Collective over the pipeline group."""
        self.method.after_optimizer_step(step)
        step_s = time.perf_counter() - self._step_t0
        phase = self.method.phase(step)
        applied = self.hook.end_step()
        pending = {a: list(v) for a, v in applied.items()}
        records = [
            ActionRecord(step, a, ms, phase, *(pending[a].pop(0) if pending.get(a) else (0.0, None)))
            for a, ms in self.profiler.collect()
        ]
        if self.writer is not None:
            self.writer.write(records)
        if phase in ("upper", "lower"):
            self.monitor_records.extend(r.to_json() for r in records)
        batches = max(1, self.accum + 1)
        frozen = sum(r * self.trainable[int(_stage_of(a))] for a, rs in applied.items() for r, _ in rs) / batches
        loss = sum(float(x) for x in self._losses) if self._losses else None
        gathered = self.all_gather(
            {"order": list(self.profiler.order), "frozen": frozen, "batch_s": self._batch_s,
             "step_s": step_s, "loss": loss, "tensors": self.hook.freezable_tensors() if self.meta is None else None}
        )
        if self.meta is None:
            self.meta = build_meta(
                self.schedule, self.pp_size, self.num_stages, self.num_microbatches, self.stage_to_rank,
                {r: g["order"] for r, g in enumerate(gathered)},
                freezable_tensors={str(s): n for g in gathered for s, n in sorted(g["tensors"].items())},
                method=self.cfg.method,
            )
            if self.pp_rank == 0 and self.cfg.trace:
                TraceWriter.write_meta(self.trace_dir, self.meta)
        if isinstance(self.method, TimelyFreezeMethod) and self.method.needs_plan(step):
            self._make_plan()
        losses = [g["loss"] for g in gathered if g["loss"] is not None]
        batch_s = max(g["batch_s"] for g in gathered)
        step_s = max(g["step_s"] for g in gathered)
        denom = self.total_trainable * self.num_microbatches
        row = {
            "step": step,
            "phase": phase,
            "freeze_ratio": sum(g["frozen"] for g in gathered) / denom if denom else 0.0,
            "step_ms": step_s * 1e3,
            "batch_ms": batch_s * 1e3,
            "tokens_per_s": self.tokens_per_step / step_s if step_s > 0 else None,
            "loss": losses[0] if losses else None,
            "predicted_batch_ms": self.plan_batch_ms["planned"] if self.plan_batch_ms else None,
        }
        self.ctx.extras["last_loss"] = row["loss"]
        self.history.append(row)
        if self.pp_rank == 0:
            self._append_metrics(row)
        if self.tb_log is not None:
            self.tb_log({f"timelyfreeze/{k}": v for k, v in row.items()
                         if isinstance(v, (int, float)) and k != "step"}, step)
        pred = f" predicted {row['predicted_batch_ms']:.1f} ms" if row["predicted_batch_ms"] else ""
        self.log(
            f"[freeze] step {step} {phase}: freeze ratio {row['freeze_ratio']:.3f}, "
            f"batch {row['batch_ms']:.1f} ms{pred}, step {row['step_ms']:.1f} ms"
        )
        return row

    def record_validation(self, step: int, loss: float) -> None:
        """Called by every rank after validation (collective): keeps the loss of the last stage's rank."""
        loss = self.all_gather(float(loss))[self.stage_to_rank[-1]]
        self.val_curve = [v for v in self.val_curve if v[0] < step] + [[step, float(loss)]]
        if self.pp_rank == 0:
            self._append_metrics({"step": step, "val_loss": float(loss)})

    def _append_metrics(self, row: dict) -> None:
        path = self.out_dir / "metrics.jsonl"
        if not getattr(self, "_metrics_ready", False):
            self._metrics_ready = True
            first = row["step"]
            if path.exists() and first > 1:
                keep = [l for l in path.read_text().splitlines(True) if _safe_step(l) < first]
                path.write_text("".join(keep))
            elif path.exists():
                path.unlink()
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    # -- plan ------------------------------------------------------------------------------------
    def _make_plan(self) -> None:
        t0 = time.perf_counter()
        gathered = _gather_to_zero(self.monitor_records, self.group)
        result = None
        if self.pp_rank == 0:
            try:
                from planner.plan import make_plan, plan_summary, write_plan
                from planner.trace import node_weights, trace_from_records

                by_rank = {r: recs for r, recs in enumerate(gathered)}
                trace = trace_from_records(self.meta, by_rank, source=str(self.trace_dir))
                plan = make_plan(trace.meta, node_weights(trace), self.cfg.r_max, solver=self.cfg.solver)
                write_plan(plan, self.plan_path)
                ratios = {a: ap.freeze_ratio for a, ap in plan.actions.items()}
                result = {"ratios": ratios, "batch_time_ms": dict(plan.batch_time_ms),
                          "summary": plan_summary(plan, trace.meta)}
            except Exception as e:  # the LP must never take training down
                result = {"failure": f"planning failed: {_one_line(e)}"}
        result = self._broadcast(result)
        if "failure" in result:
            self.method.set_plan(None, result["failure"])
            self.failures.append(f"{result['failure']} (step {self.step}); the run trained on without freezing")
            self.log(f"[freeze] ERROR {result['failure']}; training continues without freezing")
            return
        self.method.set_plan(result["ratios"])
        self.plan_batch_ms = result["batch_time_ms"]
        if self.pp_rank == 0:
            self.log(f"[freeze] plan written to {self.plan_path} ({time.perf_counter() - t0:.2f} s)\n"
                     + result["summary"])

    def _install_given_plan(self, path: str) -> None:
        from planner.plan import check_plan_matches, load_plan

        from planner.errors import PlannerError

        from timelyfreeze.config import FreezeConfigError

        try:
            plan = load_plan(path)
            check_plan_matches(plan, self.schedule, self.num_stages, self.num_microbatches, path)
        except PlannerError as e:
            raise FreezeConfigError(f"[freeze] plan: {e}") from None
        self.method.set_plan({a: ap.freeze_ratio for a, ap in plan.actions.items()})
        self.plan_batch_ms = dict(plan.batch_time_ms)

    # -- checkpoint ------------------------------------------------------------------------------
    def state_dict(self) -> str:
        """This rank's freezing state as JSON text (``timelyfreeze.state_codec``; no pickle)."""
        return state_codec.encode({
            "format": state_codec.STATE_FORMAT,
            "step": self.step,
            "run": self._identity(),
            "method": self.method.state_dict(),
            "monitor_records": self.monitor_records,
            "plan_batch_ms": self.plan_batch_ms,
            "history": self.history,
            "val_curve": self.val_curve,
            "meta": self.meta,
            "failures": self.failures,
        })

    def load_state_dict(self, text: Any, step: int) -> None:
        """Restore what ``state_dict`` saved at ``step`` (TorchTitan's restored step). A state that is not
        this run's, or whose contents do not check out, raises ``FreezeStateError`` naming what is wrong."""
        st = state_codec.decode(text)
        _check_state(st, self._identity(), step)
        for rec in st["monitor_records"]:
            if self.phases.phase(rec["step"]) != rec["phase"]:
                raise FreezeStateError(
                    f"saved freezing state: a {rec['phase']} measurement of step {rec['step']}, which is in the "
                    f"{self.phases.phase(rec['step'])} phase of this run's [freeze] settings (changed since the checkpoint?)")
        try:
            self.method.load_state_dict(st["method"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise FreezeStateError(f"the {self.cfg.method} method state does not load: {_one_line(e)}") from None
        self.monitor_records = st["monitor_records"]
        self.plan_batch_ms = st["plan_batch_ms"]
        self.history = st["history"]
        self.val_curve = st["val_curve"]
        self.meta = st["meta"]
        self.failures = st["failures"]
        self.step = step

    def _identity(self) -> dict:
        return {"method": self.cfg.method, "schedule": self.schedule, "num_stages": self.num_stages,
                "num_microbatches": self.num_microbatches, "pp_rank": self.pp_rank, "pp_size": self.pp_size}

    # -- end of run --------------------------------------------------------------------------------
    def finish(self) -> dict | None:
        """Write summary.json (and the timeline PNG) on pipeline rank 0; returns the summary there."""
        if self.writer is not None:
            self.writer.close()
        medians = self._phase_medians()
        gathered = self.all_gather(medians)
        if self.pp_rank != 0:
            return None
        merged: dict[str, dict[str, float]] = {}
        for g in gathered:
            for phase, d in g.items():
                merged.setdefault(phase, {}).update(d)
        summary = self._summary()
        timeline = self._timeline(merged)
        summary["paths"] = {
            "trace": str(self.trace_dir) if self.cfg.trace else None,
            "plan": str(self.plan_path) if self.plan_path.exists() else None,
            "timeline": timeline,
            "metrics": str(self.out_dir / "metrics.jsonl"),
        }
        write_json_atomically(self.out_dir / "summary.json", summary)
        return summary

    def _phase_medians(self) -> dict[str, dict[str, float]]:
        """From this rank's trace file: median ms per action in the upper and stable phases, and the
        mean applied freeze ratio per action in the stable phase (key ``stable_ratio``)."""
        ms: dict[str, dict[str, list[float]]] = {}
        ratio: dict[str, list[float]] = {}
        if not self.cfg.trace or self.writer is None or not self.writer.path.exists():
            return {}
        with open(self.writer.path, encoding="utf-8") as f:
            for line in f:
                r = json.loads(line)
                if r["phase"] in ("upper", "stable"):
                    ms.setdefault(r["phase"], {}).setdefault(r["action"], []).append(r["ms"])
                if r["phase"] == "stable":
                    ratio.setdefault(r["action"], []).append(r["freeze_ratio"])
        out = {p: {a: statistics.median(v) for a, v in d.items()} for p, d in ms.items()}
        if ratio:
            out["stable_ratio"] = {a: statistics.fmean(v) for a, v in ratio.items()}
        return out

    def _summary(self) -> dict:
        hist = sorted(self.history, key=lambda h: h["step"])
        ranges: dict[str, list[int]] = {}
        for h in hist:
            rng = ranges.setdefault(h["phase"], [h["step"], h["step"]])
            rng[1] = h["step"]
        steady = self._steady_phase()

        def tps(rows):
            t = sum(r["step_ms"] for r in rows) / 1e3
            return self.tokens_per_step * len(rows) / t if rows and t > 0 else None

        by_phase: dict[str, list[dict]] = {}
        for h in hist:
            by_phase.setdefault(h["phase"], []).append(h)
        steady_rows = [h for h in hist if h["phase"] in steady]
        knob = knob_of(self.cfg)
        losses = [[h["step"], h["loss"]] for h in hist if h["loss"] is not None]
        return {
            "format": "timelyfreeze-run/1",
            "method": self.cfg.method,
            "knob": knob,
            "schedule": self.schedule,
            "pp_degree": self.pp_size,
            "num_stages": self.num_stages,
            "num_microbatches": self.num_microbatches,
            "seed": self.cfg.seed,
            "steps": len(hist),
            "tokens_per_step": self.tokens_per_step,
            "phases": ranges,
            "tokens_per_s": {"all": tps(hist), "stable": tps(steady_rows)},
            "mean_batch_ms": {p: statistics.fmean(r["batch_ms"] for r in rows) for p, rows in by_phase.items()}
            | {"all": statistics.fmean(h["batch_ms"] for h in hist) if hist else None},
            "predicted_batch_ms": self.plan_batch_ms,
            "avg_freeze_ratio": statistics.fmean(h["freeze_ratio"] for h in hist) if hist else 0.0,
            "final_loss": losses[-1][1] if losses else None,
            "val_loss": self.val_curve[-1][1] if self.val_curve else None,
            "loss_curve": losses,
            "val_curve": self.val_curve,
            "method_summary": self.method.summary(),
            "failures": list(self.failures),
        }

    def _steady_phase(self) -> tuple[str, ...]:
        if self.cfg.method in PLANNED_METHODS:
            return ("stable",)
        return tuple({h["phase"] for h in self.history} - {"warmup", "bootstrap", "upper", "lower"})

    def _timeline(self, medians: dict[str, dict[str, float]]) -> str | None:
        if self.meta is None or "upper" not in medians:
            return None
        try:
            from planner.gantt import plot_timeline
            from planner.trace import validate_meta

            meta = validate_meta(self.meta, str(self.trace_dir))
            panels = [("measured, nothing frozen (upper bound)", medians["upper"])]
            ratios: list = [None]
            if self.plan_path.exists():
                from planner.plan import load_plan

                plan = load_plan(self.plan_path)
                panels.append((f"planned (r_max {plan.r_max})", {a: ap.duration for a, ap in plan.actions.items()}))
                ratios.append({a: ap.freeze_ratio for a, ap in plan.actions.items()})
            if "stable" in medians and len(medians["stable"]) == len(medians["upper"]):
                panels.append(("measured, stable phase (mean applied ratios)", medians["stable"]))
                ratios.append(medians.get("stable_ratio"))
            out = self.out_dir / "timeline.png"
            plot_timeline(meta, panels, out, ratios=ratios)
            return str(out)
        except Exception as e:  # a plot must never fail a finished run
            self.log(f"[freeze] timeline not drawn: {type(e).__name__}: {e}")
            return None

    def close(self) -> None:
        close_method = getattr(self.method, "close", None)
        if callable(close_method):
            close_method()
        self.detach_hooks()
        if self.writer is not None:
            self.writer.close()


def _stage_of(action: str) -> str:
    i = 0
    while action[i].isdigit():
        i += 1
    return action[:i]


def _one_line(e: Exception) -> str:
    from planner.errors import PlannerError

    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return msg if isinstance(e, PlannerError) else f"{type(e).__name__}: {msg}"


def _safe_step(line: str) -> int:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return 1 << 60


def _gather_to_zero(obj: Any, group) -> list[Any] | None:
    rank = dist.get_rank(group)
    out = [None] * dist.get_world_size(group) if rank == 0 else None
    dist.gather_object(obj, out, group_dst=0, group=group)
    return out


_RECORD_TYPES = {"step": int, "action": str, "ms": (int, float), "phase": str, "freeze_ratio": (int, float)}


def _check_state(st: Any, identity: dict, step: int) -> None:
    """Structure and consistency of a decoded freezing state (see ``FreezeRuntime.state_dict``)."""
    def fail(msg: str):
        raise FreezeStateError(f"saved freezing state: {msg}")

    if not isinstance(st, dict):
        fail("not an object")
    if st.get("format") != state_codec.STATE_FORMAT:
        fail(f"format {st.get('format')!r}, expected {state_codec.STATE_FORMAT!r}")
    fields = {"step": int, "run": dict, "method": dict, "monitor_records": list, "plan_batch_ms": (dict, type(None)),
              "history": list, "val_curve": list, "meta": (dict, type(None)), "failures": list}
    for name, typ in fields.items():
        if name not in st:
            fail(f"field {name!r} is missing")
        if not isinstance(st[name], typ) or isinstance(st[name], bool):
            fail(f"field {name!r} has the wrong type ({type(st[name]).__name__})")
    for k, v in identity.items():
        if st["run"].get(k) != v:
            fail(f"saved by a run with {k} = {st['run'].get(k)!r}, this run has {v!r}")
    if st["step"] != step:
        fail(f"saved at step {st['step']}, but the checkpoint restores step {step}")
    for i, rec in enumerate(st["monitor_records"]):
        if not isinstance(rec, dict) or any(not isinstance(rec.get(f), t) or isinstance(rec.get(f), bool)
                                            for f, t in _RECORD_TYPES.items()):
            fail(f"monitor_records[{i}] is not a trace record ({', '.join(_RECORD_TYPES)})")
        if rec["phase"] not in ("upper", "lower") or not 1 <= rec["step"] <= step or not math.isfinite(rec["ms"]):
            fail(f"monitor_records[{i}] = {rec}: must be an upper/lower record of a step <= {step} with finite ms")
    steps = []
    for i, row in enumerate(st["history"]):
        if not isinstance(row, dict) or not isinstance(row.get("step"), int) or not isinstance(row.get("phase"), str):
            fail(f"history[{i}] needs an integer step and a phase")
        steps.append(row["step"])
    if steps != list(range(1, len(steps) + 1)) or len(steps) > step:
        fail(f"history covers steps {steps[:3]}...{steps[-3:]}, expected 1..{step} in order")
    for i, v in enumerate(st["val_curve"]):
        if not (isinstance(v, list) and len(v) == 2 and isinstance(v[0], int) and isinstance(v[1], (int, float))):
            fail(f"val_curve[{i}] must be [step, loss]")
    if st["plan_batch_ms"] is not None and not all(
            isinstance(v, (int, float)) and math.isfinite(v) for v in st["plan_batch_ms"].values()):
        fail("plan_batch_ms must map names to finite numbers")
    if not all(isinstance(f, str) for f in st["failures"]):
        fail("failures must be strings")
