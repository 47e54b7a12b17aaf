"""The SmolLM2 studies' report (timelyfreeze.experiments.studies.smollm2_table1) on a hand-built sweep folder, and
the exact McNemar test it pools the accuracy with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from timelyfreeze.experiments.stats import mcnemar
from timelyfreeze.experiments.studies.smollm2_table1 import cells, job_rows, main, write_report


def test_mcnemar_is_the_exact_binomial_test_of_the_discordant_questions():
    assert mcnemar("11111", "00000") == (5, 0, 0.0625)  # 2 x 0.5^5
    assert mcnemar("111111", "000000") == (6, 0, 0.03125)
    assert mcnemar("1100", "1100") == (0, 0, 1.0)  # nothing discordant
    b, c, p = mcnemar("1010", "0110")  # one each way
    assert (b, c) == (1, 1) and p == 1.0
    with pytest.raises(ValueError, match="equally long"):
        mcnemar("10", "1")
    with pytest.raises(ValueError, match="strings of 0 and 1"):
        mcnemar("1x", "10")


def _job(out: Path, schedule, method, knob, seed, tps, acc_right, val_loss, ratios=(0.0, 0.0)):
    name = f"{schedule}__{method}" + (f"__r_max={knob:g}" if knob is not None else "") + f"__seed={seed}"
    d = out / "jobs" / name
    tf = d / "dump" / "timelyfreeze"
    tf.mkdir(parents=True)
    spec = {
        "schedule": schedule,
        "method": method,
        "knob": None if knob is None else {"name": "r_max", "value": knob},
        "seed": seed,
        "overrides": [],
    }
    (d / "job.json").write_text(json.dumps({"job_id": name, "spec": spec, "status": "ok"}))
    acc = acc_right.count("1") / len(acc_right)
    summary = spec | {
        "steps": 4,
        "tokens_per_s": {"stable": tps, "all": tps},
        "mean_batch_ms": {"stable": 1000.0, "all": 1000.0},
        "val_loss": val_loss,
        "val_curve": [[4, val_loss]],
        "val_acc": acc,
        "val_acc_right": acc_right,
    }
    (tf / "summary.json").write_text(json.dumps(summary))
    phases = ["warmup", "warmup", "stable", "stable"]
    rows = [{"step": i + 1, "phase": p, "freeze_ratio": 0.0, "step_ms": 1000.0} for i, p in enumerate(phases)]
    rows[2]["freeze_ratio"], rows[3]["freeze_ratio"] = ratios
    (tf / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def folder(tmp_path):
    out = tmp_path / "study"
    for seed, (none_right, tf_right) in enumerate([("11110000", "11111100"), ("00001111", "11001111")]):
        _job(out, "1F1B", "none", None, seed, 100.0, none_right, 2.0)
        _job(out, "1F1B", "timelyfreeze", 0.8, seed, 130.0 + 10 * seed, tf_right, 2.1 + 0.1 * seed, (0.4, 0.6))
        _job(out, "1F1B", "timelyfreeze", 0.4, seed, 110.0, none_right, 2.0)
    return out


def test_each_job_is_paired_with_its_seeds_no_freezing_job(folder):
    jobs = {j["job_id"]: j for j in job_rows(folder)}
    j = jobs["1F1B__timelyfreeze__r_max=0.8__seed=1"]
    assert j["kappa"] == pytest.approx(1.4) and j["dacc"] == pytest.approx(6 / 8 - 4 / 8)
    assert j["dval"] == pytest.approx(0.2) and j["ratio_stable"] == pytest.approx(0.5)
    assert jobs["1F1B__none__seed=0"]["kappa"] == 1.0 and jobs["1F1B__none__seed=0"]["dacc"] == 0.0


def test_the_cells_pool_the_seeds_answers_in_one_mcnemar_test(folder):
    cs = {(c["method"], c["knob_value"]): c for c in cells(job_rows(folder))}
    tf = cs[("timelyfreeze", 0.8)]
    assert tf["seeds"] == 2 and tf["kappa_mean"] == pytest.approx(1.35)
    # seed 0: 2 questions only it got right; seed 1: 2 of its own and 0 of no freezing's
    assert (tf["questions"], tf["only_arm_right"], tf["only_none_right"]) == (16, 4, 0)
    assert tf["mcnemar_p"] == pytest.approx(0.125) and tf["paired"] == "no difference resolved"
    assert tf["throughput"] == "no difference resolved"  # 1.3 and 1.4: t(0.975, 1) = 12.7 makes it [0.71, 1.99]
    same = cs[("timelyfreeze", 0.4)]
    assert (same["only_arm_right"], same["only_none_right"], same["mcnemar_p"]) == (0, 0, 1.0)
    assert cs[("none", None)].get("paired") is None  # the reference has no verdicts


def test_the_report_writes_its_tables_and_figure6(folder):
    md = write_report(folder).read_text()
    assert "| 1F1B | timelyfreeze r_max=0.8 | 2 |" in md and "4 vs 0 of 16, p = 0.125" in md
    report = folder / "report"
    assert (report / "figure6.png").stat().st_size > 1000
    assert (report / "smollm2_cells.csv").read_text().count("\n") == 4  # header and three cells


def test_a_folder_without_jobs_is_one_error_line(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_the_pilot_table_sizes_from_the_log_and_the_step_times(tmp_path):
    from timelyfreeze.experiments.studies.smollm2_table1 import pilot_rows

    pilot = tmp_path / "pilot"
    for name, right, steps in (("pretrained", "1100", 1), ("1F1B_none", "1111", 12)):
        tf = pilot / name / "timelyfreeze"
        tf.mkdir(parents=True)
        acc = right.count("1") / 4
        summary = {"val_acc": acc, "val_acc_norm": acc, "val_loss": 2.5, "val_acc_right": right}
        (tf / "summary.json").write_text(json.dumps(summary))
        rows = [{"step": k, "step_ms": 1000.0 * (1 + (k >= 11))} for k in range(1, steps + 1)]
        (tf / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (pilot / "pilot.log").write_text(
        "pilot: pretrained started 2026-11-28T10:00:00Z, load 0.1 0.1 0.1\n"
        "pilot: pretrained ended 2026-11-28T10:05:00Z, load 1 1 1\n"
        "pilot: 1F1B_none started 2026-11-28T10:05:01Z, load 1 1 1\n"
        "$ a command line\n"
        "pilot: 1F1B_none ended 2026-11-28T10:12:01Z, load 1 1 1\n"
    )
    rows = {r["job"]: r for r in pilot_rows(pilot)}
    assert rows["pretrained"]["median step (s)"] == "1.00" and rows["pretrained"]["T_fixed (s)"] == "299"
    none = rows["1F1B_none"]
    assert none["median step (s)"] == "2.00"  # steps 11 and 12: the config's stable phase
    assert (none["wall-clock (s)"], none["T_fixed (s)"]) == ("420", str(420 - 14))  # 10 x 1 s + 2 x 2 s of steps
    assert none["vs pretrained (McNemar)"] == "2 vs 0, p = 0.500"
