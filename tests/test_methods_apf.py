"""APF: effective perturbation, TCP-like period, warm-up, checkpoint round trip."""

import torch
from test_methods_common import make_cfg, make_ctx, make_stages, same_set_for_every_microbatch
from torch import nn

from timelyfreeze.job.stage_view import StageView
from timelyfreeze.methods.apf import APF, APFConfig, APFMetric


def _view(**shapes: int) -> StageView:
    mod = nn.Module()
    for name, n in shapes.items():
        setattr(mod, name, nn.Parameter(torch.zeros(n)))
    params = dict(mod.named_parameters())
    return StageView(
        stage=0,
        module=mod,
        params=params,
        layer_of={n: 0 for n in params},
        layer_modules={},
        is_first=True,
        is_last=True,
        anchor="anchor" if "anchor" in params else None,
    )


def test_effective_perturbation_hand_computed_and_oscillation_vs_trend():
    v = _view(osc=1, trend=1, mixed=2, anchor=1)
    m = APFMetric(APFConfig(threshold=0.4, ema_alpha=0.5, check_every=1), [v])
    m.update(0)  # snapshot
    p = v.params
    with torch.no_grad():
        p["osc"] += 1.0
        p["trend"] += 1.0
        p["mixed"] += torch.tensor([1.0, -1.0])
    m.update(1)
    # first check: |0.5*1| / (0.5*1) = 1 for all (no history yet)
    assert m.perturbation[(0, "osc")] == 1.0 and m.perturbation[(0, "trend")] == 1.0
    with torch.no_grad():
        p["osc"] -= 1.0
        p["trend"] += 1.0
        p["mixed"] += torch.tensor([1.0, -1.0])
    m.update(2)
    # osc: ema = 0.25 - 0.5 = -0.25, |.|-ema = 0.25 + 0.5 = 0.75 -> 1/3
    assert abs(m.perturbation[(0, "osc")] - 1 / 3) < 1e-6
    assert m.perturbation[(0, "trend")] == 1.0
    # per-element trends of opposite sign are a trend, not an oscillation (unlike mean(delta) first)
    assert abs(m.perturbation[(0, "mixed")] - 1.0) < 1e-6
    for t in range(3, 30):
        sign = 1.0 if t % 2 else -1.0
        if not m.is_frozen((0, "osc"), t):
            with torch.no_grad():
                p["osc"] += sign
        with torch.no_grad():
            p["trend"] += 1.0
            p["mixed"] += torch.tensor([1.0, -1.0])
        m.update(t)
    assert m.perturbation[(0, "osc")] < 0.4 < m.perturbation[(0, "trend")]
    assert (0, "anchor") not in m.period  # the anchor is never tracked, never frozen
    assert m.period[(0, "osc")] > 0
    assert m.period[(0, "trend")] == 0 and m.period[(0, "mixed")] == 0
    marked_any = set().union(*(m.marked(0, t) for t in range(3, 40)))
    assert marked_any == {"osc"}


def test_period_grows_additively_halves_and_expires():
    c = 2
    v = _view(w=1)
    # the warm-up lets the EMAs settle (P of +-1 steps -> 0.1/1.9 = 0.053) before decisions start
    m = APFMetric(APFConfig(threshold=0.3, ema_alpha=0.9, check_every=c), [v], warmup_steps=40)
    key = (0, "w")
    w = v.params["w"]
    m.update(1)
    log = []  # (check step, period, frozen_until) after every evaluated check
    sign, step, trend_from = 1.0, 1, None
    frozen_steps = set()
    while step < 400:
        step += 1
        if m.is_frozen(key, step):  # as the method sees it when the step starts
            frozen_steps.add(step)
        if step % c:
            m.update(step)
            continue
        frozen_at_check = m.is_frozen(key, step)
        if not frozen_at_check:  # frozen tensors do not move
            with torch.no_grad():
                w += 50.0 if trend_from is not None else sign
            sign = -sign
        m.update(step)
        if not frozen_at_check:
            log.append((step, m.period[key], m.frozen_until[key]))
        if trend_from is None and m.period[key] >= 3 * c:
            trend_from = step
        if trend_from is not None and len([x for x in log if x[0] > trend_from]) >= 3:
            break
    assert all(p == 0 for t, p, _ in log if t < 40)
    periods = [p for _, p, _ in log]
    first = next(i for i, p in enumerate(periods) if p > 0)
    # additive growth while stable: c, 2c, 3c
    assert periods[first : first + 3] == [c, 2 * c, 3 * c]
    for (t, p, until), (t_next, _, _) in zip(log[first : first + 3], log[first + 1 : first + 4]):
        assert until == t + p
        # frozen for exactly (t, t + period]; active again (and evaluated) at the next check after
        assert {x for x in frozen_steps if t < x < t_next} == set(range(t + 1, t + p + 1))
        assert t_next == t + p + c
    # then unstable: halves (6 -> 3), then 3 // 2 = 1 < c -> 0
    after = [p for t, p, _ in log if t > trend_from]
    assert after[:2] == [3, 0]


def test_apf_method_warmup_step_level_anchor_and_resume():
    def run(method, steps, stages):
        g = torch.Generator().manual_seed(1)
        out = []
        for t in steps:
            sets = [method.frozen_tensors(t, v.stage, mb) for v in stages for mb in (0, 1)]
            assert sets[0] == sets[1] and sets[2] == sets[3]  # step-level
            out.append(sets[0] | sets[2])
            with torch.no_grad():
                for v in stages:
                    for name, p in v.params.items():
                        if name in sets[2 * v.stage]:
                            continue
                        # on check steps: biases oscillate, weights trend
                        if t % 2 == 0:
                            s = (1 if (t // 2) % 2 else -1) if name.endswith("bias") else 1
                            p += 0.01 * s + 0.0001 * torch.randn(p.shape, generator=g)
            method.after_optimizer_step(t)
        return out

    stages = make_stages(4, (2,))
    cfg = make_cfg(apf=APFConfig(threshold=0.2, ema_alpha=0.9, check_every=2), warmup_steps=6)
    m = APF(cfg, make_ctx(stages))
    assert m.name == "apf"
    first = run(m, range(1, 21), stages)
    assert same_set_for_every_microbatch(m, stages, range(1, 21))
    assert all(s == frozenset() for s in first[:6])  # warm-up: nothing
    assert any(first[6:])
    assert all(n.endswith("bias") for s in first for n in s)
    assert all("tok.weight" not in s for s in first)
    state = m.state_dict()
    from timelyfreeze.runtime.state_codec import decode, encode

    state = decode(encode(state))  # through the checkpoint's plain-data form
    # a resumed copy (fresh model with the same weights) continues identically
    stages2 = make_stages(4, (2,))
    for v, v2 in zip(stages, stages2):
        v2.module.load_state_dict(v.module.state_dict())
    m2 = APF(cfg, make_ctx(stages2))
    m2.load_state_dict(state)
    a = run(m, range(21, 41), stages)
    b = run(m2, range(21, 41), stages2)
    assert a == b
    assert m.summary()["checks"] == m2.summary()["checks"] == 20
