"""Random choice of which parameter tensors a backward action leaves out.

Freezing works on whole parameter tensors. ``uniform_subset`` gives every tensor the same inclusion
probability ``ratio`` (so every *element* is frozen with probability ``ratio`` and the expected frozen
element count is exactly ``ratio`` times the stage's trainable elements), while drawing a fixed count
``floor(ratio * n)`` or ``ceil(ratio * n)`` of tensors to keep the variance low.
``weighted_subset`` is the hybrids' biased draw: ``k`` tensors without replacement, each pick
proportional to its weight among those left.
"""

from __future__ import annotations

import hashlib
import math
from typing import Sequence

import torch


def action_generator(seed: int, step: int, stage: int, microbatch: int) -> torch.Generator:
    """A CPU generator seeded by (seed, step, stage, microbatch): reproducible across runs and ranks."""
    digest = hashlib.blake2b(f"{seed}/{step}/{stage}/{microbatch}".encode(), digest_size=8).digest()
    g = torch.Generator()
    g.manual_seed(int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF)
    return g


def uniform_subset(names: Sequence[str], ratio: float, gen: torch.Generator) -> frozenset[str]:
    """Each of ``names`` is chosen with probability ``ratio`` (clamped to [0, 1]); the count chosen is
    ``floor(ratio * n)`` plus one more with probability equal to the fractional part."""
    n = len(names)
    ratio = min(max(float(ratio), 0.0), 1.0)
    if n == 0 or ratio == 0.0:
        return frozenset()
    target = ratio * n
    k = math.floor(target)
    frac = target - k
    if frac > 0 and torch.rand((), generator=gen).item() < frac:
        k += 1
    if k >= n:
        return frozenset(names)
    perm = torch.randperm(n, generator=gen).tolist()
    return frozenset(names[i] for i in perm[:k])


def weighted_subset(
    names: Sequence[str], weights: Sequence[float], k: int, gen: torch.Generator
) -> frozenset[str]:
    """``k`` distinct names drawn without replacement, each draw proportional to the remaining weights."""
    n = len(names)
    k = max(0, min(int(k), n))
    if k == 0:
        return frozenset()
    if k == n:
        return frozenset(names)
    w = torch.tensor([float(x) for x in weights], dtype=torch.float64)
    if (w < 0).any() or not torch.isfinite(w).all() or w.sum() <= 0:
        raise ValueError("weights must be finite, non-negative and not all zero")
    idx = torch.multinomial(w, k, replacement=False, generator=gen).tolist()
    return frozenset(names[i] for i in idx)


def expected_count(ratio: float, n: int) -> float:
    """The expected number of tensors ``uniform_subset`` returns (``ratio * n``, ratio clamped)."""
    return min(max(float(ratio), 0.0), 1.0) * n
