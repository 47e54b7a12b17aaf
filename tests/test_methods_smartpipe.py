"""SmartPipe: gradient-norm difference, tau prefix, lambda cap, never the head, multi-rank agreement."""

import torch
from test_methods_common import (
    LockStep,
    make_cfg,
    make_ctx,
    make_stages,
    same_set_for_every_microbatch,
    set_layer_grads,
)

from timelyfreeze.methods.smartpipe import SmartPipe, SmartPipeConfig, smartpipe_boundary


def test_lambda_arithmetic_and_prefix_rule():
    eta = {k: 0.1 for k in range(10)}
    # 10 layers (0..9, 9 = head): active 10, lambda .25 -> floor(2.5) = 2
    assert smartpipe_boundary(eta, 0, 9, tau=1.0, lam=0.25) == 2
    # then active 8 -> 2, active 6 -> 1 (floor 1.5), 5 -> 1, 4 -> 1, 3 -> 1, 2 -> max(1, 0) = 1
    b, seq = 0, []
    for _ in range(12):
        b = smartpipe_boundary(eta, b, 9, 1.0, 0.25)
        seq.append(b)
    assert seq == [2, 4, 5, 6, 7, 8, 9, 9, 9, 9, 9, 9]  # boundary 9: layers 0-8 frozen, the head never
    # aggressive lambda: .75 of 10 -> 7
    assert smartpipe_boundary(eta, 0, 9, 1.0, 0.75) == 7
    # the prefix stops at the first layer with eta >= tau, even if later ones are below
    eta2 = {0: 0.1, 1: 0.1, 2: 1.0, 3: 0.1}
    assert smartpipe_boundary(eta2, 0, 9, 1.0, 0.9) == 2
    assert smartpipe_boundary(eta2, 2, 9, 1.0, 0.9) == 2  # layer 2 is not below tau (strict)
    # missing figures count as not converged
    assert smartpipe_boundary({1: 0.1}, 0, 9, 1.0, 0.5) == 0
    # a single active layer (the head) never freezes
    assert smartpipe_boundary(eta, 9, 9, 1.0, 0.5) == 9


def test_gradient_norm_difference_and_freezing():
    stages = make_stages(4)  # layers 0..5, head = 5
    cfg = make_cfg(smartpipe=SmartPipeConfig(tau=0.5, lam=0.5, e1=3, check_every=1), warmup_steps=2)
    m = SmartPipe(cfg, make_ctx(stages))
    assert m.name == "smartpipe" and same_set_for_every_microbatch(m, stages) and m.start == 3
    v = stages[0]
    # layers 0-2: gradient moves from 1.0 to 0.9 (eta = 0.1); layers 3-5: sign flips (eta = 2)
    set_layer_grads(v, {k: 1.0 for k in range(6)})
    m.after_backward(1)
    assert m.last_eta == {}
    set_layer_grads(v, {0: 0.9, 1: 0.9, 2: 0.9, 3: -1.0, 4: -1.0, 5: -1.0})
    m.after_backward(2)
    assert all(abs(m.last_eta[k] - 0.1) < 1e-6 for k in (0, 1, 2))
    assert all(abs(m.last_eta[k] - 2.0) < 1e-6 for k in (3, 4, 5))
    assert m.boundary == 0  # before e1
    set_layer_grads(v, {0: 0.9, 1: 0.9, 2: 0.9, 3: 1.0, 4: 1.0, 5: 1.0})
    m.after_backward(3)
    # eta(0..2) = 0, active 6, lambda .5 -> 3 allowed, the prefix of eta < .5 is 0,1,2 -> all 3
    assert m.boundary == 3
    assert m.frozen_tensors(3, 0, 0) == frozenset()
    frozen = m.frozen_tensors(4, 0, 0)
    assert frozen == {n for n in v.params if v.layer_of[n] in (1, 2)} and frozen == m.frozen_tensors(4, 0, 1)
    # frozen layers' gradients are None; their stored gradients are dropped
    set_layer_grads(v, {0: None, 1: None, 2: None, 3: 1.0, 4: 1.0, 5: 1.0})
    m.after_backward(4)
    assert m.boundary == 4  # cap = floor(.5 * 3) = 1
    assert set(m._prev) == {4, 5}  # the newly frozen layer's stored gradient is dropped
    set_layer_grads(v, {0: None, 1: None, 2: None, 3: None, 4: 1.0, 5: 1.0})
    m.after_backward(5)
    assert m.boundary == 5  # then the head stays
    m.after_backward(6)
    assert m.boundary == 5


def test_two_ranks_agree_and_resume():
    views = make_stages(4, (2,))
    cfg = make_cfg(smartpipe=SmartPipeConfig(tau=0.5, lam=0.5, check_every=2))
    ls = LockStep(2)
    ranks = [SmartPipe(cfg, make_ctx([views[r]], all_gather=ls.gather(r), num_stages=2)) for r in (0, 1)]
    g = torch.Generator().manual_seed(0)

    def step(t):
        for v in views:
            for name, p in v.params.items():
                if v.layer_of[name] < ranks[0].boundary:
                    p.grad = None
                elif v.layer_of[name] <= 3:  # stable gradients in the front
                    p.grad = torch.ones_like(p) * (1 + 0.01 * t)
                else:  # noise behind
                    p.grad = torch.randn(p.shape, generator=g)
        ls.run(*(lambda m=m: m.after_backward(t) for m in ranks))

    for t in range(1, 9):
        step(t)
    assert ranks[0].boundary == ranks[1].boundary == 4  # layers 0-3 freeze (2 per check), 4 is noisy
    assert ranks[0].num_layers == ranks[1].num_layers == 6
    assert ls.calls == 4  # one gather per check step (2, 4, 6, 8), none in between
    assert ranks[1].frozen_tensors(9, 1, 0) == {n for n in views[1].params if views[1].layer_of[n] == 3}
    state = ranks[1].state_dict()
    fresh = SmartPipe(cfg, make_ctx([views[1]], num_stages=2))
    from timelyfreeze.runtime.state_codec import decode, encode

    fresh.load_state_dict(decode(encode(state)))  # through the checkpoint's plain-data form
    assert fresh.frozen_tensors(9, 1, 0) == ranks[1].frozen_tensors(9, 1, 0)
    assert set(fresh._prev) == set(ranks[1]._prev)
