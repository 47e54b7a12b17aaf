"""APF (Chen et al., ICDCS'21 / TPDS'23) as a step-level freezing baseline, and its metric for the hybrid.

Per parameter tensor: effective perturbation P = |EMA(D)| / EMA(|D|) of the cumulative update D since the
last check; tensors with P below the threshold are frozen for a TCP-like (additive increase,
multiplicative decrease) period.
"""

from dataclasses import dataclass


@dataclass
class APFConfig:
    threshold: float = 0.01
    """Stability threshold phi on the effective perturbation |EMA(D)|/EMA(|D|) in [0, 1]. 0.01 is the value
    TimelyFreeze used for LLaMA-3.2-1B (digest 1.10/6; 0.0001 for 8B/13B, 0.005 for ViT/ConvNeXt); the
    authors' fork defaults to 0.05, the original APF release to 0.1."""
    ema_alpha: float = 0.99
    """EMA decay of the update statistics (digest 1.10: authors' fork, comment "paper: 0.99")."""
    check_every: int = 10
    """Steps between stability checks; also the unit by which a stable tensor's freezing period grows
    (digest 1.10/6: fork's ``stability_check_freq`` = 10)."""
