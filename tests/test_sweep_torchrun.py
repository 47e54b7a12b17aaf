"""One real two-job sweep end to end on CPU: no freezing vs TimelyFreeze, then the report."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from tests.torchrun_util import ROOT

pytestmark = pytest.mark.torchrun


def test_two_job_sweep_end_to_end(tmp_path):
    out = tmp_path / "sweep"
    cmd = [
        sys.executable, "scripts/sweep.py", "run", "--config", "torchtitan_configs/llama3_debug_1f1b_cpu.toml",
        "--out", str(out), "--schedule", "1F1B", "--method", "none", "--method", "timelyfreeze=0.8",
        "--set", "training.steps=14", "--set", "freeze.warmup_steps=2", "--set", "freeze.monitor_steps=3",
        "--set", "freeze.ramp_steps=3", "--set", "validation.freq=7", "--set", "validation.steps=2",
        "--set", "metrics.enable_tensorboard=false", "--timeout", "400",
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
    for png in ("pareto.png", "throughput_vs_rmax.png"):
        assert (out / "report" / png).stat().st_size > 10_000
    assert (out / "report" / "report.md").read_text().count("|") > 20
    # re-running skips both finished jobs
    p2 = subprocess.run(cmd + ["--no-report"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p2.returncode == 0 and "2 skipped" in p2.stdout, p2.stdout[-2000:]
