"""Fixed-ratio uniform random freezing: the pipeline-unaware control."""

from dataclasses import dataclass
from typing import Any

from timelyfreeze.fields import check_section
from timelyfreeze.methods.base import FreezeMethod, MethodContext
from timelyfreeze.methods.common import Units, warmup_of
from timelyfreeze.selection import action_generator, balanced_subset


@dataclass
class RandomConfig:
    ratio: float = 0.5
    """Fraction of a stage's freezable parameter tensors frozen in every backward action after warm-up,
    chosen uniformly at random per (step, stage, microbatch). Not from a paper; 0.5 sits between the
    r_max values TimelyFreeze used (0.5 ConvNeXt, 0.8 LLaMA/ViT; digest 6)."""

    def validate(self, section: str = "freeze.random") -> None:
        """``FreezeConfigError`` naming the field if ``ratio`` is not a number in [0, 1]."""
        check_section(self, section, (("ratio", lambda v: 0.0 <= v <= 1.0, "must lie in [0, 1]"),))


class RandomFixed(FreezeMethod):
    """Every backward action after warm-up freezes the fixed ``ratio`` of its stage's freezable tensors,
    drawn uniformly per (step, stage, microbatch); no profiling, no planning, no metric."""

    name = "random"

    def __init__(self, cfg: Any, ctx: MethodContext):
        super().__init__(cfg, ctx)
        self.ratio = float(cfg.random.ratio)  # validated: RandomConfig.validate
        self.seed = int(cfg.seed)
        self.warmup_steps = warmup_of(cfg, ctx)
        self._units = {v.stage: Units(v) for v in ctx.stages}

    def phase(self, step: int) -> str:
        return "warmup" if step <= self.warmup_steps else "active"

    def frozen_tensors(self, step: int, stage: int, microbatch: int, accum: int = 0) -> frozenset[str]:
        if step <= self.warmup_steps or self.ratio == 0.0:
            return frozenset()
        gen = action_generator(self.seed, step, stage, microbatch, accum)
        units = self._units[stage]
        return units.tensors(balanced_subset(units.names, units.numels, self.ratio, gen))

    def summary(self) -> dict[str, Any]:
        return {"ratio": self.ratio}
