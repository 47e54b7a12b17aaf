"""TimelyFreeze+APF and TimelyFreeze+AutoFreeze (TimelyFreeze Sec. 4.1; digest 1.9).

TimelyFreeze decides how much each backward action freezes (its planned, ramped ratio ``r``); the
baseline's metric decides which tensors are preferred. Tensor ``i`` of the stage (``n_i`` elements,
weight ``w_i`` = 1.0 if the metric currently marks it, 0.01 otherwise: the authors' weights) is frozen
with probability ``p_i = min(1, c * w_i)``, where ``c`` is the one value that makes the expected frozen
elements the plan's, ``sum_i p_i * n_i = r * sum_i n_i`` (``selection.inclusion_probabilities``); the
subset is drawn with exactly these marginals by systematic sampling on a random order
(``selection.systematic_subset``). So the element budget is exactly TimelyFreeze's in expectation, as
``uniform_subset``'s, and the metric only biases the choice: a marked tensor is 100 times as likely to
be frozen as an unmarked one unless it is frozen for sure. With no tensor marked (or all of them) every
tensor is frozen with probability ``r``, as in plain TimelyFreeze.

The metrics run exactly as in the stand-alone baselines (``APFMetric``, ``AutoFreezeMetric``), updated in
the same hooks; their marks only bias the selection, they never freeze anything by themselves.
"""

from typing import Any, Collection, Sequence

import torch

from timelyfreeze.methods.apf import APFMetric
from timelyfreeze.methods.autofreeze import AutoFreezeMetric
from timelyfreeze.methods.base import MethodContext
from timelyfreeze.methods.common import Units, warmup_of
from timelyfreeze.methods.selection import inclusion_probabilities, systematic_subset
from timelyfreeze.methods.timely import TimelyFreezeMethod

MARKED_WEIGHT = 1.0
"""Preference weight of a tensor the baseline metric marks as stable (authors' code, digest 1.9)."""
UNMARKED_WEIGHT = 0.01
"""Preference weight of every other freezable tensor (authors' code, digest 1.9)."""


def preference_weight(marks: Sequence[bool], sizes: Sequence[int]) -> float:
    """The preference weight of a unit whose tensors the metric marks as ``marks`` (``sizes``: their element
    counts): ``MARKED_WEIGHT`` if it marks all of them, ``UNMARKED_WEIGHT`` if none, else the element-weighted
    mean of the two (a block unit the metric marks in part, ``[freeze] unit = "block"``)."""
    if all(marks):
        return MARKED_WEIGHT
    if not any(marks):
        return UNMARKED_WEIGHT
    return sum((MARKED_WEIGHT if m else UNMARKED_WEIGHT) * k for m, k in zip(marks, sizes)) / max(1, sum(sizes))


def hybrid_probabilities(
    names: Sequence[str], numels: Sequence[int], marked: Collection[str], ratio: float
) -> list[float]:
    """Each of ``names``' probability of being frozen: ``min(1, c * w)`` with ``w`` 1.0 for ``marked``
    names and 0.01 for the rest, ``c`` such that the expected frozen elements are ``ratio`` of
    ``sum(numels)`` (``numels[i]`` is ``names[i]``'s element count)."""
    marked = set(marked)
    weights = [preference_weight([x in marked], [n]) for x, n in zip(names, numels)]
    return inclusion_probabilities(numels, weights, ratio)


def hybrid_select(
    names: Sequence[str], numels: Sequence[int], marked: Collection[str], ratio: float, gen: torch.Generator
) -> frozenset[str]:
    """A subset of ``names`` drawn with ``hybrid_probabilities`` as its exact marginals."""
    return systematic_subset(names, hybrid_probabilities(names, numels, marked, ratio), gen)


def unit_weights(units: Units, marked: Collection[str]) -> list[float]:
    """Each unit's ``preference_weight`` under the metric's ``marked`` tensors."""
    marked = set(marked)
    return [preference_weight([t in marked for t in units.members[u]], units.sizes(u)) for u in units.names]


class _MetricHybrid(TimelyFreezeMethod):
    """``select`` draws with the metric's marks as weights; subclasses own the metric."""

    def _marked(self, step: int, stage: int) -> Collection[str]:
        raise NotImplementedError

    def select(self, step: int, stage: int, microbatch: int, ratio: float, accum: int = 0) -> frozenset[str]:
        gen = self.generator(self.cfg.seed, self.mask_step(step), stage, microbatch, accum)
        units = self._units[stage]
        probs = inclusion_probabilities(units.numels, unit_weights(units, self._marked(step, stage)), ratio)
        return units.tensors(systematic_subset(units.names, probs, gen))


class TimelyAPF(_MetricHybrid):
    """TimelyFreeze's per-action budget, APF's currently-frozen tensors preferred."""

    name = "timelyfreeze_apf"

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
