"""Egeria (Wang et al., EuroSys'23) as a step-level prefix-freezing baseline for pipeline stages.

Modules are the global layers (embedding, each block, the head), ordered front to back across all stages.
Life cycle (digest 2.2-2.7):
- Bootstrapping: every n steps the relative change of the mean training loss over the last n steps is
  checked; once it is below 10% (and the common warm-up is over) knowledge-guided training starts.
- Every n steps the rank holding the frontmost active module captures ONE microbatch's stage input and
  that module's output (forward hooks; detach, fp32, to CPU) and hands them to a background thread. The
  thread runs an int8 dynamically quantised CPU copy of the stage (the reference, refreshed from a
  snapshot every W evaluations) on the same input and computes the plasticity = SP loss between the two
  activations. The training step never waits: if the thread is still busy the evaluation is skipped.
- Readings reach the decision at the next evaluation step, where all ranks exchange them (and the loss)
  with ``all_gather`` and run the same deterministic controller: smoothed plasticity (mean of the last W
  readings), |slope| of a least-squares line over the last W smoothed values, tolerance T = 20% of the
  largest |slope| of the module's first 3 slope readings; W consecutive slopes below T freeze the module
  and move on to the next. The last layer (head) is never frozen (Algorithm 1 asserts it).
- All modules unfreeze when the LR has fallen by 10x since the first module's freeze; W is halved for
  refreezing (at least 2, the fewest points a slope needs).

Choices where the paper is silent or differs from our setting (digest 2.6/7):
- Algorithm 1 freezes on the evaluation after the stale counter reached W; we freeze as soon as it does
  (one evaluation earlier).
- Sequences: the SP loss treats every token vector as a row (b = batch x seq), at most ``sp_max_rows``.
- The reference refresh counts evaluations this rank submitted (the paper says "every W iterations",
  KGT leaves it open; digest 7.12).
- The snapshot for a refresh (the stage's ``state_dict()``) is copied to CPU on the training thread
  (asynchronously into pinned memory on CUDA); the stage's CPU reference is built once, on its first
  evaluation, by ``egeria_reference.build_reference`` (a fresh module tree, no hooks, no wrappers).
- The activation cache (``[freeze.egeria] cache``, ``egeria_cache``): on the first stage, a microbatch whose
  samples come back skips the frozen prefix's forward (embedding and frozen blocks of that stage). Frozen
  layers on later stages still run their forward. Needs a dataset with sample ids (``timelyfreeze.data.epoch_data``).
- The prefix is frozen whole: on the first stage the runtime's anchor tensor is frozen with it (it would
  otherwise keep block 0 training, so the prefix's output would change and its backward would still reach
  back to block 0). With the whole first stage frozen its backward is empty.
- Which steps' readings arrive at which decision depends on the worker's speed, so runs are not
  bit-reproducible across machines; all ranks of one run always agree.

This module holds the config and the method (scheduling, exchange, checkpoint state); the parts live in
``egeria_sp_loss`` (SP loss, slope), ``egeria_controller`` (the decisions), ``egeria_capture`` (taking one
microbatch's activations off the training thread), ``egeria_reference`` (the CPU reference model) and
``egeria_worker`` (the background evaluation thread).
"""

from dataclasses import dataclass
from typing import Any

import torch

from timelyfreeze.job.fields import check_section
from timelyfreeze.methods.base import FreezeMethod, MethodContext
from timelyfreeze.methods.common import Prefix, warmup_of
from timelyfreeze.methods.egeria import cache as egeria_cache
from timelyfreeze.methods.egeria.capture import StageCapture
from timelyfreeze.methods.egeria.controller import EgeriaController
from timelyfreeze.methods.egeria.reference import build_reference
from timelyfreeze.methods.egeria.worker import EgeriaWorker, EvalJob


