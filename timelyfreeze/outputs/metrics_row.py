"""One step's numbers: this rank's, measured while the step runs, and the job's metrics row (a line of
``metrics.jsonl``, ``docs/run-outputs.md``) that every rank builds alike from every rank's numbers.

The runtime gathers ``StepMetrics.local`` over the whole job once per step and hands the gathered list
to ``row``, the row's one assembly: the loss summed over data-parallel replicas, the freeze ratio over the
elements of every stage, microbatch and replica, the slowest rank's step time and each replica's batch
time, the method's figures summed over the ranks, and the fields of the step's drift check
(``timelyfreeze.plan.outcome.DriftReport``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor

from planner.schedule.actions import parse_action
from timelyfreeze.hooks.profiler import ActionRecord
from timelyfreeze.hooks.step_clock import StepClock
from timelyfreeze.job.collectives import JobGroup
from timelyfreeze.job.run_info import RunInfo
from timelyfreeze.job.stage_view import StageView


class StepMetrics:
    def __init__(self, views: list[StageView], job: JobGroup, info: RunInfo, clock: StepClock | None = None):
        """Collective over the pipeline group (the trainable elements of every stage). ``clock``: where the
        batch and step marks come from (host ``perf_counter`` on CPU, CUDA events read after the step's one
        synchronisation on CUDA; shared with the profiler)."""
        self.job, self.info = job, info
        self.clock = clock if clock is not None else StepClock(info.use_cuda)
        self.trainable = {v.stage: sum(p.numel() for p in v.params.values()) for v in views}
        """Trainable elements of each stage this rank holds."""
        self.total_trainable = sum(job.pipeline.all_gather(sum(self.trainable.values())))
        """Trainable elements of the whole pipeline (every stage, once)."""
        self.lr = 0.0
        """The LR this step's optimizer update uses."""
        self._batches: list[Any] = []
        """Each batch of the step: its seconds, or its (start, end) marks of ``clock``."""
        self._losses: list[Any] = []
        self._t0: Any = 0.0
        self._t1: Any = 0.0
        self._stage_of: dict[str, int] = {}
        """Stage of every action seen (parsed once)."""

    # -- this rank, while the step runs ------------------------------------------------------------
    def begin(self, lr: float) -> None:
        self.lr = lr
        self._batches = []
        self._losses = []
        self.clock.begin_step()
        self._t0 = self.clock.mark()

    def add_batch(self, time: float | tuple[Any, Any], loss: Any | None) -> None:
        """One pipeline batch finished: its wall time (seconds, or the ``(start, end)`` marks of ``clock``,
        read at the end of the step) and local loss (a float or a 0-d tensor, read once at the end of the
        step: no host synchronisation per batch on CUDA)."""
        self._batches.append(time)
        if loss is not None:
            self._losses.append(loss)

    def end(self) -> None:
        """The step's work is done (after the optimizer step): its time stops here (a mark; read after the
        step's synchronisation, ``local``)."""
        self._t1 = self.clock.mark()

    def local(self, records: list[ActionRecord], batches: int) -> dict:
        """This rank's part of the step's gather: the elements its ``records`` froze (per batch, of
        ``batches`` accumulation batches), its batch and step time, and its summed loss (or None)."""
        stage_of = self._stage_of
        for r in records:
            if r.action not in stage_of:
                stage_of[r.action] = parse_action(r.action).stage
        frozen = sum(r.freeze_ratio * self.trainable[stage_of[r.action]] for r in records)
        clock = self.clock
        clock.settle()  # CUDA: the step's wait for the device (done already when the profiler collected)
        return {
            "frozen": frozen / max(1, batches),
            "batch_s": sum(b if isinstance(b, float) else clock.seconds(*b) for b in self._batches),
            "step_s": clock.seconds(self._t0, self._t1),
            "loss": loss_sum(self._losses),
        }

    # -- the job ---------------------------------------------------------------------------------
    def row(
        self, step: int, phase: str, gathered: list[dict], predicted_ms: float | None, drift: dict | None = None
    ) -> dict:
        """The step's metrics row, its one assembly: from every rank's ``local`` (global rank order), with each
        method figure (``"method"``, ``FreezeMethod.step_metrics``) summed over the ranks, and the fields of the
        step's drift check (``DriftReport.row_fields``). Identical on every rank."""
        replicas = self.job.replicas
        losses = [g["loss"] for g in gathered if g["loss"] is not None]
        # TorchTitan's loss is each rank's token-loss sum over the *global* token count: the job's loss is
        # the sum over data-parallel replicas (tensor-parallel copies hold the same value: averaged out)
        loss = sum(losses) * self.info.dp_degree / replicas if losses else None
        step_s = max(g["step_s"] for g in gathered)
        batch_s = [
            max(g["batch_s"] for g, place in zip(gathered, self.job.places) if place[0] == d) for d in range(replicas)
        ]
        denom = self.total_trainable * self.info.num_microbatches * replicas
        row = {
            "step": step,
            "phase": phase,
            "freeze_ratio": sum(g["frozen"] for g in gathered) / denom if denom else 0.0,
            "step_ms": step_s * 1e3,
            "batch_ms": max(batch_s) * 1e3,
            "tokens_per_s": self.info.tokens_per_step / step_s if step_s > 0 else None,
            "loss": loss,
            "predicted_batch_ms": predicted_ms,
            "lr": self.lr,
        }
        if replicas > 1:
            row["replica_batch_ms"] = [round(b * 1e3, 3) for b in batch_s]
        for g in gathered:
            for k, v in g["method"].items():
                row[k] = row.get(k, 0) + v
        return row | (drift or {})

    def close(self) -> None:
        """Drop the job's process groups (see ``FreezeRuntime.close``)."""
        self.job = None


def describe(row: dict) -> str:
    """The log line of a metrics row."""
    pred = f" predicted {row['predicted_batch_ms']:.1f} ms" if row["predicted_batch_ms"] else ""
    return (
        f"[freeze] step {row['step']} {row['phase']}: freeze ratio {row['freeze_ratio']:.3f}, "
        f"batch {row['batch_ms']:.1f} ms{pred}, step {row['step_ms']:.1f} ms"
    )


def loss_sum(losses: list) -> float | None:
    """The step's summed local loss (None without any): 0-d tensors (on the device) read back in one copy, not
    one per batch; the sum in float64 in batch order either way, so the value is the same."""
    if not losses:
        return None
    if all(isinstance(x, torch.Tensor) and not isinstance(x, DTensor) for x in losses):
        return sum(torch.stack(losses).tolist())
    # DTensors (tensor parallelism) refuse tolist(); float() reads each as DTensor's own rules say (as before)
    return sum(float(x) for x in losses)
