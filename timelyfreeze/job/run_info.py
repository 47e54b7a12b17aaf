"""What the trainer hands the freezing runtime (the job's facts, this rank's part of the pipeline, the
trainer's handles) and where the runtime writes (``docs/run-outputs.md``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from planner.trace.archive import TRACE_NAME

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
    stop_at_val_loss: float = 0.0
    """``[experiment] stop_at_val_loss`` (the summary reports the target of a time-to-accuracy run)."""

    @property
    def paths(self) -> RunPaths:
        return RunPaths(Path(self.dump_folder) / OUT_SUBDIR)


@dataclass(frozen=True)
class PipelinePart:
    """This rank's part of the pipeline, as the trainer built it."""

    stages: list
    """The ``PipelineStage`` objects this rank runs (1 for GPipe/1F1B, 2 for Interleaved1F1B/ZBV)."""
    group: Any
    """The pipeline's process group (TorchTitan's "pp" mesh)."""
    pairs: dict[str, str] | None = None
    """``stage_hooks.overlap_pairs`` of the schedule (DualPipeV's OVERLAP_F_B parts), so the profiler and
    the freezing hook name and time each pair as one action."""


@dataclass(frozen=True)
class TrainerHandles:
    """What the runtime reads from the trainer and reports to it."""

    get_lr: Callable[[], float]
    """The current learning rate of the (first) optimizer."""
    log: Callable[[str], None]
    """The trainer's log (the runtime writes to it on global rank 0 only)."""
    tb_log: Callable[[dict, int], None] | None = None
    """TensorBoard's ``log(metrics, step)``, where TensorBoard is on."""


@dataclass(frozen=True)
class RunPaths:
    """The runtime's files under ``<dump_folder>/timelyfreeze``."""

    out: Path

    @property
    def trace(self) -> Path:
        """The trace folder (packed later, by the sweep runner or ``python -m planner pack``, into ``trace.tar.gz``
        beside it)."""
        return self.out / TRACE_NAME

    @property
    def plan(self) -> Path:
        """The plan made from monitoring (never overwritten by a re-plan)."""
        return self.out / "plan.json"

    def replan(self, step: int) -> Path:
        """The re-plan made after ``step``."""
        return self.out / "replans" / f"plan_step{step}.json"

    @property
    def metrics(self) -> Path:
        return self.out / "metrics.jsonl"

    @property
    def summary(self) -> Path:
        return self.out / "summary.json"

    @property
    def timeline(self) -> Path:
        return self.out / "timeline.png"