@dataclass
class EgeriaConfig:
    eval_every: int = 0
    """n: steps between plasticity evaluations (and bootstrapping loss checks). 0 = the paper's guideline
    n = total_steps / (W*2) / num_modules / (1 + 0.5 + 0.25), at least 1 (egeria-paper "Hyperparameters
    guideline"; gives n = 300 for ResNet-56, 78k iterations, 7 modules, W = 10)."""
    window: int = 10
    """W: smoothing window, linear-fit window, number of low-slope evaluations before freezing, and the
    reference-model refresh period in evaluations (digest 2.6/6: W = 10). Halved after an LR-drop unfreeze."""
    tolerance_coef: float = 0.2
    """T = tolerance_coef x the largest |slope| among a module's first ``tolerance_readings`` readings
    (digest 2.6/6: 20%)."""
    tolerance_readings: int = 3
    """Number of initial slope readings of a module from which its tolerance T is set (digest 2.6: 3)."""
    bootstrap_loss_rate: float = 0.1
    """Bootstrapping ends when the relative change of the training loss between consecutive evaluations
    falls below this (digest 2.2: "permissively set to 10%")."""
    unfreeze_lr_drop: float = 10.0
    """Unfreeze all modules when the learning rate has dropped by this factor since the frontmost frozen
    module's freeze (digest 2.7: 10x)."""
    quantize: bool = True
    """int8 dynamic quantisation of the CPU reference copy (digest 2.4: dynamic for NLP models); False =
    fp32 reference (the paper's fallback for sensitive models)."""
    sp_max_rows: int = 1024
    """At most this many activation rows (token vectors) enter the b x b similarity matrices; larger
    microbatches are subsampled at evenly spaced rows (our choice, not in the paper: its b is an image
    batch, ours is batch x sequence, and a 16k x 16k Gram matrix would dominate the CPU work)."""
    cache: bool = True
    """Activation cache (digest 2.8): on the first stage, keep the frozen prefix's output per microbatch of
    sample ids and skip the prefix's forward when the samples come back (``methods/egeria_cache``). Works
    only with a dataset whose samples carry ids (``pystdlib_<split>_fixed<N>``); otherwise it stays idle."""
    cache_mb: float = 512.0
    """Bound of the activation cache in MiB (host memory; least recently used entries are dropped first)."""

    def validate(self, section: str = "freeze.egeria") -> None:
        """``FreezeConfigError`` naming the first field whose type or value cannot work."""
        check_section(
            self,
            section,
            (
                ("eval_every", lambda v: v >= 0, "must be >= 0 (0: the paper's formula)"),
                ("window", lambda v: v >= 2, "must be >= 2"),
                ("tolerance_coef", lambda v: v > 0.0, "must be > 0"),
                ("tolerance_readings", lambda v: v >= 1, "must be >= 1"),
                ("bootstrap_loss_rate", lambda v: v >= 0.0, "must be >= 0"),
                ("unfreeze_lr_drop", lambda v: v > 1.0, "must be > 1"),
                ("sp_max_rows", lambda v: v >= 2, "must be >= 2"),
                ("cache_mb", lambda v: v >= 0.0, "must be >= 0"),
            ),
        )


