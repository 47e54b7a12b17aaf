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
- The parameter snapshot for a refresh is copied to CPU on the training thread (asynchronously into
  pinned memory on CUDA); the CPU skeleton of a stage is deep-copied once, on its first evaluation.
- No activation caching / forward skipping (the other methods have none either).
- Which steps' readings arrive at which decision depends on the worker's speed, so runs are not
  bit-reproducible across machines; all ranks of one run always agree.
"""

import copy
import math
import queue
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_map_only

from timelyfreeze.methods.autofreeze import Prefix
from timelyfreeze.methods.base import FreezeMethod, MethodContext
from timelyfreeze.methods.random_fixed import warmup_of


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


# ---------------------------------------------------------------------------------------------------
# plasticity


def _rows(a: torch.Tensor) -> torch.Tensor:
    """Activation -> rows compared by the SP loss: (batch, seq, d) -> (batch*seq, d) token vectors;
    anything else -> (batch, rest) as in the paper (b x chw for images)."""
    if a.dim() == 3:
        return a.reshape(-1, a.shape[-1])
    if a.dim() == 1:
        return a.reshape(-1, 1)
    return a.reshape(a.shape[0], -1)


def sp_loss(a_t: torch.Tensor, a_r: torch.Tensor, max_rows: int = 0) -> float:
    """Similarity-preserving loss (Tung & Mori; KGT App. B): Q = rows of A, G = row-L2-normalised Q Q^T,
    loss = ||G_T - G_R||_F^2 / b^2. ``max_rows`` > 0 keeps that many evenly spaced rows."""
    qt, qr = _rows(a_t.detach()).float(), _rows(a_r.detach()).float()
    if qt.shape != qr.shape:
        raise ValueError(f"activation shapes differ: {tuple(a_t.shape)} vs {tuple(a_r.shape)}")
    b = qt.shape[0]
    if max_rows > 0 and b > max_rows:
        idx = torch.linspace(0, b - 1, max_rows).round().long()
        qt, qr, b = qt[idx], qr[idx], max_rows
    gt = F.normalize(qt @ qt.T, p=2, dim=1)
    gr = F.normalize(qr @ qr.T, p=2, dim=1)
    return float((gt - gr).pow(2).sum().item()) / (b * b)


def linear_slope(ys: list[float]) -> float:
    """Least-squares slope of ``ys`` against 0, 1, 2, ... (0 for fewer than two points)."""
    n = len(ys)
    if n < 2:
        return 0.0
    xm = (n - 1) / 2.0
    ym = sum(ys) / n
    sxx = sum((i - xm) ** 2 for i in range(n))
    return sum((i - xm) * (y - ym) for i, y in enumerate(ys)) / sxx


class EgeriaController:
    """Egeria's decision state (Algorithm 1 + bootstrapping + LR unfreezing), free of torch and threads:
    every rank feeds it the same gathered numbers and so reaches the same decisions."""

    def __init__(self, window: int, tolerance_coef: float, tolerance_readings: int,
                 bootstrap_loss_rate: float, unfreeze_lr_drop: float):
        if window < 2:
            raise ValueError(f"freeze.egeria.window must be >= 2, got {window}")
        self.window = int(window)
        self.window_eff = int(window)
        self.tolerance_coef = float(tolerance_coef)
        self.tolerance_readings = max(1, int(tolerance_readings))
        self.bootstrap_loss_rate = float(bootstrap_loss_rate)
        self.unfreeze_lr_drop = float(unfreeze_lr_drop)
        self.last_layer: int | None = None
        """Index of the head; never frozen. Set once the layout is known."""
        self.bootstrapped = False
        self.prev_loss: float | None = None
        self.cur = 0
        """Frontmost active module: layers ``< cur`` are frozen."""
        self.generation = 0
        """Bumped on every unfreeze-all; readings of an older generation are dropped."""
        self.freeze_lr: float | None = None
        self.events: list[tuple[int, str, int]] = []
        self._reset_module()

    def _reset_module(self) -> None:
        self.raw: list[float] = []
        self.smoothed: list[float] = []
        self.first_slopes: list[float] = []
        self.tolerance: float | None = None
        self.stale = 0
        self.last_slope: float | None = None

    @property
    def done(self) -> bool:
        return self.last_layer is not None and self.cur >= self.last_layer

    def observe_loss(self, step: int, loss: float | None, may_end: bool) -> bool:
        """Bootstrapping check with the mean loss of the last interval. True when bootstrapping ends now."""
        if self.bootstrapped or loss is None or not math.isfinite(loss):
            return False
        prev, self.prev_loss = self.prev_loss, loss
        if prev is None or prev == 0:
            return False
        rate = abs(prev - loss) / abs(prev)
        if may_end and rate < self.bootstrap_loss_rate:
            self.bootstrapped = True
            self.events.append((step, "bootstrap_end", -1))
            return True
        return False

    def observe_plasticity(self, step: int, module: int, generation: int, value: float, lr: float) -> bool:
        """One plasticity reading. True when it froze module ``cur``."""
        if not self.bootstrapped or self.done or module != self.cur or generation != self.generation:
            return False
        if not math.isfinite(value):
            return False
        w = self.window_eff
        self.raw.append(value)
        self.smoothed.append(sum(self.raw[-w:]) / len(self.raw[-w:]))
        if len(self.smoothed) < 2:
            return False
        s = abs(linear_slope(self.smoothed[-w:]))
        self.last_slope = s
        if self.tolerance is None:
            self.first_slopes.append(s)
            if len(self.first_slopes) >= self.tolerance_readings:
                self.tolerance = self.tolerance_coef * max(self.first_slopes)
        if self.tolerance is not None:
            self.stale = self.stale + 1 if s < self.tolerance else 0
            if self.stale >= w:
                if self.freeze_lr is None:
                    self.freeze_lr = float(lr)
                self.events.append((step, "freeze", self.cur))
                self.cur += 1
                self._reset_module()
                return True
        return False

    def check_lr(self, step: int, lr: float) -> bool:
        """Unfreeze everything when the LR fell by ``unfreeze_lr_drop`` since the first freeze."""
        if self.freeze_lr is None or self.cur == 0:
            return False
        if lr <= self.freeze_lr / self.unfreeze_lr_drop:
            self.events.append((step, "unfreeze_all", self.cur))
            self.cur = 0
            self.freeze_lr = None
            self.window_eff = max(2, self.window_eff // 2)
            self.generation += 1
            self._reset_module()
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        return {k: copy.deepcopy(v) for k, v in vars(self).items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, copy.deepcopy(v))


# ---------------------------------------------------------------------------------------------------
# background worker


class _StopForward(Exception):
    pass


def _first_tensor(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        for x in out:
            t = _first_tensor(x)
            if t is not None:
                return t
    if isinstance(out, dict):
        for x in out.values():
            t = _first_tensor(x)
            if t is not None:
                return t
    return None


class _Copier:
    """Copies tensors to CPU without stalling the training thread: on CUDA into pinned memory with
    ``non_blocking`` and one event the worker waits on; on CPU a plain clone."""

    def __init__(self) -> None:
        self.cuda = False

    def __call__(self, t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        t = t.detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        if t.is_cuda:
            self.cuda = True
            dst = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            dst.copy_(t, non_blocking=True)
            return dst
        return t.clone()

    def event(self) -> Any:
        if not self.cuda:
            return None
        ev = torch.cuda.Event()
        ev.record()
        return ev


@dataclass
class _Job:
    stage: int
    module: int
    generation: int
    step: int
    module_name: str
    args: Any
    kwargs: Any
    a_t: torch.Tensor
    snapshot: dict[str, torch.Tensor] | None
    skeleton: torch.nn.Module | None
    event: Any


def _cpu_skeleton(module: torch.nn.Module) -> torch.nn.Module:
    """A CPU fp32 copy of ``module`` without its hooks; parameters are empty (filled on refresh), buffers
    are copied. Deep-copies with a memo, so the (maybe GPU) tensors are never duplicated on their device."""
    memo: dict[int, Any] = {}
    for p in module.parameters():
        dt = torch.float32 if p.is_floating_point() else p.dtype
        memo[id(p)] = torch.nn.Parameter(torch.empty(p.shape, dtype=dt), requires_grad=False)
    for b in module.buffers():
        memo[id(b)] = b.detach().to("cpu", torch.float32 if b.is_floating_point() and not b.is_complex()
                                    else b.dtype, copy=True)
    for m in module.modules():
        for attr, val in vars(m).items():
            if "hook" in attr and isinstance(val, dict):
                memo[id(val)] = type(val)()
    sk = copy.deepcopy(module, memo)
    sk.eval()
    sk.requires_grad_(False)
    return sk


class EgeriaWorker:
    """One daemon thread; at most one job in flight. ``submit`` never blocks: it refuses while busy."""

    def __init__(self, quantize: bool, sp_max_rows: int, delay_s: float = 0.0):
        self.quantize = quantize
        self.sp_max_rows = sp_max_rows
        self.delay_s = delay_s
        """Test hook: extra seconds each job sleeps (to prove the training step never waits)."""
        self._q: "queue.Queue[_Job | None]" = queue.Queue(maxsize=1)
        self._lock = threading.Lock()
        self._busy = False
        self._results: list[tuple[int, int, int, float]] = []
        self._skeleton: dict[int, torch.nn.Module] = {}
        self._ref: dict[int, torch.nn.Module] = {}
        self.errors: list[str] = []
        self.completed = 0
        self.failed = 0
        self.refreshes = 0
        self.quantized = None
        self._thread: threading.Thread | None = None

    def busy(self) -> bool:
        with self._lock:
            return self._busy

    def has_reference(self, stage: int) -> bool:
        return stage in self._ref

    def has_skeleton(self, stage: int) -> bool:
        return stage in self._skeleton

    def submit(self, job: _Job) -> bool:
        with self._lock:
            if self._busy:
                return False
            self._busy = True
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="egeria-worker", daemon=True)
            self._thread.start()
        self._q.put_nowait(job)
        return True

    def drain(self) -> list[tuple[int, int, int, float]]:
        """Readings finished since the last call: (module, generation, step, plasticity)."""
        with self._lock:
            out, self._results = self._results, []
        return out

    def close(self, timeout_s: float = 60.0) -> None:
        """Stop the thread and wait for it: a daemon thread still inside a torch kernel while the
        interpreter shuts down aborts the process (seen as SIGABRT at the end of a run)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        try:
            self._q.put(None, timeout=timeout_s)
        except queue.Full:
            pass
        thread.join(timeout=timeout_s)

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            job = self._q.get()
            if job is None:
                return
            try:
                value = self._process(job)
                with self._lock:
                    self._results.append((job.module, job.generation, job.step, value))
                    self.completed += 1
            except Exception as e:  # a failed evaluation is skipped, never fatal to training
                with self._lock:
                    self.failed += 1
                    if len(self.errors) < 20:
                        self.errors.append(f"step {job.step} module {job.module}: {type(e).__name__}: {e}")
            finally:
                with self._lock:
                    self._busy = False

    def _refresh(self, job: _Job) -> None:
        if job.skeleton is not None:
            self._skeleton[job.stage] = job.skeleton
        sk = self._skeleton[job.stage]
        params = dict(sk.named_parameters())
        for name, t in job.snapshot.items():
            params[name].data.copy_(t)
        ref = sk
        if self.quantize:
            try:
                from torch.ao.quantization import quantize_dynamic

                with warnings.catch_warnings():  # torch 2.13 deprecates torch.ao.quantization (still works)
                    warnings.simplefilter("ignore", DeprecationWarning)
                    warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*")
                    ref = quantize_dynamic(sk, {torch.nn.Linear}, dtype=torch.qint8, inplace=False)
                self.quantized = True
            except Exception as e:  # quantisation unavailable: the paper's fp32 fallback
                self.errors.append(f"int8 reference unavailable, using fp32: {type(e).__name__}: {e}")
                self.quantize = False
                self.quantized = False
        else:
            self.quantized = False
        self._ref[job.stage] = ref
        self.refreshes += 1

    def _process(self, job: _Job) -> float:
        if job.event is not None:
            job.event.synchronize()
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        if job.snapshot is not None:
            self._refresh(job)
        ref = self._ref[job.stage]
        target = ref.get_submodule(job.module_name) if job.module_name else ref
        box: dict[str, torch.Tensor] = {}

        def grab(_m: Any, _a: Any, out: Any) -> None:
            box["a"] = _first_tensor(out)
            raise _StopForward

        h = target.register_forward_hook(grab)
        try:
            ref(*job.args, **job.kwargs)
        except _StopForward:
            pass
        finally:
            h.remove()
        if box.get("a") is None:
            raise RuntimeError(f"module {job.module_name!r} produced no tensor in the reference forward")
        return sp_loss(job.a_t, box["a"].float(), self.sp_max_rows)


