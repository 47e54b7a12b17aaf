"""``[experiment] stop_at_val_loss`` (time-to-accuracy runs): the stop rule, the LR held past its schedule, and
the config checks. The end-to-end run is in tests/test_sweep_torchrun.py."""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import pytest

from timelyfreeze.config.freeze import Experiment, FreezeConfigError
from timelyfreeze.config.job_checks import check_stop_rule
from timelyfreeze.titan.trainer import _held_after, target_reached


def test_target_reached_only_on_a_validation_step_past_the_floor():
    curve = [[2, 5.0], [4, 4.7], [6, 4.6]]
    assert target_reached(curve, 6, 6, 4.65)
    assert not target_reached(curve, 6, 8, 4.65)  # the LR schedule's length is not trained yet
    assert not target_reached(curve, 7, 6, 4.65)  # step 7 did not validate: its last point is older
    assert not target_reached(curve, 6, 6, 4.55)  # not there yet
    assert target_reached(curve, 6, 6, 4.6)  # at the target counts
    assert not target_reached([], 6, 6, 4.65)


def test_lr_holds_the_schedules_end_value():
    def cosine(step, total=10, floor=0.1):  # 1 -> floor over 0..total, rising again after (TorchTitan's shape)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * step / total))

    held = functools.partial(_held_after, cosine, 10)
    assert [held(s) for s in range(11)] == [cosine(s) for s in range(11)]
    assert cosine(15) > cosine(10)  # what the hold prevents
    assert all(held(s) == pytest.approx(0.1) for s in range(10, 30))


def test_stop_rule_config_checks():
    on = SimpleNamespace(enable=True)
    with pytest.raises(FreezeConfigError, match=r"\[experiment\] stop_at_val_loss = -1"):
        check_stop_rule(Experiment(stop_at_val_loss=-1.0), on)
    with pytest.raises(FreezeConfigError, match=r"stop_at_val_loss = inf"):
        check_stop_rule(Experiment(stop_at_val_loss=math.inf), on)
    check_stop_rule(Experiment(stop_at_val_loss=4.5), on)
    with pytest.raises(FreezeConfigError, match=r"needs validation: set \[validation\] enable = true"):
        check_stop_rule(Experiment(stop_at_val_loss=4.5), SimpleNamespace(enable=False))
    check_stop_rule(Experiment(stop_at_val_loss=4.5), on)
    check_stop_rule(Experiment(), SimpleNamespace(enable=False))