class Egeria(FreezeMethod):
    """Egeria baseline: every microbatch of a step freezes the modules in front of the frontmost active one."""

    name = "egeria"
    may_freeze_anchor = True  # the prefix is frozen whole (module docstring)
    step_metric_names = egeria_cache.STEP_METRIC_NAMES

    def __init__(self, cfg: Any, ctx: MethodContext):
        super().__init__(cfg, ctx)
        eg = cfg.egeria  # validated: EgeriaConfig.validate
        self.ecfg = eg
        self.warmup_steps = warmup_of(cfg, ctx)
        self.ctrl = EgeriaController(
            eg.window, eg.tolerance_coef, eg.tolerance_readings, eg.bootstrap_loss_rate, eg.unfreeze_lr_drop
        )
        self.prefix = Prefix(ctx.stages)
        self.views = {v.stage: v for v in ctx.stages}
        self.layer_stage = {layer: v.stage for v in ctx.stages for layer in v.layer_modules}
        self.worker = EgeriaWorker(bool(eg.quantize), int(eg.sp_max_rows))
        self.n: int | None = int(eg.eval_every) or None
        self.num_layers: int | None = None
        self._loss_sum = 0.0
        self._loss_count = 0
        self._last_loss: float | None = None
        """The job's training loss of the last step whose metrics row was made (``observe_loss``)."""
        self._capture: StageCapture | None = None
        self._evals_since_refresh: dict[int, int] = {}
        self._ref_generation: dict[int, int] = {}
        self._module_names: dict[int, dict[int, str]] = {}
        self.submitted = 0
        self.skipped_busy = 0
        self.disabled: str | None = None
        self.cache, self.cache_off = egeria_cache.install(ctx.stages, bool(eg.cache), float(eg.cache_mb))
        self._cache_seen: dict[str, float] = {}

    # -- layout ---------------------------------------------------------------------------------
    def _ensure_layout(self) -> None:
        if self.num_layers is not None and self.n is not None:
            return
        local_max = max((v.layer_of[n] for v in self.views.values() for n in v.params), default=-1)
        local_max = max([local_max, *self.layer_stage]) if self.layer_stage else local_max
        self.num_layers = max(self.ctx.all_gather(local_max)) + 1
        self.ctrl.last_layer = self.num_layers - 1
        if self.n is None:
            modules = max(1, self.num_layers - 1)
            self.n = max(1, round(self.ctx.total_steps / (self.ctrl.window * 2) / modules / 1.75))

    # -- phase / decisions ------------------------------------------------------------------------
    def phase(self, step: int) -> str:
        if step <= self.warmup_steps:
            return "warmup"
        return "active" if self.ctrl.bootstrapped else "bootstrap"

    def frozen_tensors(self, step: int, stage: int, microbatch: int, accum: int = 0) -> frozenset[str]:
        if step <= self.warmup_steps or self.ctrl.cur == 0:
            return frozenset()
        v = self.views[stage]
        names = self.prefix.names(stage, self.ctrl.cur)
        return names | {v.anchor} if v.anchor is not None and v.layer_of[v.anchor] < self.ctrl.cur else names

    def _is_eval_step(self, step: int) -> bool:
        return self.n is not None and step % self.n == 0

    def _cache_boundary(self, step: int) -> None:
        """The activation cache serves this step's frozen prefix, as far as it lies on the first stage."""
        if self.cache is not None:
            frozen = 0 if step <= self.warmup_steps else self.ctrl.cur
            self.cache.set_boundary(min(frozen, self.cache.stage_layers), self.ctrl.generation)

    def begin_step(self, step: int) -> None:
        self._ensure_layout()
        self._cache_boundary(step)
        if not (self._is_eval_step(step) and self.ctrl.bootstrapped and not self.ctrl.done):
            return
        stage = self.layer_stage.get(self.ctrl.cur)
        if stage is None or self.disabled:
            return
        if self.worker.busy():
            self.skipped_busy += 1
            return
        self._arm(step, stage, self.ctrl.cur)

    def _module_name(self, stage: int, layer: int) -> str | None:
        v = self.views[stage]
        if stage not in self._module_names:
            ids = {id(m): name for name, m in v.module.named_modules()}
            self._module_names[stage] = {k: ids[id(m)] for k, m in v.layer_modules.items() if id(m) in ids}
        return self._module_names[stage].get(layer)

    def _arm(self, step: int, stage: int, layer: int) -> None:
        v = self.views[stage]
        name = self._module_name(stage, layer)
        if name is None:
            self.disabled = f"layer {layer} module is not inside stage {stage}'s module"
            return
        self._capture = StageCapture(v.module, v.layer_modules[layer], stage=stage, layer=layer, step=step, name=name)

    def _disarm(self) -> StageCapture | None:
        cap, self._capture = self._capture, None
        if cap is not None:
            cap.close()
        return cap

    def after_backward(self, step: int) -> None:
        cap = self._disarm()
        if cap is None or not cap.complete:
            return
        stage = cap.stage
        gen = self.ctrl.generation
        need = (
            not self.worker.has_reference(stage)
            or self._ref_generation.get(stage) != gen
            or self._evals_since_refresh.get(stage, 0) >= self.ctrl.window_eff
        )
        snapshot = reference = None
        if need:
            module = self.views[stage].module
            if not self.worker.has_fp32_reference(stage):
                try:
                    reference = build_reference(module)
                except Exception as e:
                    self.disabled = f"cannot copy stage {stage} for the reference: {type(e).__name__}: {e}"
                    return
            snapshot = {n: cap.copier(t, torch.float32) for n, t in module.state_dict().items()}
        job = EvalJob(
            stage=stage,
            module=cap.layer,
            generation=gen,
            step=step,
            module_name=cap.name,
            args=cap.args,
            kwargs=cap.kwargs,
            a_t=cap.a_t,
            snapshot=snapshot,
            reference=reference,
            event=cap.copier.event(),
        )
        if self.worker.submit(job):
            self.submitted += 1
            if need:
                self._evals_since_refresh[stage] = 0
                self._ref_generation[stage] = gen
            self._evals_since_refresh[stage] = self._evals_since_refresh.get(stage, 0) + 1
        else:
            self.skipped_busy += 1

    def observe_loss(self, step: int, loss: float | None) -> None:
        """Keep the job's loss of ``step``: the next ``after_optimizer_step`` adds it to the evaluation window."""
        self._last_loss = loss

    def after_optimizer_step(self, step: int) -> None:
        loss = self._last_loss  # the previous step's: this step's row is not made yet
        if loss is not None:
            self._loss_sum += float(loss)
            self._loss_count += 1
        if not self._is_eval_step(step):
            return
        payload = {
            "loss_sum": self._loss_sum,
            "loss_count": self._loss_count,
            "readings": self.worker.drain(),
            "lr": float(self.ctx.get_lr()),
        }
        gathered = self.ctx.all_gather(payload)
        self._loss_sum, self._loss_count = 0.0, 0
        count = sum(g["loss_count"] for g in gathered)
        # every rank usually sees the same loss (the runtime shares it); average what was reported
        mean_loss = sum(g["loss_sum"] for g in gathered) / count if count else None
        lr = gathered[0]["lr"]
        if not self.ctrl.bootstrapped:
            self.ctrl.observe_loss(step, mean_loss, may_end=step >= self.warmup_steps)
            return
        readings = sorted((r for g in gathered for r in g["readings"]), key=lambda r: (r[2], r[0]))
        for module, generation, _rstep, value in readings:
            self.ctrl.observe_plasticity(step, module, generation, value, lr)
        self.ctrl.check_lr(step, lr)

    # -- checkpoint / report ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "ctrl": self.ctrl.state_dict(),
            "n": self.n,
            "num_layers": self.num_layers,
            "loss_sum": self._loss_sum,
            "loss_count": self._loss_count,
            "submitted": self.submitted,
            "skipped_busy": self.skipped_busy,
            "cache": self.cache.counters() if self.cache is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ctrl.load_state_dict(state["ctrl"])
        self.n = state["n"]
        self.num_layers = state["num_layers"]
        self._loss_sum = float(state["loss_sum"])
        self._loss_count = int(state["loss_count"])
        self.submitted = int(state["submitted"])
        self.skipped_busy = int(state["skipped_busy"])
        if self.cache is not None and state.get("cache"):
            self.cache.load_counters(state["cache"])  # the entries are not kept: the cache refills
        self._ref_generation.clear()  # the reference is rebuilt at the next evaluation

    def summary(self) -> dict[str, Any]:
        return {
            "eval_every": self.n,
            "window": self.ctrl.window_eff,
            "bootstrapped": self.ctrl.bootstrapped,
            "frozen_modules": self.ctrl.cur,
            "num_layers": self.num_layers,
            "events": [list(e) for e in self.ctrl.events],
            "evaluations_submitted": self.submitted,
            "evaluations_completed": self.worker.completed,
            "evaluations_skipped_busy": self.skipped_busy,
            "evaluations_failed": self.worker.failed,
            "reference_refreshes": self.worker.refreshes,
            "reference_int8": self.worker.quantized,
            "worker_errors": self.worker.errors[:10],
            "disabled": self.disabled,
            **egeria_cache.summary(self.cache, self.cache_off),
        }

    def step_metrics(self) -> dict[str, float]:
        return egeria_cache.step_metrics(self.cache, self._cache_seen)

    def close(self) -> None:
        self.worker.close()
        egeria_cache.uninstall(self.ctx.stages)
