"""Egeria: SP loss by hand, slope/tolerance/stale counter, bootstrapping, LR-drop unfreeze, the
asynchronous worker (never blocks a step; skips when busy), multi-rank agreement."""

import math
import threading
import time

import pytest
import torch
from test_methods_common import LockStep, make_cfg, make_ctx, make_stages

from timelyfreeze.methods.egeria.controller import EgeriaController
from timelyfreeze.methods.egeria.method import Egeria, EgeriaConfig
from timelyfreeze.methods.egeria.sp_loss import linear_slope, sp_loss

IDLE_DEADLINE_S = 120.0
"""How long a test waits for the worker to finish its one evaluation (of a model of a few small layers) before
it fails: a deadline against a hang, generous for a loaded machine, never a timing threshold."""


def wait_idle(worker, what: str) -> None:
    """Wait until ``worker`` has no job in flight; fail the test with ``what`` if that takes ``IDLE_DEADLINE_S``."""
    deadline = time.monotonic() + IDLE_DEADLINE_S
    while worker.busy():
        if time.monotonic() > deadline:
            pytest.fail(f"the Egeria worker was still busy {IDLE_DEADLINE_S:g} s after {what} (hung?)")
        time.sleep(0.01)


def test_sp_loss_by_hand():
    a_t = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    a_r = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    # G_T = I (rows already unit); G_R = [[1,1],[1,1]] -> rows [1/sqrt2, 1/sqrt2]
    # ||G_T - G_R||^2 = 2 (1 - 1/sqrt2)^2 + 2 (1/2) = 4 - 2 sqrt2; / b^2 = 1 - sqrt2 / 2
    expected = 1 - math.sqrt(2) / 2
    assert abs(sp_loss(a_t, a_r) - expected) < 1e-6
    assert sp_loss(a_t, a_t) == 0.0
    # scale-invariant per row (the Gram rows are normalised)
    assert abs(sp_loss(3 * a_t, a_r) - expected) < 1e-6
    # sequences: (batch, seq, d) -> batch*seq token rows
    assert abs(sp_loss(a_t.reshape(1, 2, 2), a_r.reshape(1, 2, 2)) - expected) < 1e-6
    # images: (b, c, h, w) -> b x chw rows. Q_T = [[1,0,0,0],[0,0,0,2]], Q_R = [[1,0,0,0],[1,0,0,0]]
    t4 = torch.zeros(2, 1, 2, 2)
    t4[0, 0, 0, 0], t4[1, 0, 1, 1] = 1.0, 2.0
    r4 = torch.zeros(2, 1, 2, 2)
    r4[:, 0, 0, 0] = 1.0
    assert abs(sp_loss(t4, r4) - expected) < 1e-6
    # a 3-row case: Q_T rows e1, e1, e2; Q_R rows e1, e1, e1
    qt = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    qr = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    # G_T~ = [[1,1,0],[1,1,0],[0,0,1]] -> rows (1,1,0)/sqrt2, (1,1,0)/sqrt2, (0,0,1)
    # G_R~ = all ones -> every row (1,1,1)/sqrt3
    a, b = 1 / math.sqrt(2), 1 / math.sqrt(3)
    row12 = 2 * (a - b) ** 2 + b**2
    row3 = 2 * b**2 + (1 - b) ** 2
    assert abs(sp_loss(qt, qr) - (2 * row12 + row3) / 9) < 1e-6
    # subsampling keeps evenly spaced rows (rows 0 and 2 here)
    assert abs(sp_loss(qt, qr, max_rows=2) - sp_loss(qt[[0, 2]], qr[[0, 2]])) < 1e-9


def test_linear_slope():
    assert linear_slope([1.0, 2.0, 3.0]) == 1.0
    assert linear_slope([3.0, 1.0]) == -2.0
    assert linear_slope([5.0]) == 0.0
    assert abs(linear_slope([9.0, 8.0, 6.0]) + 1.5) < 1e-12


def _ctrl(window=3, lr_drop=10.0):
    c = EgeriaController(window, 0.2, 3, 0.1, lr_drop)
    c.last_layer = 5
    c.bootstrapped = True
    return c


