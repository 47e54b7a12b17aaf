"""Random choice of which parameter tensors a backward action leaves out.

Freezing works on whole parameter tensors, so a planned ratio ``r`` is met in expectation: tensor ``i``
(``n_i`` elements) is frozen with a marginal probability ``p_i`` and the expected frozen element count
``sum_i p_i * n_i`` is ``r * sum_i n_i``.

``balanced_subset`` (TimelyFreeze, the random control) gives every tensor ``p_i = r``, so every *element*
is frozen with probability ``r``; it draws ``floor(r * n)`` or ``ceil(r * n)`` tensors, and by sampling
systematically along the tensors sorted by size it keeps the frozen element count within one tensor of
``r`` times the stage's elements, so an action's time scatters little around the plan's line.
``uniform_subset`` (a random permutation; the same marginals and count, but element counts that vary
by several tensors) is kept for comparison.

The hybrids prefer some tensors (weight ``w_i > 0``) without changing the element budget:
``inclusion_probabilities`` gives ``p_i = min(1, c * w_i)`` with the one ``c`` that makes
``sum_i p_i * n_i = r * sum_i n_i`` (exact: piecewise-linear water-filling solved in closed form on the
right segment), and ``systematic_subset`` draws a subset with exactly those marginals. With equal weights
``p_i = r`` for every tensor, which is ``uniform_subset``'s distribution.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from typing import Iterable, Sequence

import torch


def action_generator(
    seed: int, step: int, stage: int, microbatch: int, accum: int = 0, into: torch.Generator | None = None
) -> torch.Generator:
    """A CPU generator seeded by (seed, step, stage, microbatch, accumulation step): reproducible across
    runs and ranks, and a fresh draw for every gradient-accumulation batch of a step (``accum`` 0 keeps
    the seed of a run without accumulation). ``into``: reseed that generator and return it instead of
    making one (``manual_seed`` resets a CPU generator's whole state, so it draws what a new one would;
    the caller owns it and must not share it between threads)."""
    key = f"{seed}/{step}/{stage}/{microbatch}" + (f"/{accum}" if accum else "")
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    g = into if into is not None else torch.Generator()
    g.manual_seed(int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF)
    return g


def _clamp_ratio(ratio: float) -> float:
    return min(max(float(ratio), 0.0), 1.0)


def uniform_subset(names: Sequence[str], ratio: float, gen: torch.Generator) -> frozenset[str]:
    """Each of ``names`` is chosen with probability ``ratio`` (clamped to [0, 1]); the count chosen is
    ``floor(ratio * n)`` plus one more with probability equal to the fractional part."""
    n = len(names)
    ratio = _clamp_ratio(ratio)
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


def inclusion_probabilities(numels: Sequence[int], weights: Sequence[float], ratio: float) -> list[float]:
    """Per-tensor inclusion probabilities ``p_i = min(1, c * w_i)`` whose expected element count is the
    ratio's: ``sum_i p_i * numels[i] == ratio * sum_i numels[i]`` (up to float rounding).

    ``ratio`` is clamped to [0, 1]; 0 gives all zeros, 1 all ones. Weights must be finite and > 0, so
    every tensor can be frozen and the budget can always be met. ``f(c) = sum_i min(1, c w_i) n_i`` is
    continuous, non-decreasing and linear between the breakpoints ``c = 1 / w``; the levels are
    saturated (``p = 1``) from the heaviest weight down while the solution on the current segment,
    ``c = (target - saturated elements) / sum_unsaturated(w_i n_i)``, would exceed ``1 / w`` of the
    heaviest unsaturated level. Equal weights give ``p_i = ratio`` exactly (no division); tensors
    without elements do not affect the budget and get ``min(1, c w_i)``; if no tensor has elements,
    every ``p_i`` is ``ratio``."""
    n = len(numels)
    if len(weights) != n:
        raise ValueError(f"{n} tensor sizes but {len(weights)} weights")
    sizes = [int(x) for x in numels]
    w = [float(x) for x in weights]
    if any(s < 0 for s in sizes):
        raise ValueError("tensor sizes must be non-negative")
    if not all(math.isfinite(x) and x > 0 for x in w):
        raise ValueError("weights must be finite and positive")
    ratio = _clamp_ratio(ratio)
    if ratio == 0.0:
        return [0.0] * n
    if ratio == 1.0:
        return [1.0] * n
    total = sum(sizes)
    if n == 0 or min(w) == max(w) or total == 0:
        return [ratio] * n
    target = ratio * total
    # elements and weighted elements per weight level, heaviest first
    level_n: dict[float, int] = {}
    level_wn: dict[float, list[float]] = {}
    for s, x in zip(sizes, w):
        if s > 0:
            level_n[x] = level_n.get(x, 0) + s
            level_wn.setdefault(x, []).append(x * s)
    levels = sorted(level_n, reverse=True)
    saturated = 0
    c = math.inf
    for k, wl in enumerate(levels):
        rest = math.fsum(v for lv in levels[k:] for v in level_wn[lv])
        c = (target - saturated) / rest
        # target < total, so the lightest level is never saturated (past rounding, which min() absorbs)
        if c * wl <= 1.0 or k == len(levels) - 1:
            break
        saturated += level_n[wl]
    return [min(1.0, c * x) for x in w]


def systematic_subset(names: Sequence[str], probs: Sequence[float], gen: torch.Generator) -> frozenset[str]:
    """A subset of ``names`` that contains ``names[i]`` with probability exactly ``probs[i]``.

    Systematic (Madow) sampling on a random order: names with ``p >= 1`` are always in, ``p <= 0``
    never; the others are put in a random order (``torch.randperm``), their probabilities laid end to
    end on [0, sum p), and those whose interval holds one of the points ``u, u + 1, u + 2, ...`` (one
    uniform ``u`` in [0, 1)) are chosen. Each interval is shorter than 1, so it holds a point with
    probability equal to its length: the marginals are exact by construction (conditional Poisson
    sampling only reaches them to a solver tolerance). The count drawn is ``floor(sum p)`` or
    ``ceil(sum p)``, the least variance any design with these marginals has, as ``uniform_subset``'s
    count; the random order keeps pairs of tensors from always (or never) being drawn together.
    Two draws from ``gen`` (the permutation, then ``u``), so the result is a function of its state."""
    if len(probs) != len(names):
        raise ValueError(f"{len(names)} names but {len(probs)} probabilities")
    chosen = [x for x, p in zip(names, probs) if p >= 1.0]
    frac = [(x, float(p)) for x, p in zip(names, probs) if 0.0 < p < 1.0]
    if frac:
        perm = torch.randperm(len(frac), generator=gen).tolist()
        u = torch.rand((), dtype=torch.float64, generator=gen).item()
        chosen += systematic_pick([frac[i] for i in perm], u)
    return frozenset(chosen)


def systematic_pick(ordered: Sequence[tuple[str, float]], u: float) -> list[str]:
    """Systematic sampling along a fixed order: the probabilities (each in [0, 1]) laid end to end, and
    the names whose interval ``[lo, hi)`` holds one of ``u, u + 1, u + 2, ...`` (``u`` in [0, 1)). For ``u``
    uniform, a name is picked with probability equal to its interval's length."""
    return _pick((x for x, _ in ordered), (p for _, p in ordered), u)


