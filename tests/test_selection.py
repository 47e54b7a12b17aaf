"""Element-budget selection: ``inclusion_probabilities`` (water-filling) and ``systematic_subset``."""

import math
import random

import pytest
import torch

from timelyfreeze.methods.selection import (
    action_generator,
    balanced_subset,
    inclusion_probabilities,
    systematic_pick,
    systematic_subset,
    uniform_subset,
)


def _random_case(rng: random.Random):
    n = rng.randint(1, 40)
    sizes = [int(10 ** rng.uniform(0, 7)) for _ in range(n)]
    if rng.random() < 0.2:
        sizes[rng.randrange(n)] = 0
    weights = [rng.choice((1.0, 0.01)) if rng.random() < 0.7 else rng.uniform(0.001, 5.0) for _ in range(n)]
    ratio = rng.choice((rng.random(), rng.random(), 1e-6, 0.999999, 1 - 2**-53, 5e-324))
    return sizes, weights, ratio


def test_marginals_meet_the_element_budget_exactly():
    rng = random.Random(1234)
    for _ in range(1000):
        sizes, weights, ratio = _random_case(rng)
        p = inclusion_probabilities(sizes, weights, ratio)
        total = sum(sizes)
        assert all(0.0 <= x <= 1.0 for x in p)
        assert abs(math.fsum(x * s for x, s in zip(p, sizes)) - ratio * total) <= 1e-9 * max(total, 1)
        # p_i = min(1, c * w_i) for one c: proportional to the weight below saturation, monotone in it
        c = max(x / w for x, w in zip(p, weights) if x < 1.0) if min(p) < 1.0 else None
        for x, w in zip(p, weights):
            if c is not None:
                assert math.isclose(x, min(1.0, c * w), rel_tol=1e-12, abs_tol=1e-15)
        for xa, wa in zip(p, weights):
            for xb, wb in zip(p, weights):
                if wa > wb:
                    assert xa >= xb


def test_edge_ratios_and_equal_weights():
    sizes = [131072 * 4, 64, 4096, 4096, 17, 1_000_000]
    for w in ([1.0] * 6, [0.01] * 6):  # no tensor marked, or all of them: the plain rule
        for r in (0.0, 1e-3, 0.3, 0.5, 0.9, 1.0):
            assert inclusion_probabilities(sizes, w, r) == [r] * 6
    mixed = [1.0, 0.01, 1.0, 0.01, 0.01, 0.01]
    assert inclusion_probabilities(sizes, mixed, 0.0) == [0.0] * 6
    assert inclusion_probabilities(sizes, mixed, -0.5) == [0.0] * 6
    assert inclusion_probabilities(sizes, mixed, 1.0) == [1.0] * 6
    assert inclusion_probabilities(sizes, mixed, 1.5) == [1.0] * 6
    assert inclusion_probabilities([], [], 0.4) == []
    assert inclusion_probabilities([0, 0], [1.0, 0.01], 0.4) == [0.4, 0.4]
    g = action_generator(0, 1, 0, 0)
    assert systematic_subset(list("abcdef"), inclusion_probabilities(sizes, mixed, 0.0), g) == frozenset()
    assert systematic_subset(list("abcdef"), inclusion_probabilities(sizes, mixed, 1.0), g) == frozenset("abcdef")
    assert systematic_subset([], [], g) == frozenset()
    with pytest.raises(ValueError):
        inclusion_probabilities([1, 2], [1.0, 0.0], 0.5)
    with pytest.raises(ValueError):
        inclusion_probabilities([1, 2], [1.0], 0.5)
    with pytest.raises(ValueError):
        systematic_subset(["a"], [0.5, 0.5], g)


def test_preferred_tensors_are_frozen_more_often_at_equal_size():
    sizes = [1000, 1000, 50, 50, 8000, 7]
    w = [1.0, 0.01, 1.0, 0.01, 0.01, 0.01]
    for r in (1e-4, 0.05, 0.2, 0.5, 0.8, 0.99):
        p = inclusion_probabilities(sizes, w, r)
        assert p[0] > p[1] and p[2] > p[3]
        assert p[1] < 1.0 and p[3] < 1.0
        # the authors' 100:1 preference until a preferred tensor is certain to be frozen
        assert p[0] == 1.0 or math.isclose(p[0], 100 * p[1], rel_tol=1e-12)


