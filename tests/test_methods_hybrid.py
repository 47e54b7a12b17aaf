"""TimelyFreeze+APF / +AutoFreeze: exact count of TimelyFreeze's budget, selection biased by the metric."""

import math

import torch
from test_methods_common import make_cfg, make_ctx, make_stages, set_layer_grads

from timelyfreeze.config import Phases
from timelyfreeze.methods.apf import APFConfig
from timelyfreeze.methods.autofreeze import AutoFreezeConfig
from timelyfreeze.methods.hybrid import TimelyAPF, TimelyAutoFreeze, hybrid_select
from timelyfreeze.methods.registry import method_class
from timelyfreeze.selection import action_generator

NAMES = [f"t{i}" for i in range(20)]


def test_exact_count_rule():
    marked = set(NAMES[:10])
    for ratio in (0.0, 0.05, 0.33, 0.5, 0.77, 1.0):
        counts = [len(hybrid_select(NAMES, marked, ratio, action_generator(0, s, 0, 0))) for s in range(400)]
        target = ratio * len(NAMES)
        assert set(counts) <= {math.floor(target), math.ceil(target)}
        assert abs(sum(counts) / len(counts) - target) < 0.08
    assert hybrid_select(NAMES, marked, 1.0, action_generator(0, 1, 0, 0)) == frozenset(NAMES)
    assert hybrid_select([], marked, 0.5, action_generator(0, 1, 0, 0)) == frozenset()


def test_marked_tensors_are_strongly_preferred():
    marked = set(NAMES[:10])
    # ratio * n = 5 <= |marked| = 10: nearly only marked tensors. Per draw the unmarked mass is
    # 10 * 0.01 = 0.1 against >= 6 marked, so an unmarked pick is < 2% per draw.
    picks = {x: 0 for x in NAMES}
    trials = 400
    for s in range(trials):
        for x in hybrid_select(NAMES, marked, 0.25, action_generator(0, s, 0, 0)):
            picks[x] += 1
    frac_unmarked = sum(picks[x] for x in NAMES[10:]) / (5 * trials)
    assert frac_unmarked < 0.03
    assert all(picks[x] > 0.35 * trials for x in NAMES[:10])  # each marked one ~ 5/10 of the time
    # ratio * n > |marked|: all marked are taken (almost always), the rest uniform among unmarked
    full = 0
    for s in range(200):
        sel = hybrid_select(NAMES, set(NAMES[:4]), 0.5, action_generator(0, s, 0, 0))
        full += set(NAMES[:4]) <= sel
    assert full > 0.9 * 200
    # no marks: a uniform draw
    picks = {x: 0 for x in NAMES}
    for s in range(1000):
        for x in hybrid_select(NAMES, set(), 0.3, action_generator(0, s, 0, 0)):
            picks[x] += 1
    assert all(abs(c / 1000 - 0.3) < 0.07 for c in picks.values())


def test_same_generator_same_selection():
    a = hybrid_select(NAMES, set(NAMES[::3]), 0.4, action_generator(7, 3, 1, 2))
    b = hybrid_select(NAMES, set(NAMES[::3]), 0.4, action_generator(7, 3, 1, 2))
    assert a == b


def _planned(cls, **sections):
    stages = make_stages(4)
    phases = Phases(warmup_end=2, upper_end=3, lower_end=4, ramp_end=6)
    cfg = make_cfg(warmup_steps=2, **sections)
    m = cls(cfg, make_ctx(stages, phases=phases, last_loss=None))
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
    # stable phase: ratio 0.5 of n tensors per microbatch 0, exact count; marked preferred
    k = 0.5 * len(names)
    in_marked, total = 0, 0
    for step in range(7, 207):
        s = m.frozen_tensors(step, 0, 0)
        assert len(s) in (math.floor(k), math.ceil(k)) and v.anchor not in s
        in_marked += len(s & marked)
        total += len(s)
        assert len(m.frozen_tensors(step, 0, 1)) in (math.floor(0.25 * len(names)), math.ceil(0.25 * len(names)))
    assert len(marked) < k and in_marked / total > len(marked) / k * 0.95  # marked nearly always in
    # ramp: half the budget at step 5
    assert len(m.frozen_tensors(5, 0, 0)) in (math.floor(k / 2), math.ceil(k / 2))
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
    sign = {n: 1.0 for n in v.params}
    k = 0.25 * len(names)
    share, seen = [], set()
    for t in range(1, 60):
        marked = m.metric.marked(0, t)
        seen |= marked
        sel = m.frozen_tensors(t, 0, 1)  # microbatch 1: ratio 0.25 once ramped
        if t > 6:
            assert len(sel) in (math.floor(k), math.ceil(k))
            if len(marked) >= k:
                share.append(len(sel & marked) / len(sel))
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
