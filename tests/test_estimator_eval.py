"""timelyfreeze.experiments.studies.estimator_eval: out-of-sample errors of the node-weight estimators."""

import pytest

from planner.trace.simulate import synthetic_trace, write_trace
from timelyfreeze.experiments.studies.estimator_eval import evaluate_trace, main, summarize


@pytest.mark.parametrize("schedule", ["1F1B", "ZBVZeroBubble"])
def test_a_noise_free_trace_is_predicted_exactly_by_both(schedule):
    row = evaluate_trace(synthetic_trace(schedule, 2, 4, stable_ratio=0.4))
    assert row["stable_steps"] == 3 and row["f_factor"] == pytest.approx(1.0)
    for key in ("action_err_median", "action_err_pooled", "path_err_median", "path_err_pooled"):
        assert row[key] == pytest.approx(0.0, abs=1e-12)


def test_summary_pairs_the_estimators_per_run():
    rows = [
        {
            "schedule": "1F1B",
            "action_err_median": 0.1,
            "action_err_pooled": 0.08,
            "path_err_median": 0.05,
            "path_err_pooled": 0.06,
        },
        {
            "schedule": "1F1B",
            "action_err_median": 0.2,
            "action_err_pooled": 0.17,
            "path_err_median": 0.03,
            "path_err_pooled": 0.02,
        },
    ]
    s = {x["schedule"]: x for x in summarize(rows)}
    assert s["all"]["runs"] == 2 and s["1F1B"]["action_err_pooled_better"] == 2
    assert s["1F1B"]["action_err_diff"][0] == pytest.approx(-0.025)
    assert s["1F1B"]["path_err_pooled_better"] == 1


def test_main_refuses_a_folder_without_runs(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: no run")


def test_main_writes_the_tables(tmp_path):
    job = tmp_path / "sweep" / "jobs" / "j" / "dump" / "timelyfreeze"
    trace = synthetic_trace("1F1B", 2, 4, stable_ratio=0.4, jitter=0.05, seed=1)
    write_trace(trace, job / "trace")
    (job / "plan.json").write_text("{}")
    assert main([str(tmp_path / "sweep"), "--out", str(tmp_path / "out")]) == 0
    assert "| all | 1 |" in (tmp_path / "out" / "estimators.md").read_text()
    assert (tmp_path / "out" / "estimators.csv").read_text().startswith("run,schedule,f_factor")