# ---------------------------------------------------------------------------------------------------
# the method


class Egeria(FreezeMethod):
    """Egeria baseline: every microbatch of a step freezes the modules in front of the frontmost active one."""

    name = "egeria"
    step_level = True

    def __init__(self, cfg: Any, ctx: MethodContext):
        super().__init__(cfg, ctx)
        eg = cfg.egeria
        if eg.eval_every < 0:
            raise ValueError(f"freeze.egeria.eval_every must be >= 0, got {eg.eval_every}")
        self.ecfg = eg
        self.warmup_steps = warmup_of(cfg, ctx)
        self.ctrl = EgeriaController(eg.window, eg.tolerance_coef, eg.tolerance_readings,
                                     eg.bootstrap_loss_rate, eg.unfreeze_lr_drop)
        self.prefix = Prefix(ctx.stages)
        self.views = {v.stage: v for v in ctx.stages}
        self.layer_stage = {layer: v.stage for v in ctx.stages for layer in v.layer_modules}
        self.worker = EgeriaWorker(bool(eg.quantize), int(eg.sp_max_rows))
        self.n: int | None = int(eg.eval_every) or None
        self.num_layers: int | None = None
        self._loss_sum = 0.0
        self._loss_count = 0
        self._capture: dict[str, Any] | None = None
        self._hooks: list[Any] = []
        self._evals_since_refresh: dict[int, int] = {}
        self._ref_generation: dict[int, int] = {}
        self._module_names: dict[int, dict[int, str]] = {}
        self.submitted = 0
        self.skipped_busy = 0
        self.disabled: str | None = None

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
        return self.prefix.names(stage, self.ctrl.cur)

    def _is_eval_step(self, step: int) -> bool:
        return self.n is not None and step % self.n == 0

    def begin_step(self, step: int) -> None:
        self._ensure_layout()
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
            self._module_names[stage] = {
                k: ids[id(m)] for k, m in v.layer_modules.items() if id(m) in ids
            }
        return self._module_names[stage].get(layer)

    def _arm(self, step: int, stage: int, layer: int) -> None:
        v = self.views[stage]
        name = self._module_name(stage, layer)
        if name is None:
            self.disabled = f"layer {layer} module is not inside stage {stage}'s module"
            return
        cap: dict[str, Any] = {"stage": stage, "layer": layer, "step": step, "name": name,
                               "state": "idle", "copier": _Copier()}
        copier = cap["copier"]

        def pre(_m: Any, args: Any, kwargs: Any) -> None:
            if cap["state"] == "idle":
                cap["state"] = "capturing"
                cap["args"], cap["kwargs"] = tree_map_only(
                    torch.Tensor, lambda t: copier(t, torch.float32), (args, kwargs))

        def layer_out(_m: Any, _a: Any, out: Any) -> None:
            if cap["state"] == "capturing" and "a_t" not in cap:
                t = _first_tensor(out)
                if t is not None:
                    cap["a_t"] = copier(t, torch.float32)

        def post(_m: Any, _a: Any, _out: Any) -> None:
            if cap["state"] == "capturing":
                cap["state"] = "done"

        self._hooks = [
            v.module.register_forward_pre_hook(pre, with_kwargs=True),
            v.layer_modules[layer].register_forward_hook(layer_out),
            v.module.register_forward_hook(post),
        ]
        self._capture = cap

    def _disarm(self) -> dict[str, Any] | None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        cap, self._capture = self._capture, None
        return cap

    def after_backward(self, step: int) -> None:
        cap = self._disarm()
        if cap is None or cap["state"] != "done" or "a_t" not in cap:
            return
        stage = cap["stage"]
        gen = self.ctrl.generation
        need = (not self.worker.has_reference(stage) or self._ref_generation.get(stage) != gen
                or self._evals_since_refresh.get(stage, 0) >= self.ctrl.window_eff)
        snapshot = skeleton = None
        copier = cap["copier"]
        if need:
            module = self.views[stage].module
            if not self.worker.has_skeleton(stage):
                try:
                    skeleton = _cpu_skeleton(module)
                except Exception as e:
                    self.disabled = f"cannot copy stage {stage} for the reference: {type(e).__name__}: {e}"
                    return
            snapshot = {n: copier(p, torch.float32) for n, p in module.named_parameters()}
        job = _Job(stage=stage, module=cap["layer"], generation=gen, step=step, module_name=cap["name"],
                   args=cap["args"], kwargs=cap["kwargs"], a_t=cap["a_t"],
                   snapshot=snapshot, skeleton=skeleton, event=copier.event())
        if self.worker.submit(job):
            self.submitted += 1
            if need:
                self._evals_since_refresh[stage] = 0
                self._ref_generation[stage] = gen
            self._evals_since_refresh[stage] = self._evals_since_refresh.get(stage, 0) + 1
        else:
            self.skipped_busy += 1

    def after_optimizer_step(self, step: int) -> None:
        loss = self.ctx.extras.get("last_loss")
        if loss is not None:
            self._loss_sum += float(loss)
            self._loss_count += 1
        if not self._is_eval_step(step):
            return
        payload = {"loss_sum": self._loss_sum, "loss_count": self._loss_count,
                   "readings": self.worker.drain(), "lr": float(self.ctx.get_lr())}
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
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ctrl.load_state_dict(state["ctrl"])
        self.n = state["n"]
        self.num_layers = state["num_layers"]
        self._loss_sum = float(state["loss_sum"])
        self._loss_count = int(state["loss_count"])
        self.submitted = int(state["submitted"])
        self.skipped_busy = int(state["skipped_busy"])
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
        }

    def close(self) -> None:
        self.worker.close()
