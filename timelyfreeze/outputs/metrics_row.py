"""One step's numbers: this rank's, measured while the step runs, and the job's metrics row (a line of
``metrics.jsonl``, ``docs/run-outputs.md``) that every rank builds alike from every rank's numbers.

The runtime gathers ``StepMetrics.local`` over the whole job once per step and hands the gathered list
to ``row``: the loss summed over data-parallel replicas, the freeze ratio over the elements of every
stage, microbatch and replica, the slowest rank's step time and each replica's batch time.
"""

from __future__ import annotations

import time
from typing import Any

from planner.schedule.actions import parse_action
from timelyfreeze.hooks.profiler import ActionRecord
from timelyfreeze.methods.base import StageView
from timelyfreeze.runtime.collectives import JobGroup
from timelyfreeze.runtime.run_info import RunInfo


class StepMetrics:
    def __init__(self, views: list[StageView], job: JobGroup, info: RunInfo):
        """Collective over the pipeline group (the trainable elements of every stage)."""
        self.job, self.info = job, info
        self.trainable = {v.stage: sum(p.numel() for p in v.params.values()) for v in views}
        """Trainable elements of each stage this rank holds."""
        self.total_trainable = sum(job.pipeline.all_gather(sum(self.trainable.values())))
        """Trainable elements of the whole pipeline (every stage, once)."""
        self.lr = 0.0
        """The LR this step's optimizer update uses."""
        self._batch_s = 0.0
        self._losses: list[Any] = []
        self._t0 = 0.0
        self._step_s = 0.0
        self._stage_of: dict[str, int] = {}
        """Stage of every action seen (parsed once)."""

    # -- this rank, while the step runs ------------------------------------------------------------
    def begin(self, lr: float) -> None:
        self.lr = lr
        self._batch_s = 0.0
        self._losses = []
        self._t0 = time.perf_counter()

    def add_batch(self, seconds: float, loss: Any | None) -> None:
        """One pipeline batch finished: its wall time and local loss (a float or a 0-d tensor, read once at
        the end of the step: no host synchronisation per batch on CUDA)."""
        self._batch_s += seconds
        if loss is not None:
            self._losses.append(loss)

    def end(self) -> None:
        """The step's work is done (after the optimizer step): its wall time stops here."""
        self._step_s = time.perf_counter() - self._t0

    def local(self, records: list[ActionRecord], batches: int) -> dict:
        """This rank's part of the step's gather: the elements its ``records`` froze (per batch, of
        ``batches`` accumulation batches), its batch and step time, and its summed loss (or None)."""
        stage_of = self._stage_of
        for r in records:
            if r.action not in stage_of:
                stage_of[r.action] = parse_action(r.action).stage
        frozen = sum(r.freeze_ratio * self.trainable[stage_of[r.action]] for r in records)
        return {
            "frozen": frozen / max(1, batches),
            "batch_s": self._batch_s,
            "step_s": self._step_s,
            "loss": sum(float(x) for x in self._losses) if self._losses else None,
        }

    # -- the job ---------------------------------------------------------------------------------
    def row(self, step: int, phase: str, gathered: list[dict], predicted_ms: float | None) -> dict:
        """The step's metrics row from every rank's ``local`` (global rank order): identical on every rank."""
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
        return row

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
