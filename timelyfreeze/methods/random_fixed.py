"""Fixed-ratio uniform random freezing: the pipeline-unaware control."""

from dataclasses import dataclass


@dataclass
class RandomConfig:
    ratio: float = 0.5
    """Fraction of a stage's freezable parameter tensors frozen in every backward action after warm-up,
    chosen uniformly at random per (step, stage, microbatch). Not from a paper; 0.5 sits between the
    r_max values TimelyFreeze used (0.5 ConvNeXt, 0.8 LLaMA/ViT; digest 6)."""
