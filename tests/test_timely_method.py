"""TimelyFreeze's decisions: phases, lower bound, ramp, resampling, plan failure, checkpoint state."""

from __future__ import annotations

import torch

from timelyfreeze.config.freeze import Freeze, FreezeAdvanced
from timelyfreeze.job.phases import Phases
from timelyfreeze.job.stage_view import StageView
from timelyfreeze.methods.base import MethodContext
from timelyfreeze.methods.timely import TimelyFreezeMethod

PH = Phases(warmup_end=2, upper_end=4, lower_end=6, ramp_end=10)


def make(resample_every: int = 1) -> TimelyFreezeMethod:
    params = {f"t{i}": torch.nn.Parameter(torch.zeros(4)) for i in range(10)}
    view = StageView(
        stage=0,
        module=torch.nn.Module(),
        params=params,
        layer_of={n: 1 for n in params},
        layer_modules={},
        is_first=True,
        is_last=False,
        anchor="t0",
    )
    ctx = MethodContext(
        stages=[view],
        num_stages=2,
        num_microbatches=4,
        schedule="1F1B",
        total_steps=20,
        all_gather=lambda x: [x],
        get_lr=lambda: 1e-3,
        phases=PH,
    )
    return TimelyFreezeMethod(Freeze(advanced=FreezeAdvanced(resample_every=resample_every)), ctx)


def test_phases_and_lower_bound_freeze_everything_but_the_anchor():
    m = make()
    assert [m.phase(s) for s in (1, 3, 5)] == ["warmup", "upper", "lower"]
    assert m.frozen_tensors(1, 0, 0) == frozenset() and m.frozen_tensors(3, 0, 0) == frozenset()
    assert m.frozen_tensors(5, 0, 2) == frozenset(f"t{i}" for i in range(1, 10))
    assert m.needs_plan(6) and not m.needs_plan(5)


def test_ramp_follows_the_plan():
    m = make()
    m.set_plan({"0F0": 0.0, "0B0": 0.9, "0B1": 0.0, "0B2": 0.45, "0B3": 0.3})
    assert not m.needs_plan(6)
    assert m.phase(7) == "progressive" and m.phase(11) == "stable"
    # ratio = planned * (step - lower_end) / ramp_steps, then planned
    assert m.action_ratio(7, 0, 0) == 0.9 * 1 / 4
    assert m.action_ratio(9, 0, 2) == 0.45 * 3 / 4
    assert m.action_ratio(15, 0, 0) == 0.9 and m.action_ratio(15, 0, 1) == 0.0
    for step in range(7, 16):
        k = len(m.frozen_tensors(step, 0, 0))
        target = m.action_ratio(step, 0, 0) * 9
        assert int(target) <= k <= int(target) + 1 and "t0" not in m.frozen_tensors(step, 0, 0)


def test_fresh_masks_every_step_or_every_k_steps():
    m = make()
    m.set_plan({f"0B{i}": 0.5 for i in range(4)})
    masks = [m.frozen_tensors(s, 0, 1) for s in range(11, 19)]
    assert len(set(masks)) > 3
    assert m.frozen_tensors(12, 0, 1) == m.frozen_tensors(12, 0, 1)  # reproducible
    m3 = make(resample_every=3)
    m3.set_plan({f"0B{i}": 0.5 for i in range(4)})
    assert m3.frozen_tensors(13, 0, 1) == m3.frozen_tensors(14, 0, 1) == m3.frozen_tensors(15, 0, 1)


from timelyfreeze.runtime.state_codec import decode, encode  # noqa: E402  (checkpoint round trips)


def test_failed_plan_means_no_freezing_and_is_remembered():
    m = make()
    m.set_plan(None, "planning failed: infeasible")
    assert not m.needs_plan(8)
    assert m.phase(8) == "noplan" and m.frozen_tensors(12, 0, 0) == frozenset()
    m2 = make()
    m2.load_state_dict(decode(encode(m.state_dict())))
    assert m2.plan_failed == "planning failed: infeasible" and m2.phase(12) == "noplan"


def test_plan_survives_a_checkpoint_round_trip():
    m = make()
    m.set_plan({"0B0": 0.9, "0B3": 0.3})
    m2 = make()
    m2.load_state_dict(decode(encode(m.state_dict())))
    assert m2.frozen_tensors(14, 0, 0) == m.frozen_tensors(14, 0, 0)
    assert m2.action_ratio(14, 0, 3) == 0.3
