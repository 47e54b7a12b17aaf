"""Egeria (Wang et al., EuroSys'23) as a step-level prefix-freezing baseline for pipeline stages."""

from dataclasses import dataclass


@dataclass
class EgeriaConfig:
    eval_every: int = 0
    """n: steps between plasticity evaluations (and bootstrapping loss checks). 0 = the paper's guideline
    n = total_steps / (W*2) / num_modules / (1 + 0.5 + 0.25), at least 1 (egeria-paper "Hyperparameters
    guideline"; gives n = 300 for ResNet-56, 78k iterations, 7 modules, W = 10)."""
    window: int = 10
    """W: smoothing window, linear-fit window, number of low-slope evaluations before freezing, and the
    reference-model refresh period in evaluations (digest 2.6/6: W = 10). Halved after an LR-drop unfreeze."""
    tolerance_coef: float = 0.2
    """T = tolerance_coef x the largest |slope| among a module's first ``tolerance_readings`` readings
    (digest 2.6/6: 20%)."""
    tolerance_readings: int = 3
    """Number of initial slope readings of a module from which its tolerance T is set (digest 2.6: 3)."""
    bootstrap_loss_rate: float = 0.1
    """Bootstrapping ends when the relative change of the training loss between consecutive evaluations
    falls below this (digest 2.2: "permissively set to 10%")."""
    unfreeze_lr_drop: float = 10.0
    """Unfreeze all modules when the learning rate has dropped by this factor since the frontmost frozen
    module's freeze (digest 2.7: 10x)."""
    quantize: bool = True
    """int8 dynamic quantisation of the CPU reference copy (digest 2.4: dynamic for NLP models); False =
    fp32 reference (the paper's fallback for sensitive models)."""