def test_slope_tolerance_and_stale_counter_by_hand():
    c = _ctrl(window=3)
    readings = [10, 8, 6, 4, 4, 4, 4, 4, 4, 4]
    # smoothed (mean of the last 3): 10, 9, 8, 6, 4.667, 4, 4, 4, 4, 4
    # |slope| over the last 3 smoothed: -, 1, 1, 1.5, 1.667, 1, 0.333, 0, 0, 0
    # T = 0.2 * max(1, 1, 1.5) = 0.3; stale: 0 at 1.5, 1.667, 1, 0.333; then 1, 2, 3 -> freeze
    froze = [c.observe_plasticity(step=i, module=0, generation=0, value=v, lr=0.5) for i, v in enumerate(readings)]
    assert c.cur == 1 and froze == [False] * 9 + [True]
    assert c.events == [(9, "freeze", 0)] and c.freeze_lr == 0.5
    # the next module starts from scratch: no tolerance yet, counter 0
    assert c.tolerance is None and c.stale == 0 and c.raw == []
    # tolerance set from the first 3 slope readings, before that the counter cannot move
    c2 = _ctrl(window=3)
    for i, v in enumerate([4, 4, 4]):  # slopes 0, 0 -> only 2 slope readings, T undefined
        c2.observe_plasticity(i, 0, 0, v, 1.0)
    assert c2.tolerance is None and c2.stale == 0
    c2.observe_plasticity(3, 0, 0, 4, 1.0)
    assert c2.tolerance == 0.0 and c2.stale == 0  # |s| < 0 never holds: flat from the start never freezes
    # a slope rising again resets the counter
    c3 = _ctrl(window=3)
    for i, v in enumerate([10, 8, 6, 4, 4, 4, 4, 4, 4]):
        c3.observe_plasticity(i, 0, 0, v, 1.0)
    assert c3.stale == 2
    c3.observe_plasticity(9, 0, 0, 9, 1.0)
    assert c3.stale == 0 and c3.cur == 0


def test_readings_for_other_modules_or_generations_are_ignored_and_head_never_freezes():
    c = _ctrl(window=2)
    assert not c.observe_plasticity(0, 1, 0, 1.0, 1.0) and c.raw == []
    assert not c.observe_plasticity(0, 0, 1, 1.0, 1.0) and c.raw == []
    c.cur = 5
    assert c.done and not c.observe_plasticity(0, 5, 0, 1.0, 1.0)


def test_bootstrapping_ends_below_ten_percent_change_and_not_in_warmup():
    c = EgeriaController(10, 0.2, 3, 0.1, 10.0)
    assert not c.observe_loss(1, 10.0, may_end=True)
    assert not c.observe_loss(2, 8.0, may_end=True)  # 20 %
    assert not c.observe_loss(3, 7.5, may_end=False)  # 6.25 % but still in warm-up
    assert not c.observe_loss(4, None, may_end=True)  # no loss: nothing changes
    assert c.observe_loss(5, 7.2, may_end=True)  # 4 %
    assert c.bootstrapped and c.events == [(5, "bootstrap_end", -1)]


def test_lr_drop_unfreezes_all_and_halves_the_window():
    c = _ctrl(window=4)
    c.cur, c.freeze_lr = 3, 1.0
    assert not c.check_lr(10, 0.2)
    assert c.check_lr(11, 0.1)  # dropped 10x since the first freeze
    assert c.cur == 0 and c.window_eff == 2 and c.generation == 1 and c.freeze_lr is None
    assert c.events[-1] == (11, "unfreeze_all", 3)
    assert not c.observe_plasticity(12, 0, 0, 1.0, 0.1)  # a reading made before the unfreeze
    # refreezing uses the halved window: W = 2 low-slope readings suffice
    for i, v in enumerate([10, 6, 2, 2, 2, 2]):
        c.observe_plasticity(20 + i, 0, 1, v, 0.1)
    assert c.cur == 1 and c.freeze_lr == 0.1
    c.window_eff = 2
    assert c.check_lr(40, 0.01) and c.window_eff == 2  # never below 2 (a slope needs 2 points)


def _train_step(model_stages, m, step, x):
    m.begin_step(step)
    frozen = [m.frozen_tensors(step, v.stage, mb) for v in model_stages for mb in (0, 1)]
    for mb in (0, 1):
        h = x[mb]
        for v in model_stages:
            h = v.module(h)
        h.float().pow(2).mean().backward()
    m.after_backward(step)
    m.after_optimizer_step(step)
    return frozen


