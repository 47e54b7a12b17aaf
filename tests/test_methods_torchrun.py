"""Every freezing method trains from a TOML on the embedded default (PP=2, 1F1B, CPU, torchrun):
it freezes something after its warm-up, the loss stays finite, and the trace follows the spec.

The knobs are set so that each method's criterion fires within a short run (the defaults are the
papers' values, tuned for thousands of steps)."""

from __future__ import annotations

import math

import pytest

from planner.trace.load import load_trace
from tests.torchrun_util import SHORT_SEQUENCES, torchrun

pytestmark = pytest.mark.torchrun

STEPS, WARMUP = 14, 4
COMMON = [
    "--training.steps",
    str(STEPS),
    "--freeze.warmup_steps",
    str(WARMUP),
    "--validation.freq",
    str(STEPS),
    "--validation.steps",
    "2",
    *SHORT_SEQUENCES,
]

CASES = {
    "random": ["--freeze.random.ratio", "0.5"],
    "apf": ["--freeze.apf.threshold", "1.01", "--freeze.apf.check_every", "2"],  # P <= 1: every tensor is "stable"
    "autofreeze": ["--freeze.autofreeze.check_every", "2"],
    "smartpipe": [
        "--freeze.smartpipe.tau",
        "2.0",
        "--freeze.smartpipe.lam",
        "0.5",
        "--freeze.smartpipe.check_every",
        "2",
    ],
    "egeria": [
        "--freeze.egeria.eval_every",
        "1",
        "--freeze.egeria.window",
        "2",
        "--freeze.egeria.tolerance_coef",
        "1.0",
        "--freeze.egeria.bootstrap_loss_rate",
        "1.0",
    ],
    "timelyfreeze_apf": [
        "--freeze.monitor_steps",
        "2",
        "--freeze.ramp_steps",
        "2",
        "--freeze.apf.check_every",
        "2",
        "--freeze.apf.threshold",
        "1.01",
    ],
    "timelyfreeze_autofreeze": [
        "--freeze.monitor_steps",
        "2",
        "--freeze.ramp_steps",
        "2",
        "--freeze.autofreeze.check_every",
        "2",
    ],
}


# kept out of `make test` for its 20-minute budget (`pytest -m slow`): timelyfreeze_autofreeze shares the hybrid
# path with timelyfreeze_apf and AutoFreeze's metric with autofreeze; apf's metric and freezing run in
# timelyfreeze_apf (its rule is unit-tested in test_methods_apf); random's fixed ratio goes through the same
# freezing hook as every other method (its own rule is unit-tested in test_methods_common)
SLOW = ("timelyfreeze_autofreeze", "apf", "random")


@pytest.mark.parametrize("method", [pytest.param(m, marks=pytest.mark.slow) if m in SLOW else m for m in CASES])
def test_method_runs_and_freezes(tmp_path, method):
    run = torchrun("llama3_debug_1f1b_cpu.toml", tmp_path / method, *COMMON, "--freeze.method", method, *CASES[method])
    assert run.rc == 0, run.tail()
    trace = load_trace(run.out / "trace")
    assert trace.meta.extra["method"] == method
    rows = [m for m in run.metrics() if "phase" in m]
    assert len(rows) == STEPS
    assert all(m["freeze_ratio"] == 0 for m in rows[:WARMUP]), [m["freeze_ratio"] for m in rows]
    assert max(m["freeze_ratio"] for m in rows[WARMUP:]) > 0, [(m["phase"], m["freeze_ratio"]) for m in rows]
    assert all(math.isfinite(m["loss"]) for m in rows)
    # the applied ratio recorded in the trace agrees with the per-step metric
    frozen_records = [r for r in trace.records if r.freeze_ratio > 0]
    assert frozen_records and min(r.step for r in frozen_records) > WARMUP
    summary = run.summary()
    assert summary["method"] == method and 0 < summary["avg_freeze_ratio"] < 1
