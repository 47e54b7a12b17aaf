"""kappa with the machine's speed taken out by the forward actions (timelyfreeze.experiments.sweep.yardstick), on
hand-built job folders whose traces come from the planner's simulator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.trace.simulate import synthetic_trace, write_trace
from timelyfreeze.experiments.sweep.results import load_job
from timelyfreeze.experiments.sweep.yardstick import forward_ms, kappa_fwd, steady_steps

PHASES = ["upper", "upper", "lower", "lower", "stable", "stable"]  # synthetic_trace's steps with steps=2


def _job(out: Path, name: str, f_ms: float, step_ms: float, phases: list[str], trace: bool = True) -> dict:
    tf = out / name / "dump" / "timelyfreeze"
    tf.mkdir(parents=True)
    (out / name / "job.json").write_text(json.dumps({"job_id": name, "spec": {"schedule": "1F1B"}, "status": "ok"}))
    rows = [{"step": i + 1, "phase": p, "step_ms": step_ms, "batch_ms": step_ms} for i, p in enumerate(phases)]
    (tf / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if trace:
        write_trace(synthetic_trace("1F1B", 2, 4, f_ms=f_ms, steps=2, stable_ratio=0.5), tf / "trace")
    return load_job(out / name)


def test_the_steady_steps_are_the_stable_phase_or_else_all_but_the_transient_ones():
    assert steady_steps([{"step": s, "phase": p, "step_ms": 1.0} for s, p in enumerate(PHASES, 1)]) == [5, 6]
    assert steady_steps([{"step": s, "phase": "train", "step_ms": 1.0} for s in (1, 2, 3)]) == [1, 2, 3]
    assert steady_steps([{"step": 1, "phase": "warmup", "step_ms": 1.0}, {"step": 2, "phase": "train"}]) == []


def test_forward_time_is_the_sum_of_each_forward_actions_median_over_the_steps(tmp_path):
    job = _job(tmp_path, "a", 1.5, 1000.0, PHASES)
    # 1F1B on 2 ranks with 4 microbatches: 2 stages x 4 microbatches of forwards, each f_ms long
    assert forward_ms(job["_trace"], [5, 6]) == pytest.approx(8 * 1.5)
    assert forward_ms(job["_trace"], [7]) is None  # no records in those steps


def test_a_reference_on_a_slower_machine_is_scaled_back_by_its_forwards(tmp_path):
    arm = _job(tmp_path, "arm", 1.0, 1000.0, PHASES)
    # the reference ran 10 % slower in everything, forwards included: the machine, not freezing
    none = _job(tmp_path, "none", 1.1, 1100.0, ["train"] * 6)
    assert kappa_fwd(arm, none) == pytest.approx(1.0)
    # the same machine speed: kappa_fwd is the step-time ratio over the arm's stable steps
    same = _job(tmp_path, "none_same", 1.0, 1300.0, ["train"] * 6)
    assert kappa_fwd(arm, same) == pytest.approx(1.3)


def test_without_a_trace_or_common_steps_there_is_no_kappa_fwd(tmp_path):
    arm = _job(tmp_path, "arm", 1.0, 1000.0, PHASES)
    assert kappa_fwd(arm, _job(tmp_path, "bare", 1.0, 1000.0, ["train"] * 6, trace=False)) is None
    assert kappa_fwd(arm, _job(tmp_path, "short", 1.0, 1000.0, ["train"] * 4)) is None  # no step 5 or 6


def test_kind_times_sum_each_ranks_actions_of_a_kind_per_step_and_take_the_median(tmp_path):
    from timelyfreeze.experiments.sweep.yardstick import kind_times

    job = _job(tmp_path, "a", 1.5, 1000.0, PHASES)
    got = kind_times(job["_trace"], [1, 2])  # the upper-bound steps: nothing frozen
    assert set(got) == {(0, "F"), (0, "B"), (1, "F"), (1, "B")}
    assert got[(0, "F")] == pytest.approx(4 * 1.5) and got[(1, "F")] == pytest.approx(4 * 1.5)
    assert got[(0, "B")] == pytest.approx(4 * 2.0)  # synthetic_trace's b_ms, stage scale 1
    assert kind_times(job["_trace"], [9]) == {}