def _pick(names: Iterable[str], probs: Iterable[float], u: float) -> list[str]:
    """``systematic_pick`` of ``zip(names, probs)``. The intervals' ends are summed in order (``lo + p``),
    and ``ceil(end - u)`` is computed once per end, for the interval it closes and the one it opens."""
    out = []
    lo = 0.0
    below = math.ceil(lo - u)
    for x, p in zip(names, probs):
        lo += p
        above = math.ceil(lo - u)
        if above > below:  # an integer in [lo - p - u, lo - u): the interval holds a point
            out.append(x)
        below = above
    return out


def balanced_subset(names: Sequence[str], numels: Sequence[int], ratio: float, gen: torch.Generator) -> frozenset[str]:
    """Each of ``names`` is chosen with probability exactly ``ratio`` (as in ``uniform_subset``), and the
    chosen *elements* stay close to ``ratio`` times the total: at most the largest tensor's size away.

    Systematic sampling with ``p = ratio`` along the tensors sorted by size, largest first (tensors of
    equal size in a random order, ``torch.randperm``), from one uniform start ``u``. A tensor's interval
    has length ``ratio``, so its marginal is exactly ``ratio`` and every element is frozen with
    probability ``ratio``, the TimelyFreeze guarantee. The count is ``floor`` or ``ceil`` of
    ``ratio * n``, as ``uniform_subset``'s. The element count is a sum of a non-increasing step function
    at the points ``u + k``, which differs from its integral (``ratio`` x total elements) by less than
    the function's maximum, the largest tensor; a uniform random subset of the same count can be off by
    several large tensors (on a first stage, the embedding alone is ~17 % of the elements).
    Two draws from ``gen`` (the permutation, then ``u``)."""
    if len(numels) != len(names):
        raise ValueError(f"{len(names)} names but {len(numels)} sizes")
    return balanced_draw(names, larger_first(numels), ratio, gen)


def larger_first(numels: Sequence[int]) -> list[int]:
    """``balanced_subset``'s sort key of every position (larger tensors first), for a caller that draws from the same
    tensors often (``methods.common.Units``) to make once."""
    return [-int(x) for x in numels]


def balanced_draw(names: Sequence[str], key: Sequence[int], ratio: float, gen: torch.Generator) -> frozenset[str]:
    """``balanced_subset(names, numels, ratio, gen)`` with ``key = larger_first(numels)`` made by the caller."""
    ratio = _clamp_ratio(ratio)
    if not names or ratio == 0.0:
        return frozenset()
    if ratio == 1.0:
        return frozenset(names)
    order = torch.randperm(len(names), generator=gen).tolist()
    order.sort(key=key.__getitem__)  # stable: equal sizes keep the random order
    u = torch.rand((), dtype=torch.float64, generator=gen).item()
    return frozenset(_pick(map(names.__getitem__, order), itertools.repeat(ratio), u))
