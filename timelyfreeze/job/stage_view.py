"""One pipeline stage held by this rank, as a freezing method sees it (the runtime builds it:
``timelyfreeze.hooks.stage_layout``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class StageView:
    """One pipeline stage held by this rank, as a freezing method sees it."""

    stage: int
    """Global stage index (0 = first)."""
    module: torch.nn.Module
    """The stage's model part (what ``PipelineStage.submod`` runs)."""
    params: dict[str, torch.nn.Parameter]
    """Trainable parameter tensors of the stage by name, in registration order."""
    layer_of: dict[str, int]
    """Global layer index of every parameter, ordered front to back across *all* stages: the
    embedding is layer 0, transformer block ``k`` is layer ``k + 1``, the final norm and output
    projection share the last index. Prefix methods (AutoFreeze, Egeria, SmartPipe) freeze in this order."""
    layer_modules: dict[int, torch.nn.Module]
    """The module of each global layer index that lives on this stage (for forward hooks)."""
    is_first: bool
    is_last: bool
    anchor: str | None = None
    """On a stage whose input needs no gradient (the first), one small early tensor that is never
    frozen, so the stage's backward always has something to reach; ``None`` elsewhere. A method with
    ``may_freeze_anchor`` (Egeria, which freezes its prefix whole) may freeze it."""
    units: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Freezing units, front to back: unit name -> its tensors (``timelyfreeze.hooks.stage_layout.freeze_units``;
    the anchor in none). Methods that freeze a share of the stage sample whole units. Empty: every
    freezable tensor is a unit of its own."""

    @property
    def numels(self) -> dict[str, int]:
        return {n: p.numel() for n, p in self.params.items()}