# a stage-like set of tensors: an embedding of ~17% of the elements, big matrices, small norms
NAMES = ["emb"] + [f"l{k}.{t}" for k in range(4) for t in ("wq", "wo", "w1", "w2", "norm")] + ["out_norm"]
SIZES = [1_000_000] + [s for _ in range(4) for s in (262_144, 262_144, 700_000, 700_000, 512)] + [512]
MARKED = {"emb", "l0.wq", "l0.norm", "l1.w1", "l2.norm", "out_norm"}
WEIGHTS = [1.0 if x in MARKED else 0.01 for x in NAMES]
DRAWS = 20_000


@pytest.fixture(scope="module", params=[0.05, 0.3, 0.7])
def draws(request):
    r = request.param
    p = inclusion_probabilities(SIZES, WEIGHTS, r)
    sets = [systematic_subset(NAMES, p, action_generator(11, s, 0, 0)) for s in range(DRAWS)]
    return r, p, sets


def test_mean_frozen_elements_match_the_ratio(draws):
    r, p, sets = draws
    size = dict(zip(NAMES, SIZES))
    total = sum(SIZES)
    mean = sum(sum(size[x] for x in s) for s in sets) / (DRAWS * total)
    # the frozen share X of one draw lies in [0, 1] with mean r, so Var X <= r (1 - r): 7 standard errors
    tol = 7 * math.sqrt(r * (1 - r) / DRAWS)
    assert abs(mean - r) < tol
    # the count drawn is floor or ceil of the expected count
    counts = {len(s) for s in sets}
    assert counts <= {math.floor(sum(p)), math.ceil(sum(p))}


def test_each_tensor_is_drawn_with_its_marginal(draws):
    r, p, sets = draws
    for x, px in zip(NAMES, p):
        freq = sum(x in s for s in sets) / DRAWS
        assert abs(freq - px) <= 7 * math.sqrt(px * (1 - px) / DRAWS) + 1e-12, (x, freq, px)
    # same size, marked vs not: the marked one is frozen more often
    freq = {x: sum(x in s for s in sets) / DRAWS for x in NAMES}
    assert freq["l0.wq"] > freq["l1.wq"] and freq["l1.w1"] > freq["l0.w1"] and freq["l0.norm"] > freq["l1.norm"]


def test_equal_marginals_behave_like_uniform_subset():
    # p_i = r for all: a fixed count floor/ceil(r n) (mean r n), every tensor with frequency r
    names = [f"t{i}" for i in range(20)]
    trials = 2000
    for r in (0.05, 0.33, 0.77):
        sets = [systematic_subset(names, [r] * 20, action_generator(0, s, 0, 0)) for s in range(trials)]
        counts = [len(x) for x in sets]
        assert set(counts) <= {math.floor(20 * r), math.ceil(20 * r)}
        assert abs(sum(counts) / trials - 20 * r) < 7 * 0.5 / math.sqrt(trials)
        for x in names:
            assert abs(sum(x in s for s in sets) / trials - r) < 7 * math.sqrt(r * (1 - r) / trials)


def test_same_generator_same_subset():
    p = inclusion_probabilities(SIZES, WEIGHTS, 0.4)
    a = systematic_subset(NAMES, p, action_generator(7, 3, 1, 2))
    b = systematic_subset(NAMES, p, action_generator(7, 3, 1, 2))
    assert a == b
    g1, g2 = torch.Generator(), torch.Generator()
    g1.manual_seed(5)
    g2.manual_seed(5)
    assert systematic_subset(NAMES, p, g1) == systematic_subset(NAMES, p, g2)
    assert len({systematic_subset(NAMES, p, action_generator(7, s, 1, 2)) for s in range(20)}) > 1


# -- balanced_subset: TimelyFreeze's choice -------------------------------------------------------
LLAMA_STAGE = [2048 * 256] + [256, 256 * 256, 256 * 64, 256 * 64, 256 * 256, 256, 256 * 768, 768 * 256, 256 * 768] * 3


def test_balanced_subset_freezes_every_tensor_with_the_ratio_exactly():
    """Along any fixed order, the start points u in [0, 1) that pick a tensor form intervals of total
    length r: checked on a grid of u (exact up to the grid step)."""
    names = [f"t{i}" for i in range(len(LLAMA_STAGE))]
    grid = 20000
    for r in (0.1, 0.37, 0.5, 0.9):
        order = sorted(range(len(names)), key=lambda i: -LLAMA_STAGE[i])
        hits = {x: 0 for x in names}
        for k in range(grid):
            for x in systematic_pick([(names[i], r) for i in order], (k + 0.5) / grid):
                hits[x] += 1
        assert all(abs(h / grid - r) <= 1.0 / grid for h in hits.values()), r


