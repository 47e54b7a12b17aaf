"""TimelyFreeze+APF / +AutoFreeze: TimelyFreeze's element budget in expectation, selection biased by the metric."""

import math

import torch
from test_methods_common import make_cfg, make_ctx, make_stages, set_layer_grads

from timelyfreeze.job.phases import Phases
from timelyfreeze.methods.apf import APFConfig
from timelyfreeze.methods.autofreeze import AutoFreezeConfig
from timelyfreeze.methods.hybrid import TimelyAPF, TimelyAutoFreeze, hybrid_probabilities, hybrid_select
from timelyfreeze.methods.registry import method_class
from timelyfreeze.methods.selection import action_generator

NAMES = [f"t{i}" for i in range(20)]
# sizes over four orders of magnitude: an embedding-like first tensor, matrices, norms
SIZES = [50_000] + [4096, 4096, 16384, 16384, 64] * 3 + [64, 4096, 4096, 64]


def _frozen_share(sel, names=NAMES, sizes=SIZES):
    size = dict(zip(names, sizes))
    return sum(size[x] for x in sel) / sum(sizes)


def test_element_budget_rule():
    marked = set(NAMES[:10])
    for ratio in (0.0, 0.05, 0.33, 0.5, 0.77, 1.0):
        p = hybrid_probabilities(NAMES, SIZES, marked, ratio)
        assert abs(math.fsum(x * n for x, n in zip(p, SIZES)) - ratio * sum(SIZES)) <= 1e-9 * sum(SIZES)
        trials = 2000
        mean = (
            sum(
                _frozen_share(hybrid_select(NAMES, SIZES, marked, ratio, action_generator(0, s, 0, 0)))
                for s in range(trials)
            )
            / trials
        )
        assert abs(mean - ratio) <= 7 * math.sqrt(ratio * (1 - ratio) / trials)  # share in [0, 1], mean ratio
    assert hybrid_select(NAMES, SIZES, marked, 1.0, action_generator(0, 1, 0, 0)) == frozenset(NAMES)
    assert hybrid_select(NAMES, SIZES, marked, 0.0, action_generator(0, 1, 0, 0)) == frozenset()
    assert hybrid_select([], [], marked, 0.5, action_generator(0, 1, 0, 0)) == frozenset()
    # no marks, or all marked: every tensor with probability ratio, as plain TimelyFreeze
    assert hybrid_probabilities(NAMES, SIZES, set(), 0.3) == [0.3] * 20
    assert hybrid_probabilities(NAMES, SIZES, set(NAMES), 0.3) == [0.3] * 20


def test_marked_tensors_are_strongly_preferred():
    sizes = [1000] * 20
    marked = set(NAMES[:10])
    # ratio 0.25 of the elements < the marked share 0.5: marked p = 100 x unmarked p, 10 p + 0.1 p = 5
    p = hybrid_probabilities(NAMES, sizes, marked, 0.25)
    assert math.isclose(p[0], 5 / 10.1) and math.isclose(p[19], 0.05 / 10.1)
    picks = {x: 0 for x in NAMES}
    trials = 2000
    for s in range(trials):
        for x in hybrid_select(NAMES, sizes, marked, 0.25, action_generator(0, s, 0, 0)):
            picks[x] += 1
    assert sum(picks[x] for x in NAMES[10:]) / (10 * trials) < 0.02  # 0.005 expected
    assert all(abs(picks[x] / trials - p[0]) < 7 * math.sqrt(p[0] * (1 - p[0]) / trials) for x in NAMES[:10])
    # ratio above the marked share: all marked are always taken, the rest equally likely
    p = hybrid_probabilities(NAMES, sizes, set(NAMES[:4]), 0.5)
    assert p[:4] == [1.0] * 4 and all(math.isclose(x, 6 / 16) for x in p[4:])
    for s in range(200):
        assert set(NAMES[:4]) <= hybrid_select(NAMES, sizes, set(NAMES[:4]), 0.5, action_generator(0, s, 0, 0))
    # sizes differ: still 100:1 at equal size, and a marked tensor is preferred to an unmarked one
    p = hybrid_probabilities(NAMES, SIZES, marked, 0.2)
    for i in range(20):
        for j in range(20):
            if SIZES[i] == SIZES[j] and NAMES[i] in marked and NAMES[j] not in marked:
                assert p[i] > p[j] and (p[i] == 1.0 or math.isclose(p[i], 100 * p[j]))


def test_same_generator_same_selection():
    a = hybrid_select(NAMES, SIZES, set(NAMES[::3]), 0.4, action_generator(7, 3, 1, 2))
    b = hybrid_select(NAMES, SIZES, set(NAMES[::3]), 0.4, action_generator(7, 3, 1, 2))
    assert a == b


