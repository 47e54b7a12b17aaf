"""AutoFreeze (Liu, Agarwal, Venkataraman 2021) as a step-level prefix-freezing baseline, and its metric."""

from dataclasses import dataclass


@dataclass
class AutoFreezeConfig:
    percentile: float = 80.0
    """p: a block freezes (in prefix order) while its gradient-norm change is below the p-th percentile of
    the changes of the still-active layers. 80 is what TimelyFreeze used for all five models (digest
    1.10/6); the authors' fork and PipeTransformer default to 50."""
    check_every: int = 10
    """Steps between checks (digest 1.10/6: fork's ``stability_check_freq`` = 10). A layer's gradient norm
    at a check is the per-step L1 gradient norm summed over the steps since the previous check, as the
    official AutoFreeze code accumulates it (anchors 1.3)."""
