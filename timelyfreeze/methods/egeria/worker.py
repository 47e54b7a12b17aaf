"""Egeria's background evaluation: one daemon thread that runs the CPU reference of a stage on a captured
input and turns the two activations into a plasticity reading (SP loss).

``EgeriaWorker.submit`` never blocks the training step: at most one job is in flight and a submit while
busy is refused (the caller counts it as skipped). Jobs carrying a snapshot of the stage's state dict
refresh the reference first. ``close()`` stops the thread and joins it.
"""

import queue
import threading
from dataclasses import dataclass
from typing import Any

import torch

from timelyfreeze.methods.egeria.capture import first_tensor
from timelyfreeze.methods.egeria.reference import build_int8_reference, load_snapshot, reference_name
from timelyfreeze.methods.egeria.sp_loss import sp_loss


class _StopForward(Exception):
    pass


@dataclass
class EvalJob:
    """One plasticity evaluation, everything on CPU (or on its way there until ``event`` completes)."""

    stage: int
    module: int
    """Global layer index of the evaluated module."""
    generation: int
    step: int
    module_name: str
    """The module's name in the training stage (``""``: the stage itself)."""
    args: Any
    kwargs: Any
    a_t: torch.Tensor
    """The training activation of the module."""
    snapshot: dict[str, torch.Tensor] | None
    """The stage's state dict (fp32 CPU copies) when the reference is to be refreshed, else None."""
    reference: torch.nn.Module | None
    """The stage's fp32 CPU reference (``build_reference``) on its first refresh, else None."""
    event: Any
    """CUDA event after the last device-to-host copy of this job (None on CPU)."""


class EgeriaWorker:
    """One daemon thread; at most one job in flight. ``submit`` never blocks: it refuses while busy."""

    def __init__(self, quantize: bool, sp_max_rows: int):
        self.quantize = quantize
        self.sp_max_rows = sp_max_rows
        self._q: "queue.Queue[EvalJob | None]" = queue.Queue(maxsize=1)
        self._lock = threading.Lock()
        self._busy = False
        self._results: list[tuple[int, int, int, float]] = []
        self._fp32: dict[int, torch.nn.Module] = {}
        """Per stage: the fp32 reference, holding the latest snapshot."""
        self._ref: dict[int, torch.nn.Module] = {}
        """Per stage: the reference evaluated (the int8 copy of ``_fp32``, or ``_fp32`` itself)."""
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

    def has_fp32_reference(self, stage: int) -> bool:
        return stage in self._fp32

    def submit(self, job: EvalJob) -> bool:
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

    def _refresh(self, job: EvalJob) -> None:
        if job.reference is not None:
            self._fp32[job.stage] = job.reference
        fp32 = self._fp32[job.stage]
        load_snapshot(fp32, job.snapshot)
        ref = fp32
        if self.quantize:
            try:
                ref = build_int8_reference(fp32)
                self.quantized = True
            except Exception as e:  # quantisation unavailable: the paper's fp32 fallback
                self.errors.append(f"int8 reference unavailable, using fp32: {type(e).__name__}: {e}")
                self.quantize = False
                self.quantized = False
        else:
            self.quantized = False
        self._ref[job.stage] = ref
        self.refreshes += 1

    def _process(self, job: EvalJob) -> float:
        if job.event is not None:
            job.event.synchronize()
        if job.snapshot is not None:
            self._refresh(job)
        ref = self._ref[job.stage]
        target = ref.get_submodule(reference_name(job.module_name)) if job.module_name else ref
        box: dict[str, torch.Tensor] = {}

        def grab(_m: Any, _a: Any, out: Any) -> None:
            box["a"] = first_tensor(out)
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