def test_worker_never_blocks_and_skips_when_busy():
    """The worker's first job is held until every training step is done: the steps finish all the same (they
    never wait for it), and the five evaluations that found it busy are skipped, not queued. No wall-clock
    bound: a loaded machine may run the steps as slowly as it likes."""
    stages = make_stages(4)
    cfg = make_cfg(egeria=EgeriaConfig(eval_every=1, window=2))
    m = Egeria(cfg, make_ctx(stages))
    m.observe_loss(0, 1.0)
    m.ctrl.bootstrapped = True
    gate, process = threading.Event(), m.worker._process
    m.worker._process = lambda job: (gate.wait(), process(job))[1]
    x = torch.randint(0, 11, (2, 2, 3))
    steps = threading.Thread(target=lambda: [_train_step(stages, m, step, x) for step in range(1, 7)], daemon=True)
    steps.start()
    steps.join(timeout=300)
    held = not gate.is_set()
    gate.set()
    assert not steps.is_alive() and held  # all six steps ran while the worker was still held
    assert m.submitted == 1 and m.skipped_busy == 5  # skipped, not queued
    wait_idle(m.worker, "the held job was released")
    assert m.worker.completed == 1 and m.worker.failed == 0, m.worker.errors
    assert m.worker.quantized is True and m.worker.refreshes == 1
    ((module, gen, rstep, value),) = m.worker.drain()
    assert (module, gen, rstep) == (0, 0, 1) and value >= 0.0
    m.close()


def test_end_to_end_reading_uses_int8_reference_and_refreshes_every_w():
    stages = make_stages(3, (2,))
    cfg = make_cfg(egeria=EgeriaConfig(eval_every=1, window=2))
    m = Egeria(cfg, make_ctx(stages))
    m.observe_loss(0, 1.0)
    m.ctrl.bootstrapped = True
    m.ctrl.cur = 2  # block 1, on stage 0
    x = torch.randint(0, 11, (2, 2, 3))
    for step in range(1, 6):
        _train_step(stages, m, step, x)
        wait_idle(m.worker, f"step {step}")
    assert m.worker.failed == 0, m.worker.errors
    assert m.submitted == 5 and m.worker.completed == 5
    assert m.worker.refreshes == 3  # evaluations 1, 3, 5 (every W = 2)
    # the reference sees the same input as the training stage: with an fp32 reference taken right
    # before the step, the plasticity is ~0; int8 gives a small positive value
    vals = [r for r in m.ctrl.raw]
    assert vals and all(0.0 <= v < 0.5 for v in vals)
    fp = Egeria(make_cfg(egeria=EgeriaConfig(eval_every=1, window=2, quantize=False)), make_ctx(stages))
    fp.ctrl.bootstrapped, fp.ctrl.cur = True, 2
    _train_step(stages, fp, 1, x)
    wait_idle(fp.worker, "the fp32 reference's step")
    ((_, _, _, v),) = fp.worker.drain()
    assert v < 1e-10 and fp.worker.quantized is False
    m.close()
    fp.close()


def test_two_ranks_agree_on_readings_from_the_owner_and_freeze_the_prefix():
    views = make_stages(4, (2,))
    cfg = make_cfg(egeria=EgeriaConfig(eval_every=2, window=2, tolerance_readings=1))
    ls = LockStep(2)
    ranks = [Egeria(cfg, make_ctx([views[r]], all_gather=ls.gather(r), num_stages=2)) for r in (0, 1)]
    for m in ranks:
        m.observe_loss(1, 2.0)
    ls.run(*(lambda m=m: m.begin_step(1) for m in ranks))
    assert [m.num_layers for m in ranks] == [6, 6] and [m.n for m in ranks] == [2, 2]
    for m in ranks:
        m.ctrl.bootstrapped = True
    # plant readings on rank 0's worker only: layer 0 lives on rank 0, so only rank 0 evaluates it, but
    # the readings are exchanged and every rank applies the same ones
    owner = ranks[0]
    owner.worker._results = [(0, 0, 1, 5.0), (0, 0, 2, 3.0), (0, 0, 3, 3.0), (0, 0, 4, 3.0), (0, 0, 5, 3.0)]
    ls.run(*(lambda m=m: m.after_optimizer_step(2) for m in ranks))
    for m in ranks:
        assert m.ctrl.cur == 1 and m.ctrl.events[-1] == (2, "freeze", 0)
    # layer 0 = the anchor only, frozen too: Egeria freezes its prefix whole (may_freeze_anchor)
    assert ranks[0].frozen_tensors(3, 0, 0) == frozenset({"tok.weight"})
    # a non-evaluation step gathers nothing
    calls = ls.calls
    ls.run(*(lambda m=m: m.after_optimizer_step(3) for m in ranks))
    assert ls.calls == calls
    st = ranks[1].state_dict()
    fresh = Egeria(cfg, make_ctx([views[1]]))
    from timelyfreeze.runtime.state_codec import decode, encode

    fresh.load_state_dict(decode(encode(st)))  # through the checkpoint's plain-data form
    assert fresh.ctrl.cur == 1 and fresh.n == 2 and fresh.phase(5) == "active"
    for m in ranks:
        m.close()
