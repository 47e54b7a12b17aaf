"""One real two-job sweep end to end on CPU: no freezing vs TimelyFreeze, then the report."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from tests.torchrun_util import ROOT, SHORT_SEQUENCES

pytestmark = pytest.mark.torchrun


def test_two_job_sweep_end_to_end(tmp_path):
    out = tmp_path / "sweep"
    cmd = [
        sys.executable,
        "scripts/sweep.py",
        "run",
        "--config",
        "torchtitan_configs/llama3_debug_1f1b_cpu.toml",
        "--out",
        str(out),
        "--schedule",
        "1F1B",
        "--method",
        "none",
        "--method",
        "timelyfreeze=0.8",
        "--set",
        "training.steps=14",
        "--set",
        "freeze.warmup_steps=2",
        "--set",
        "freeze.monitor_steps=3",
        "--set",
        "freeze.ramp_steps=3",
        "--set",
        "validation.freq=7",
        "--set",
        "validation.steps=2",
        "--set",
        "metrics.enable_tensorboard=false",
        *(
            a
            for flag, value in zip(SHORT_SEQUENCES[::2], SHORT_SEQUENCES[1::2])
            for a in ("--set", f"{flag[2:]}={value}")
        ),
        "--timeout",
        "400",
        "--extend-to-target",
        "2",
    ]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    assert "[1/2]" in p.stdout and "[2/2]" in p.stdout
    rows = list(csv.DictReader(open(out / "report" / "results.csv")))
    assert {r["method"] for r in rows} == {"none", "timelyfreeze"}
    by = {r["method"]: r for r in rows}
    assert all(r["status"] == "ok" for r in rows)
    for r in rows:
        assert float(r["tokens_per_s_all"]) > 0 and float(r["val_loss"]) > 0
    assert float(by["none"]["avg_freeze_ratio"]) == 0.0
    assert float(by["timelyfreeze"]["avg_freeze_ratio"]) > 0.0
    assert float(by["timelyfreeze"]["predicted_batch_ms"]) > 0
    # time to accuracy: the freezing job trains 14 steps, then on (LR held) until a validation reaches the
    # no-freezing final loss, or 28 steps
    assert int(by["none"]["steps"]) == 14
    target = float(by["none"]["val_loss"])
    tf_dir = out / "jobs" / "1F1B__timelyfreeze__r_max=0.8__seed=0"
    summary = json.loads((tf_dir / "dump" / "timelyfreeze" / "summary.json").read_text())
    assert summary["stop_at_val_loss"] == target
    last_step, last_loss = summary["val_curve"][-1]
    assert summary["steps"] == last_step and (last_loss <= target or last_step == 28)
    assert all(loss > target for s, loss in summary["val_curve"] if 14 <= s < last_step)
    metrics = [json.loads(line) for line in open(tf_dir / "dump" / "timelyfreeze" / "metrics.jsonl")]
    lrs = {m["step"]: m["lr"] for m in metrics if "lr" in m}
    if last_step > 14:  # past the schedule's 14 steps the LR holds the schedule's end value (min_lr)
        assert lrs[15] < lrs[14] and all(lrs[s] == lrs[15] for s in lrs if s > 15)
    # the trace was packed before job.json said ok; the report's planner sweep and timeline read the archive
    assert (tf_dir / "dump" / "timelyfreeze" / "trace.tar.gz").is_file()
    assert not (tf_dir / "dump" / "timelyfreeze" / "trace").exists()
    assert "pack_error" not in json.loads((tf_dir / "job.json").read_text())
    tta = {r["job_id"]: r for r in csv.DictReader(open(out / "report" / "tta.csv"))}
    assert float(tta[tf_dir.name]["target_loss"]) == target
    for png in ("pareto.png", "throughput_vs_rmax.png"):
        assert (out / "report" / png).stat().st_size > 10_000
    assert (out / "report" / "report.md").read_text().count("|") > 20
    # re-running skips both finished jobs
    p2 = subprocess.run(cmd + ["--no-report"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p2.returncode == 0 and "2 skipped" in p2.stdout, p2.stdout[-2000:]
