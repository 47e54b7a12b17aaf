"""Uniform random freezing: the pipeline-unaware control.

Two modes:

* ``ratio`` (the default): after the warm-up every backward action freezes the fixed ``ratio`` of its stage,
  drawn uniformly per (step, stage, microbatch); no monitoring, no plan.
* per stage (``ratio_per_stage``, or ``matched`` to a TimelyFreeze run): every backward action of stage ``s``
  freezes that stage's share, through TimelyFreeze's own phases (warm-up, both monitoring windows, the ramp,
  stable) and with the masks TimelyFreeze draws (same generator, same seed, same units). Matched to a
  TimelyFreeze run, it freezes the same share of each stage, spread uniformly instead of where the plan
  puts it: the control for what the plan's placement buys.
"""

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.errors import PlannerError
from planner.trace.archive import TRACE_NAME, find_trace
from planner.trace.load import load_trace, phase_stage_ratios
from timelyfreeze.job.errors import FreezeConfigError
from timelyfreeze.job.fields import check_section, fail
from timelyfreeze.methods.base import FreezeMethod, MethodContext
from timelyfreeze.methods.common import Units, warmup_of
from timelyfreeze.methods.timely import TimelyFreezeMethod


@dataclass
class RandomConfig:
    ratio: float = 0.5
    """Fraction of a stage's freezable parameter tensors frozen in every backward action after warm-up,
    chosen uniformly at random per (step, stage, microbatch). Not from a paper; 0.5 sits between the
    r_max values TimelyFreeze used (0.5 ConvNeXt, 0.8 LLaMA/ViT; digest 6)."""

    ratio_per_stage: list[float] = field(default_factory=list)
    """One share per pipeline stage (global stage order) instead of ``ratio``: every backward action of stage
    ``s`` freezes ``ratio_per_stage[s]`` of it, through TimelyFreeze's phases (monitoring windows, ramp) and
    with TimelyFreeze's masks. Empty (the default): ``ratio``."""

    matched: str = ""
    """A TimelyFreeze run's dump folder (or its ``timelyfreeze/`` output folder): take ``ratio_per_stage`` from
    that run's trace, each stage's mean realised freeze ratio over its backward actions in the stable phase
    (``planner.trace.load.phase_stage_ratios``). Empty (the default): no matching."""

    def validate(self, section: str = "freeze.random") -> None:
        """``FreezeConfigError`` naming the field for a share outside [0, 1], both per-stage fields set, or a
        ``matched`` folder without a trace."""
        check_section(self, section, (("ratio", lambda v: 0.0 <= v <= 1.0, "must lie in [0, 1]"),))
        for i, v in enumerate(self.ratio_per_stage):
            if not 0.0 <= v <= 1.0:
                fail(section, f"ratio_per_stage[{i}]", v, "must lie in [0, 1]")
        if self.matched and self.ratio_per_stage:
            fail(section, "matched", self.matched, "give either matched or ratio_per_stage, not both")
        if self.matched and matched_trace_dir(self.matched) is None:
            fail(
                section,
                "matched",
                self.matched,
                "no TimelyFreeze trace there (expected <folder>/timelyfreeze/trace or trace.tar.gz)",
            )


def matched_trace_dir(folder: str) -> Path | None:
    """The trace of a run's dump folder or of its ``timelyfreeze/`` output folder, if it has one: the trace folder
    or, once packed, its ``trace.tar.gz`` (``planner.trace.archive.find_trace``)."""
    for path in (os.path.join(folder, "timelyfreeze", TRACE_NAME), os.path.join(folder, TRACE_NAME)):
        if (found := find_trace(path)) is not None:
            return found
    return None


def stage_shares(cfg: RandomConfig, num_stages: int) -> list[float] | None:
    """The per-stage shares of ``cfg`` (from ``matched`` or ``ratio_per_stage``), or None in ``ratio`` mode."""
    if cfg.matched:
        trace_dir = matched_trace_dir(cfg.matched)
        try:
            trace = load_trace(trace_dir)
        except PlannerError as e:
            raise FreezeConfigError(f"[freeze.random] matched = {cfg.matched!r}: {e}") from None
        if not any(r.phase == "stable" for r in trace.records):
            raise FreezeConfigError(f"[freeze.random] matched = {cfg.matched!r}: that run has no stable phase")
        shares = phase_stage_ratios(trace, "stable")
        where = "matched"
    elif cfg.ratio_per_stage:
        shares, where = [float(v) for v in cfg.ratio_per_stage], "ratio_per_stage"
    else:
        return None
    if len(shares) != num_stages:
        raise FreezeConfigError(
            f"[freeze.random] {where}: {len(shares)} stage shares for a pipeline of {num_stages} stages"
        )
    return shares


class RandomFixed(TimelyFreezeMethod):
    """Uniform random freezing (module docstring); no profiling, no plan, no metric."""

    name = "random"
    monitor_phases = ()

    def __init__(self, cfg: Any, ctx: MethodContext):
        self.shares = stage_shares(cfg.random, ctx.num_stages)
        """Per-stage shares (per-stage mode), or None (``ratio`` mode)."""
        self.ratio = float(cfg.random.ratio)  # validated: RandomConfig.validate
        self.seed = int(cfg.seed)
        if self.shares is None:  # ratio mode: no phases of TimelyFreeze's
            FreezeMethod.__init__(self, cfg, ctx)
            self._units = {v.stage: Units(v) for v in ctx.stages}
            self.warmup_steps = warmup_of(cfg, ctx)
            return
        super().__init__(cfg, ctx)
        self.planned_ratio = {
            (s, m): self.shares[s] for s in range(ctx.num_stages) for m in range(ctx.num_microbatches)
        }

    def needs_plan(self, step: int) -> bool:
        return False

    def phase(self, step: int) -> str:
        if self.shares is not None:
            return super().phase(step)
        return "warmup" if step <= self.warmup_steps else "active"

    def steady_phases(self, seen: set[str]) -> tuple[str, ...]:
        if self.shares is not None:
            return super().steady_phases(seen)
        return FreezeMethod.steady_phases(self, seen)

    def frozen_tensors(self, step: int, stage: int, microbatch: int, accum: int = 0) -> frozenset[str]:
        if self.shares is not None:
            return super().frozen_tensors(step, stage, microbatch, accum)
        if step <= self.warmup_steps or self.ratio == 0.0:
            return frozenset()
        gen = self.generator(self.seed, step, stage, microbatch, accum)
        return self._units[stage].balanced(self.ratio, gen)

    def state_dict(self) -> dict[str, Any]:
        return {}  # everything comes from the config (and the matched run's trace)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def summary(self) -> dict[str, Any]:
        if self.shares is None:
            return {"ratio": self.ratio}
        return {"ratio_per_stage": self.shares, "matched": self.cfg.random.matched or None}