@pytest.mark.parametrize("r", [0.13, 0.5, 0.8])
def test_balanced_subset_keeps_elements_within_one_tensor_of_the_ratio(r):
    names = [f"t{i}" for i in range(len(LLAMA_STAGE))]
    size = dict(zip(names, LLAMA_STAGE))
    total, biggest = sum(LLAMA_STAGE), max(LLAMA_STAGE)
    dev_bal, dev_uni = [], []
    freq = {x: 0 for x in names}
    draws = 2000
    for s in range(draws):
        chosen = balanced_subset(names, LLAMA_STAGE, r, action_generator(3, s, 0, 0))
        assert len(chosen) in (math.floor(r * len(names)), math.ceil(r * len(names)))
        dev = sum(size[x] for x in chosen) - r * total
        assert abs(dev) <= biggest  # the guarantee, every draw
        dev_bal.append(dev)
        dev_uni.append(sum(size[x] for x in uniform_subset(names, r, action_generator(3, s, 0, 0))) - r * total)
        for x in chosen:
            freq[x] += 1
    for x in names:  # marginal r for every tensor, whatever its size (7 standard errors)
        assert abs(freq[x] / draws - r) < 7 * math.sqrt(r * (1 - r) / draws), x
    # less spread than a uniform subset of the same count (fixed seeds: deterministic); how much less
    # depends on r: a tensor as large as this embedding (29 % of the elements) is in or out as a whole
    rms = lambda v: math.sqrt(sum(d * d for d in v) / len(v))  # noqa: E731
    assert rms(dev_bal) < rms(dev_uni)


def test_balanced_subset_edges():
    g = action_generator(0, 1, 0, 0)
    assert balanced_subset([], [], 0.5, g) == frozenset()
    assert balanced_subset(["a", "b"], [1, 2], 0.0, g) == frozenset()
    assert balanced_subset(["a", "b"], [1, 2], 1.0, g) == {"a", "b"}
    with pytest.raises(ValueError, match="2 names but 1 sizes"):
        balanced_subset(["a", "b"], [1], 0.5, g)


def _pick_by_definition(ordered, u):
    """``systematic_pick`` as its docstring defines it: every interval's ends and both ceilings anew."""
    out, lo = [], 0.0
    for x, p in ordered:
        hi = lo + p
        if math.ceil(hi - u) > math.ceil(lo - u):
            out.append(x)
        lo = hi
    return out


def test_fast_forms_draw_what_the_definitions_draw():
    """The draw's cheaper forms (each end's ceiling computed once, a precomputed sort key, a reseeded
    generator) pick the same names as the plain forms, bit for bit: the masks of every run stay as they were."""
    rng = random.Random(99)
    for _ in range(3000):
        n = rng.randint(0, 45)
        names = [f"t{i}" for i in range(n)]
        sizes = [rng.choice((1, 256, 256 * 64, 65536)) for _ in range(n)]
        r, u = rng.choice((rng.random(), 0.5, 0.1, 1 / 3, 0.7)), rng.choice((rng.random(), 0.0, 0.5))
        probs = [rng.choice((r, rng.random(), 0.0, 1.0)) for _ in range(n)]
        assert systematic_pick(list(zip(names, probs)), u) == _pick_by_definition(list(zip(names, probs)), u)
        seed = (rng.randrange(100), rng.randrange(1000), rng.randrange(8), rng.randrange(16))
        perm = torch.randperm(n, generator=action_generator(*seed)).tolist() if n else []
        order = sorted(perm, key=lambda i: -sizes[i])
        g = action_generator(*seed)
        torch.randperm(n, generator=g)
        v = torch.rand((), dtype=torch.float64, generator=g).item()
        expect = frozenset(_pick_by_definition([(names[i], r) for i in order], v)) if n and 0 < r < 1 else None
        reused = action_generator(*seed, into=torch.Generator().manual_seed(rng.randrange(10**6)))
        if expect is not None:
            assert balanced_subset(names, sizes, r, reused) == expect
