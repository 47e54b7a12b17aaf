"""What every freezing method implements, and what the runtime hands it.

The runtime owns one freezing hook per pipeline stage. Before the forward of microbatch ``m`` on
stage ``s`` at step ``t`` the hook asks the method ``frozen_tensors(t, s, m)`` and leaves those
parameter tensors out of that microbatch's autograd graph, so their weight-gradient compute is
skipped in B (or W). Step-level methods (APF, AutoFreeze, Egeria, SmartPipe) return the same set for
every microbatch of a step; TimelyFreeze and its hybrids return a fresh set per (stage, microbatch).

Call order on every rank, every step ``t`` (all ranks of the pipeline group call the same hooks at the
same step, so a method may use ``ctx.all_gather`` inside them):

    begin_step(t)
    frozen_tensors(t, s, m)      # once per (local stage, microbatch), in schedule order
    after_backward(t)            # every microbatch done: gradients are in .grad, optimizer not stepped
    after_optimizer_step(t)      # parameters updated
    observe_loss(t, loss)        # the step's metrics row is made: the job's training loss
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from timelyfreeze.job.phases import Phases
from timelyfreeze.job.stage_view import StageView


@dataclass
class MethodContext:
    """Everything a method may use besides its own config section."""

    stages: list[StageView]
    """The stages this rank runs (1 for GPipe/1F1B, 2 for Interleaved1F1B/ZBV)."""
    num_stages: int
    num_microbatches: int
    schedule: str
    total_steps: int
    all_gather: Callable[[Any], list[Any]]
    """Gather one picklable object from every rank of the pipeline group (rank order)."""
    get_lr: Callable[[], float]
    """Current learning rate of the (first) optimizer."""
    pp_rank: int = 0
    pp_size: int = 1
    lr_warmup_steps: int = 0
    compiled: bool = False
    """The stages' transformer blocks run under ``torch.compile`` (``[compile] enable`` with ``model``)."""
    phases: Phases | None = None
    """The phases the runtime derived from ``[freeze]`` (warm-up, monitoring, ramp, stable); None where
    none were derived (a method built outside a run)."""


class FreezeMethod:
    """Base class: freezes nothing. Subclasses override what they need, and declare what the runtime must
    serve them: a plan made from measurements (``monitor_phases`` + ``needs_plan``/``set_plan``), gradient
    statistics (read in ``after_backward``), the pipeline group (``ctx.all_gather``)."""

    name: ClassVar[str] = "none"
    monitor_phases: ClassVar[tuple[str, ...]] = ()
    """Phases whose per-action timings this method's plan is made from; the runtime keeps those trace
    records (and checkpoints them) and hands them to the planner when ``needs_plan`` says so."""

    step_metric_names: ClassVar[tuple[str, ...]] = ()
    """Every name ``step_metrics`` may return: the per-step gather's fixed layout has a slot for each
    (``timelyfreeze.runtime.step_gather``)."""

    may_freeze_anchor: ClassVar[bool] = False
    """True where the method may freeze the first stage's anchor (``StageView.anchor``) and itself keeps the
    stage's backward meaningful: Egeria freezes its prefix whole, so its output is fixed (its cache)."""

    masks_fixed_in_batch: ClassVar[bool] = False
    """True where ``frozen_tensors`` depends only on its arguments and on state that changes outside a batch's
    pipeline run (``begin_step``, ``set_plan``, ``after_backward``, ``after_optimizer_step``): the freezing hook
    may then draw a batch's masks of every local (stage, microbatch) at once, when the batch begins
    (``timelyfreeze.hooks.freezing``)."""

    def __init__(self, cfg: Any, ctx: MethodContext):
        self.cfg = cfg
        self.ctx = ctx

    def phase(self, step: int) -> str:
        """Phase name written to the trace and metrics for ``step``."""
        return "train"

    def steady_phases(self, seen: set[str]) -> tuple[str, ...]:
        """Of the phases the run went through, those whose throughput the summary reports as steady
        (default: everything after warm-up and monitoring)."""
        return tuple(sorted(seen - {"warmup", "bootstrap", "upper", "lower"}))

    def begin_step(self, step: int) -> None:
        pass

    def frozen_tensors(self, step: int, stage: int, microbatch: int, accum: int = 0) -> frozenset[str]:
        """Names of stage ``stage``'s parameter tensors frozen for this microbatch's backward. ``accum`` is
        the gradient-accumulation batch of the step (0-based; always 0 without accumulation): methods that
        draw per microbatch draw afresh for each."""
        return frozenset()

    def after_backward(self, step: int) -> None:
        pass

    def after_optimizer_step(self, step: int) -> None:
        pass

    def observe_loss(self, step: int, loss: float | None) -> None:
        """The job's training loss of ``step`` (its metrics row's; None where no rank has one), told at the end
        of the step, after ``after_optimizer_step``."""

    # -- the plan (methods with ``monitor_phases``) -------------------------------------------------
    def needs_plan(self, step: int) -> bool:
        """True at the end of ``step`` when the runtime must make the plan and call ``set_plan``."""
        return False

    def set_plan(self, action_ratios: dict[str, float] | None, failure: str | None = None) -> None:
        """Install a plan's per-action freeze ratios (``{"1B3": 0.4, ...}``), or record why there is none."""
        raise NotImplementedError(f"method {self.name!r} takes no plan")

    # -- checkpoint and end of run ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """State saved with TorchTitan checkpoints, per rank: plain data (dicts, lists, tuples, numbers,
        strings, None) and tensors only (``timelyfreeze.runtime.state_codec`` stores it as JSON)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def summary(self) -> dict[str, Any]:
        """Method-specific figures for the end-of-run summary (JSON-serialisable)."""
        return {}

    def step_metrics(self) -> dict[str, float]:
        """This rank's method figures of the step just ended, for its ``metrics.jsonl`` row (summed over the
        ranks; called once per step after ``after_optimizer_step``); names from ``step_metric_names``."""
        return {}

    def close(self) -> None:
        """Release what the method started (e.g. a worker thread); called once at the end of the run."""
