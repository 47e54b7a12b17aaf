"""TimelyFreeze+APF and TimelyFreeze+AutoFreeze (TimelyFreeze Sec. 4.1; digest 1.9).

TimelyFreeze decides how much each backward action freezes (its planned, ramped ratio); the baseline's
metric decides which tensors: ``k`` tensors (``floor(ratio * n)`` plus one more with probability of the
fractional part, the count rule of ``uniform_subset``) are drawn without replacement by ``weighted_subset``
with weight 1.0 for the tensors the metric currently marks and 0.01 for the rest (the authors' code). So
the budget stays exactly TimelyFreeze's and the metric only biases the choice.

The metrics run exactly as in the stand-alone baselines (``APFMetric``, ``AutoFreezeMetric``), updated in
the same hooks; their marks only bias the selection, they never freeze anything by themselves.
"""

from typing import Any, Collection, Sequence

import torch

from timelyfreeze.methods.apf import APFMetric
from timelyfreeze.methods.autofreeze import AutoFreezeMetric
from timelyfreeze.methods.base import MethodContext
from timelyfreeze.methods.random_fixed import warmup_of
from timelyfreeze.methods.timely import TimelyFreezeMethod
from timelyfreeze.selection import action_generator, uniform_subset, weighted_subset

MARKED_WEIGHT = 1.0
"""Draw weight of a tensor the baseline metric marks as stable (authors' code, digest 1.9)."""
UNMARKED_WEIGHT = 0.01
"""Draw weight of every other freezable tensor (authors' code, digest 1.9)."""


def hybrid_select(
    names: Sequence[str], marked: Collection[str], ratio: float, gen: torch.Generator
) -> frozenset[str]:
    """``floor(ratio * n)`` (+1 with probability of the fractional part) of ``names``, drawn without
    replacement with weight 1 for ``marked`` names and 0.01 for the rest."""
    # the count by uniform_subset's own rule (floor, +1 with the fractional part's probability)
    k = len(uniform_subset(names, ratio, gen))
    if k == 0 or k >= len(names):
        return frozenset(names) if k else frozenset()
    marked = set(marked)
    weights = [MARKED_WEIGHT if x in marked else UNMARKED_WEIGHT for x in names]
    return weighted_subset(names, weights, k, gen)


class _MetricHybrid(TimelyFreezeMethod):
    """``select`` draws with the metric's marks as weights; subclasses own the metric."""

    def _marked(self, step: int, stage: int) -> Collection[str]:
        raise NotImplementedError

    def _names_of(self, stage: int) -> list[str]:
        return self._names[stage]

    def select(self, step: int, stage: int, microbatch: int, ratio: float) -> frozenset[str]:
        mask_step = self.mask_step(step) if hasattr(self, "mask_step") else step
        gen = action_generator(self.cfg.seed, mask_step, stage, microbatch)
        return hybrid_select(self._names_of(stage), self._marked(step, stage), ratio, gen)


class TimelyAPF(_MetricHybrid):
    """TimelyFreeze's per-action budget, APF's currently-frozen tensors preferred."""

    name = "timelyfreeze_apf"
    step_level = False

    def __init__(self, cfg: Any, ctx: MethodContext):
        super().__init__(cfg, ctx)
        self.metric = APFMetric(cfg.apf, ctx.stages, warmup_of(cfg, ctx))

    def _marked(self, step: int, stage: int) -> Collection[str]:
        return self.metric.marked(stage, step)

    def after_optimizer_step(self, step: int) -> None:
        super().after_optimizer_step(step)
        self.metric.update(step)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "apf_metric": self.metric.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "apf_metric" in state:
            self.metric.load_state_dict(state["apf_metric"])

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "apf_checks": self.metric.checks, "apf_threshold": self.metric.threshold}


class TimelyAutoFreeze(_MetricHybrid):
    """TimelyFreeze's per-action budget, AutoFreeze's frozen prefix preferred."""

    name = "timelyfreeze_autofreeze"
    step_level = False

    def __init__(self, cfg: Any, ctx: MethodContext):
        super().__init__(cfg, ctx)
        self.metric = AutoFreezeMetric(cfg.autofreeze, ctx.stages, warmup_of(cfg, ctx))

    def _marked(self, step: int, stage: int) -> Collection[str]:
        return self.metric.marked(stage)

    def after_backward(self, step: int) -> None:
        super().after_backward(step)
        self.metric.accumulate()
        if self.metric.is_check(step):
            self.metric.check(step, self.ctx.all_gather)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "autofreeze_metric": self.metric.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "autofreeze_metric" in state:
            self.metric.load_state_dict(state["autofreeze_metric"])

    def summary(self) -> dict[str, Any]:
        return {
            **super().summary(),
            "autofreeze_checks": self.metric.checks,
            "autofreeze_frozen_layers": self.metric.boundary,
        }
