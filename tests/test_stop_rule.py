"""``[experiment] stop_at_val_loss`` (time-to-accuracy runs): the stop rule, the LR held past its schedule, the
config checks, and the held-out accuracy scored where the rule stops a run. The end-to-end runs are in
tests/test_sweep_torchrun.py (the sweep's extension) and tests/test_runtime_torchrun.py (the accuracy at the
stop, ZBV's full cycle)."""

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


def _validator(accuracy_freq: int, freq: int = 5, steps: int = 12):
    from timelyfreeze.titan.spec import FixedBatchValidator

    v = FixedBatchValidator.__new__(FixedBatchValidator)  # the rule alone: no dataloader, no scorer's questions
    v.scorer = object()
    v.job_config = SimpleNamespace(
        instruct=SimpleNamespace(accuracy_freq=accuracy_freq),
        validation=SimpleNamespace(freq=freq),
        training=SimpleNamespace(steps=steps),
    )
    return v


def test_accuracy_is_scored_at_its_own_freq_and_at_the_end():
    assert [s for s in range(1, 13) if _validator(0).scores_accuracy(s)] == [5, 10, 12]  # every validation
    assert [s for s in range(1, 13) if _validator(10).scores_accuracy(s)] == [10, 12]
    assert [s for s in range(1, 13) if _validator(15).scores_accuracy(s)] == [12]  # only where the run ends
    none = _validator(0)
    none.scorer = None
    assert not any(none.scores_accuracy(s) for s in range(1, 13))


def test_accuracy_freq_must_name_validation_steps():
    from timelyfreeze.config.instruct import Instruct
    from timelyfreeze.config.job_checks import check_instruct

    on = SimpleNamespace(enable=True, freq=5)
    check_instruct(Instruct(questions=4, accuracy_freq=0), on)
    check_instruct(Instruct(questions=4, accuracy_freq=15), on)
    with pytest.raises(FreezeConfigError, match=r"accuracy_freq = 7 must be a multiple of \[validation\] freq = 5"):
        check_instruct(Instruct(questions=4, accuracy_freq=7), on)
    with pytest.raises(FreezeConfigError, match=r"accuracy_freq"):
        check_instruct(Instruct(questions=4, accuracy_freq=-5), on)
    check_instruct(Instruct(questions=0, accuracy_freq=7), on)  # no accuracy: nothing to schedule


def _processor(score_at_stop):
    from timelyfreeze.titan.spec import FreezeMetricsProcessor

    p = FreezeMetricsProcessor.__new__(FreezeMetricsProcessor)  # log_validation's own part, TorchTitan's stubbed
    p.logger, p.on_validation, p.pending_accuracy, p.scored, p.score_at_stop = None, [], None, False, score_at_stop
    heard = []
    p.on_validation.append(lambda step, loss, acc: heard.append((step, loss, acc)))
    return p, heard


def test_a_validation_that_did_not_score_asks_the_stop_rule(monkeypatch):
    from torchtitan.components.metrics import MetricsProcessor

    from timelyfreeze.data.choice_task import Accuracy

    monkeypatch.setattr(MetricsProcessor, "log_validation", lambda self, loss, step, *a, **k: None)
    asked = []
    at_target, scored = Accuracy(0.5, 0.5, 0.25, 4), Accuracy(0.75, 0.5, 0.25, 4)

    def at_stop(step, loss):
        asked.append((step, loss))
        return at_target if loss <= 4.0 else None

    p, heard = _processor(at_stop)
    p.log_validation(4.5, 10)  # not scored, not at the target: no accuracy
    p.log_validation(3.9, 12)  # not scored, at the target: scored now
    p.pending_accuracy, p.scored = scored, True
    p.log_validation(3.8, 15)  # scored by the validator: the stop rule is not asked
    p.scored = True  # scored, on a rank that is not the last stage's (no result here): not asked either
    p.log_validation(3.7, 20)
    assert asked == [(10, 4.5), (12, 3.9)]
    assert heard == [(10, 4.5, None), (12, 3.9, at_target), (15, 3.8, scored), (20, 3.7, None)]
    assert p.pending_accuracy is None and p.scored is False


def test_the_trainer_scores_once_where_the_target_stops_the_run():
    from timelyfreeze.titan.trainer import TimelyFreezeTrainer

    t = TimelyFreezeTrainer.__new__(TimelyFreezeTrainer)  # _score_at_stop's own part
    scored = []
    t.validator = SimpleNamespace(scorer=SimpleNamespace(score=lambda v, parts: scored.append(parts) or "acc"))
    t.model_parts = ["stage"]
    t.job_config = SimpleNamespace(lr_scheduler=SimpleNamespace(total_steps=10), training=SimpleNamespace(steps=20))
    last_stage_loss = {"loss": 0.0}
    t.freeze_rt = SimpleNamespace(
        info=SimpleNamespace(stop_at_val_loss=4.0), gathered_val_loss=lambda loss: last_stage_loss["loss"]
    )
    last_stage_loss["loss"] = 3.5
    assert t._score_at_stop(8, -1.0) is None  # below the floor (the LR schedule's 10 steps)
    last_stage_loss["loss"] = 4.2
    assert t._score_at_stop(12, -1.0) is None  # above the target
    last_stage_loss["loss"] = 4.0
    assert t._score_at_stop(14, -1.0) == "acc"  # the gathered loss decides, not this rank's -1
    assert scored == [["stage"]]
