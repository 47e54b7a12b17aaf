"""Stand-in for ``torchrun -m timelyfreeze.train`` in the sweep tests: takes the same training
arguments and writes a fabricated ``<dump>/timelyfreeze/summary.json`` (and metrics.jsonl).

Environment knobs for the tests:
- ``FAKE_JOB_FAIL``: comma-separated methods that exit 1 (after printing to the log);
- ``FAKE_JOB_NO_SUMMARY``: comma-separated methods that exit 0 without writing summary.json;
- ``FAKE_JOB_SLEEP``: seconds to sleep before finishing;
- ``FAKE_JOB_PLAN_FAILED``: comma-separated methods that exit 0 with a summary reporting a failed plan;
- ``FAKE_JOB_CALLS``: a file to which every call appends its job folder name;
- ``FAKE_JOB_TRACE``: comma-separated methods that also write a small trace folder (``timelyfreeze/trace``).
"""

import json
import os
import sys
import time
from pathlib import Path


def arg(argv, flag, default=None):
    return argv[argv.index(flag) + 1] if flag in argv else default


def main(argv):
    dump = Path(arg(argv, "--job.dump_folder"))
    method = arg(argv, "--freeze.method")
    seed = int(arg(argv, "--freeze.seed"))
    schedule = arg(argv, "--parallelism.pipeline_parallel_schedule")
    steps = int(arg(argv, "--training.steps", 20))
    calls = os.environ.get("FAKE_JOB_CALLS")
    if calls:
        with open(calls, "a") as f:
            f.write(dump.parent.name + "\n")
    print(f"fake job: method={method} seed={seed} schedule={schedule} args={argv}", flush=True)
    time.sleep(float(os.environ.get("FAKE_JOB_SLEEP", "0")))
    if method in os.environ.get("FAKE_JOB_FAIL", "").split(","):
        print("Traceback (most recent call last):\nRuntimeError: fake failure", flush=True)
        return 1
    if method in os.environ.get("FAKE_JOB_NO_SUMMARY", "").split(","):
        return 0
    knob = None
    for name in (
        "r_max",
        "apf.threshold",
        "autofreeze.percentile",
        "egeria.tolerance_coef",
        "smartpipe.lam",
        "random.ratio",
    ):
        if f"--freeze.{name}" in argv:
            knob = {"name": name.split(".")[-1], "value": float(arg(argv, f"--freeze.{name}"))}
    speed = 1000.0 * (1 + (knob["value"] if knob else 0.0))
    tf = dump / "timelyfreeze"
    tf.mkdir(parents=True, exist_ok=True)
    val_curve = [[s, 6.0 - 0.05 * s] for s in range(5, steps + 1, 5)]
    with open(tf / "metrics.jsonl", "w") as f:
        for s in range(1, steps + 1):
            f.write(
                json.dumps(
                    {
                        "step": s,
                        "phase": "train",
                        "freeze_ratio": 0.0,
                        "step_ms": 100.0,
                        "batch_ms": 90.0,
                        "tokens_per_s": speed,
                        "loss": 7.0 - 0.05 * s,
                        "predicted_batch_ms": None,
                        "lr": 1e-3,
                    }
                )
                + "\n"
            )
    summary = {
        "format": "timelyfreeze-run/1",
        "method": method,
        "knob": knob,
        "schedule": schedule,
        "pp_degree": 2,
        "num_stages": 2,
        "num_microbatches": 4,
        "seed": seed,
        "steps": steps,
        "tokens_per_step": 100,
        "phases": {"train": [1, steps]},
        "tokens_per_s": {"all": speed * 0.9, "stable": speed},
        "mean_batch_ms": {"all": 90.0, "stable": 90.0},
        "predicted_batch_ms": None,
        "avg_freeze_ratio": knob["value"] / 2 if knob else 0.0,
        "final_loss": 7.0 - 0.05 * steps,
        "val_loss": val_curve[-1][1] if val_curve else None,
        "loss_curve": [],
        "val_curve": val_curve,
        "paths": {},
        "failures": (
            ["planning failed: fake (step 8); the run trained on without freezing"]
            if method in os.environ.get("FAKE_JOB_PLAN_FAILED", "").split(",")
            else []
        ),
    }
    if method in os.environ.get("FAKE_JOB_TRACE", "").split(","):
        (tf / "trace").mkdir(exist_ok=True)
        (tf / "trace" / "meta.json").write_text(json.dumps({"format": "timelyfreeze-trace/1", "schedule": schedule}))
        rows = [{"step": s, "action": "0F0", "ms": 1.0, "phase": "train", "freeze_ratio": 0.0} for s in range(steps)]
        (tf / "trace" / "actions_rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tf / "summary.json").write_text(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
