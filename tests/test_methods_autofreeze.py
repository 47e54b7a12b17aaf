"""AutoFreeze: percentile + prefix rule, accumulation between checks, multi-rank agreement."""

import numpy as np
from test_methods_common import (
    LockStep,
    make_cfg,
    make_ctx,
    make_stages,
    same_set_for_every_microbatch,
    set_layer_grads,
)

from timelyfreeze.methods.autofreeze import AutoFreeze, AutoFreezeConfig, autofreeze_boundary


def test_percentile_and_prefix_rule():
    ratios = {0: 0.01, 1: 0.02, 2: 0.5, 3: 0.03, 4: 0.9}
    # 80th percentile of [.01,.02,.5,.03,.9] = .5 + .8*(.9-.5)*... -> numpy linear: 0.58
    assert np.isclose(np.percentile(list(ratios.values()), 80), 0.58)
    assert autofreeze_boundary(ratios, 0, 80) == 4  # layers 0-3 are below 0.58; layer 4 stops
    # p = 50: threshold 0.03 -> layers 0, 1 below; layer 2 (0.5) stops the prefix (layer 3 stays active)
    assert autofreeze_boundary(ratios, 0, 50) == 2
    # the percentile is over the active layers only
    assert autofreeze_boundary({2: 0.5, 3: 0.03, 4: 0.9}, 2, 50) == 2  # threshold 0.5: layer 2 not below
    assert autofreeze_boundary({2: 0.1, 3: 0.03, 4: 0.9}, 2, 80) == 4
    # layers without a previous norm (inf) are never stable and rank above every finite ratio
    assert autofreeze_boundary({0: 0.01, 1: float("inf"), 2: 0.1}, 0, 50) == 1
    assert autofreeze_boundary({0: float("inf"), 1: float("inf")}, 0, 80) == 0
    # the maximum always stays active: p = 100 never freezes the whole model
    assert autofreeze_boundary({0: 0.1, 1: 0.2, 2: 0.3}, 0, 100) == 2


def _drive(m, views, step, grads_by_layer):
    for v in views:
        set_layer_grads(v, {k: g for k, g in grads_by_layer.items() if k in set(v.layer_of.values())})
    m.after_backward(step)


def test_autofreeze_accumulates_between_checks_and_freezes_prefix():
    stages = make_stages(4)  # layers 0..5 on one stage; anchor = tok.weight (layer 0's only tensor)
    cfg = make_cfg(autofreeze=AutoFreezeConfig(percentile=50, check_every=2), warmup_steps=0)
    m = AutoFreeze(cfg, make_ctx(stages))
    assert m.name == "autofreeze" and same_set_for_every_microbatch(m, stages)
    # interval 1 (steps 1-2): all layers grad 1 per element -> per-step L1 = numel
    for t in (1, 2):
        _drive(m, stages, t, {k: 1.0 for k in range(6)})
    numel = {k: sum(p.numel() for n, p in stages[0].params.items() if stages[0].layer_of[n] == k) for k in range(6)}
    assert m.metric.prev == {k: 2.0 * numel[k] for k in range(6)}  # summed over the 2 steps
    assert m.metric.boundary == 0  # first check: no previous figure
    # interval 2: layers 0-2 barely change (ratio .05), layers 3-5 change a lot
    for t in (3, 4):
        _drive(m, stages, t, {0: 0.95, 1: 0.95, 2: 0.95, 3: 0.5, 4: 0.2, 5: 0.1})
    r = m.metric.last_ratios
    assert np.isclose(r[0], 0.05) and np.isclose(r[3], 0.5) and np.isclose(r[5], 0.9)
    # median of [.05,.05,.05,.5,.8,.9] = .275 -> layers 0,1,2 freeze
    assert m.metric.boundary == 3
    f = m.frozen_tensors(5, 0, 0)
    assert f == m.frozen_tensors(5, 0, 1)
    assert f == {n for n in stages[0].params if stages[0].layer_of[n] in (1, 2)}  # anchor excluded
    # frozen layers have no gradient (None) and stay frozen: monotone
    for t in (5, 6):
        _drive(m, stages, t, {0: None, 1: None, 2: None, 3: 0.5, 4: 0.2, 5: 0.1})
    assert m.metric.boundary >= 3
    assert m.summary()["frozen_layers"] == m.metric.boundary


def test_autofreeze_warmup_blocks_decisions():
    stages = make_stages(4)
    m = AutoFreeze(
        make_cfg(autofreeze=AutoFreezeConfig(percentile=80, check_every=1), warmup_steps=10), make_ctx(stages)
    )
    for t in range(1, 10):
        _drive(m, stages, t, {k: 1.0 / t if k < 3 else float(t) for k in range(6)})
        assert m.frozen_tensors(t, 0, 0) == frozenset()
    assert m.metric.boundary == 0 and m.phase(10) == "warmup"
    # the check at the last warm-up step may decide: its prefix applies from step 11 on
    _drive(m, stages, 10, {k: 1.0 / 10 if k < 3 else 10.0 for k in range(6)})
    assert m.metric.boundary > 0
    assert m.frozen_tensors(10, 0, 0) == frozenset() and m.frozen_tensors(11, 0, 0)


def test_autofreeze_two_ranks_decide_the_same_global_prefix():
    """Two ranks (stage 0: embedding + blocks 0-1, stage 1: blocks 2-3 + head) run in lock step; the
    fake all_gather hands each rank both ranks' objects, as torch.distributed would."""
    views = make_stages(4, (2,))
    cfg = make_cfg(autofreeze=AutoFreezeConfig(percentile=80, check_every=1))
    ls = LockStep(2)
    ranks = [AutoFreeze(cfg, make_ctx([views[r]], all_gather=ls.gather(r), num_stages=2)) for r in (0, 1)]

    def step(t, grads):
        for v in views:
            set_layer_grads(v, {k: g for k, g in grads.items() if k in set(v.layer_of.values())})
        ls.run(*(lambda m=m: m.after_backward(t) for m in ranks))

    step(1, {k: 1.0 for k in range(6)})
    # global ratios of layers 0..5: [.01, .02, .03, .5, .04, .9]; 80th percentile = .5 -> 0, 1, 2 freeze
    # (layer 3 at the threshold stops the prefix although layer 4 is below it)
    step(2, {0: 0.99, 1: 0.98, 2: 0.97, 3: 0.5, 4: 0.96, 5: 0.1})
    assert ls.calls == 2
    for m in ranks:
        assert m.metric.num_layers == 6
    r0, r1 = ranks[0].metric, ranks[1].metric
    assert r0.last_ratios == r1.last_ratios
    assert np.isclose(r0.last_ratios[3], 0.5) and np.isclose(r0.last_ratios[0], 0.01)
    assert r0.boundary == r1.boundary == 3
    # rank 0 holds layers 0-2: all its freezable tensors; rank 1 (layers 3-5) freezes nothing yet
    assert ranks[0].frozen_tensors(3, 0, 0) == set(views[0].params) - {"tok.weight"}
    assert ranks[1].frozen_tensors(3, 1, 0) == frozenset()
