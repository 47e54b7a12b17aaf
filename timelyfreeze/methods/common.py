"""What several freezing methods share: a stage's freezable tensors, the warm-up they wait out, and
the front-to-back layer prefix that AutoFreeze, SmartPipe, Egeria and the AutoFreeze hybrid freeze."""

from __future__ import annotations

from typing import Any

import torch

from timelyfreeze.job.stage_view import StageView
from timelyfreeze.methods.base import MethodContext
from timelyfreeze.methods.selection import balanced_draw, larger_first


def freezable_names(view: StageView) -> list[str]:
    """The stage's parameter tensors a method may freeze: all of them, in registration order, but the anchor."""
    return [n for n in view.params if n != view.anchor]


class Units:
    """A stage's freezing units as sampling items: names, element counts, and the tensors each stands for.
    Methods that freeze a share of the stage draw unit names and hand the hook ``tensors(chosen)``."""

    def __init__(self, view: StageView):
        members = view.units or {n: (n,) for n in freezable_names(view)}
        self.names: list[str] = list(members)
        self.members = members
        self._size = {t: view.params[t].numel() for ts in members.values() for t in ts}
        self.numels: list[int] = [sum(self.sizes(u)) for u in self.names]
        self._key = larger_first(self.numels)
        """``balanced_subset``'s sort key of the units, made once (:meth:`balanced`)."""
        self._one_each = all(ts == (u,) for u, ts in members.items())
        """Every unit is the tensor of its name (``unit = "tensor"``): the chosen units are the tensors."""
        self._all = self.tensors(self.names)
        """Every tensor of the stage's units (:meth:`all_tensors`: one set, made once)."""

    def sizes(self, unit: str) -> list[int]:
        """Element counts of ``unit``'s tensors, in its order."""
        return [self._size[t] for t in self.members[unit]]

    def balanced(self, ratio: float, gen: torch.Generator) -> frozenset[str]:
        """The tensors of ``balanced_subset(names, numels, ratio, gen)``: the draw of TimelyFreeze and the random
        control."""
        return self.tensors(balanced_draw(self.names, self._key, ratio, gen))

    def tensors(self, chosen) -> frozenset[str]:
        """The tensors of the chosen units."""
        if self._one_each:
            return frozenset(chosen)
        return frozenset(t for u in chosen for t in self.members[u])

    def all_tensors(self) -> frozenset[str]:
        """The tensors of every unit: the same set each call."""
        return self._all


def warmup_of(cfg: Any, ctx: MethodContext) -> int:
    """Steps before any freezing: ``[freeze] warmup_steps``; where it is -1 (derived), the warm-up end the
    runtime derived for TimelyFreeze (``ctx.phases.warmup_end``), else the LR warm-up."""
    w = int(cfg.warmup_steps)
    if w >= 0:
        return w
    if ctx.phases is not None:
        return int(ctx.phases.warmup_end)
    return max(0, int(ctx.lr_warmup_steps))


class Prefix:
    """Maps a global prefix boundary (layers ``< boundary`` frozen) to each local stage's frozen names."""

    def __init__(self, stages: list[StageView]):
        self.views = {v.stage: v for v in stages}
        self._cache: dict[tuple[int, int], frozenset[str]] = {}
        # layer index -> this rank's (stage, names) with that layer; the anchor counts in the layer's
        # statistics (it is trained like the rest) but is never frozen
        self.local_layers: dict[int, list[tuple[int, list[str]]]] = {}
        for v in stages:
            per: dict[int, list[str]] = {}
            for n in v.params:
                per.setdefault(v.layer_of[n], []).append(n)
            for layer, names in per.items():
                self.local_layers.setdefault(layer, []).append((v.stage, names))

    def names(self, stage: int, boundary: int) -> frozenset[str]:
        key = (stage, boundary)
        if key not in self._cache:
            v = self.views[stage]
            self._cache[key] = frozenset(n for n in v.params if n != v.anchor and v.layer_of[n] < boundary)
        return self._cache[key]

    def layer_params(self, layer: int) -> list[torch.Tensor]:
        """All of this rank's tensors of ``layer`` (anchor included), for the layer's statistics."""
        return [self.views[s].params[n] for s, names in self.local_layers.get(layer, []) for n in names]


def merge_layer_stats(gathered: list[Any]) -> dict[int, float]:
    """Union of the per-layer dicts every rank sent (a layer lives on one stage; duplicates must agree)."""
    out: dict[int, float] = {}
    for d in gathered:
        for k, v in d.items():
            out[int(k)] = float(v)
    return out