def _planned(cls, **sections):
    stages = make_stages(4)
    phases = Phases(warmup_end=2, upper_end=3, lower_end=4, ramp_end=6)
    cfg = make_cfg(warmup_steps=2, **sections)
    m = cls(cfg, make_ctx(stages, phases=phases))
    m.set_plan({"0B0": 0.5, "0B1": 0.25, "0F0": 0.9})
    return m, stages


def test_timely_autofreeze_uses_the_plan_budget_and_the_prefix():
    assert method_class("timelyfreeze_autofreeze") is TimelyAutoFreeze
    m, stages = _planned(TimelyAutoFreeze, autofreeze=AutoFreezeConfig(percentile=50, check_every=1))
    v = stages[0]
    names = [n for n in v.params if n != v.anchor]
    # drive AutoFreeze through the hooks: layers 1-2 converge, the rest does not
    set_layer_grads(v, {k: 1.0 for k in range(6)})
    m.after_backward(3)
    set_layer_grads(v, {0: 1.0, 1: 1.0, 2: 1.0, 3: 5.0, 4: 0.2, 5: 3.0})
    m.after_backward(4)
    assert m.metric.boundary == 3  # layers 0-2 marked
    marked = m.metric.marked(0)
    assert marked == {n for n in names if v.layer_of[n] in (1, 2)}
    numels = [v.params[n].numel() for n in names]
    total = sum(numels)
    # stable phase: ratio 0.5 of the elements per microbatch 0; the marked layers (40 of 143 elements)
    # are always in, the rest shares the remainder
    p = hybrid_probabilities(names, numels, marked, 0.5)
    assert all(p[i] == 1.0 for i, n in enumerate(names) if n in marked)
    shares, trials = [], 2000
    for step in range(7, 7 + trials):
        s = m.frozen_tensors(step, 0, 0)
        assert marked <= s and v.anchor not in s
        shares.append(sum(v.params[n].numel() for n in s) / total)
        if step < 50:
            assert m.frozen_tensors(step, 0, 1) == hybrid_select(
                names, numels, marked, 0.25, action_generator(m.cfg.seed, step, 0, 1)
            )
    assert abs(sum(shares) / trials - 0.5) <= 7 * math.sqrt(0.25 / trials)
    # ramp: half the budget at step 5
    assert m.action_ratio(5, 0, 0) == 0.25
    assert m.frozen_tensors(5, 0, 0) == hybrid_select(names, numels, marked, 0.25, action_generator(0, 5, 0, 0))
    assert m.frozen_tensors(2, 0, 0) == frozenset()  # warm-up
    st = m.state_dict()
    m2, _ = _planned(TimelyAutoFreeze)
    m2.load_state_dict(st)
    assert m2.metric.boundary == 3 and m2.frozen_tensors(50, 0, 0) == m.frozen_tensors(50, 0, 0)


def test_timely_apf_updates_the_metric_and_biases_to_apf_frozen():
    assert method_class("timelyfreeze_apf") is TimelyAPF
    m, stages = _planned(TimelyAPF, apf=APFConfig(threshold=0.2, ema_alpha=0.9, check_every=1))
    v = stages[0]
    bias_names = {n for n in v.params if n.endswith("bias")}
    names = [n for n in v.params if n != v.anchor]
    numels = [v.params[n].numel() for n in names]
    sign = {n: 1.0 for n in v.params}
    share, seen = [], set()
    for t in range(1, 60):
        marked = m.metric.marked(0, t)
        seen |= marked
        sel = m.frozen_tensors(t, 0, 1)  # microbatch 1: ratio 0.25 once ramped
        if t > 6:
            probs = hybrid_probabilities(names, numels, marked, 0.25)
            assert abs(math.fsum(x * n for x, n in zip(probs, numels)) - 0.25 * sum(numels)) < 1e-9 * sum(numels)
            assert sel == hybrid_select(names, numels, marked, 0.25, action_generator(m.cfg.seed, t, 0, 1))
            if marked:
                share.append(len(sel & marked) / max(1, len(sel)))
        with torch.no_grad():  # biases oscillate, weights trend; APF-frozen tensors do not move
            for n, p in v.params.items():
                if n != v.anchor and m.metric.is_frozen((0, n), t):
                    continue
                p += 0.01 * sign[n]
                if n in bias_names:
                    sign[n] = -sign[n]
        m.after_optimizer_step(t)
    assert seen and seen <= bias_names
    assert len(share) > 10 and sum(share) / len(share) > 0.9
    assert m.summary()["apf_checks"] == 58
