"""A rank killed with SIGKILL mid-run, three times (in warm-up, in upper-bound monitoring, in the stable
phase), and the job restarted each time with the same command: it resumes from TorchTitan's last
checkpoint in the same phase with the same measurements and plan, the trace keeps every record flushed
before the kill and has none twice, and the final outputs are complete."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from planner.plan import load_plan
from tests.torchrun_util import ENV, ROOT, command, frozen_count_fits, short_cycle

pytestmark = pytest.mark.torchrun

WARMUP, MONITOR, RAMP, STABLE = 3, 3, 3, 4
STEPS = WARMUP + 2 * MONITOR + RAMP + STABLE
PHASES = {"warmup": (1, 3), "upper": (4, 6), "lower": (7, 9), "progressive": (10, 12), "stable": (13, 16)}
KILLS = {"warmup": 1, "upper": 4, "stable": 13}
"""Rank 1 is killed once the checkpoint of this step is complete. The kill lands a few milliseconds
later, so the job restarts from that step's checkpoint or, rarely, the next one: each phase leaves two
more steps after the kill's checkpoint, so the restored step is in the same phase either way."""


def phase_of(step: int) -> str:
    return next(p for p, (a, b) in PHASES.items() if a <= step <= b)


def worker_pid(dump: Path, rank: int) -> int | None:
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            env = b"\0" + (d / "environ").read_bytes()
        except OSError:
            continue
        if (
            b"timelyfreeze.train" in cmd
            and str(dump).encode() in cmd
            and f"\0RANK={rank}\0".encode() in env
            and b"TORCHELASTIC_RUN_ID" in env
        ):
            return int(d.name)
    return None


def launch(dump: Path, log: Path) -> subprocess.Popen:
    args = [
        *short_cycle(WARMUP, MONITOR, RAMP, STABLE),
        "--checkpoint.enable",
        "--checkpoint.interval",
        "1",
        "--checkpoint.keep_latest_k",
        "3",
        "--checkpoint.no-last-save-model-only",
    ]
    return subprocess.Popen(
        command("llama3_debug_1f1b_cpu.toml", dump, *args),
        cwd=ROOT,
        env=ENV,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def kill_after_checkpoint(proc: subprocess.Popen, dump: Path, step: int, timeout: float = 300) -> None:
    """Once TorchTitan's checkpoint of ``step`` is complete, SIGKILL rank 1 and wait for the job to end."""
    deadline = time.monotonic() + timeout
    marker = dump / "checkpoint" / f"step-{step}" / ".metadata"
    while not marker.exists():
        assert proc.poll() is None, f"the job ended before step {step} was checkpointed"
        assert time.monotonic() < deadline, f"no checkpoint of step {step} within {timeout} s"
        time.sleep(0.02)
    pid = worker_pid(dump, 1)
    assert pid is not None, "rank 1's process not found"
    os.kill(pid, signal.SIGKILL)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode != 0


def restored_step(log: Path) -> int:
    lines = [line for line in log.read_text().splitlines() if "restored freezing state at step" in line]
    assert lines, log.read_text()[-3000:]
    return int(lines[-1].rsplit("step", 1)[1].split()[0])


def trace_lines(out: Path) -> dict[int, list[str]]:
    return {r: (out / "trace" / f"actions_rank{r}.jsonl").read_text().splitlines() for r in range(2)}


def test_sigkill_and_restart_in_every_phase(tmp_path):
    dump = tmp_path / "run"
    out = dump / "timelyfreeze"
    snapshots = []  # (what the trace and plan held right after each kill)
    plan_bytes = None
    for i, kill_at in enumerate(KILLS.values()):
        log = tmp_path / f"launch{i}.log"
        proc = launch(dump, log)
        kill_after_checkpoint(proc, dump, kill_at)
        snapshots.append(trace_lines(out))
        if i == 2:
            plan_bytes = (out / "plan.json").read_bytes()
    log = tmp_path / "launch3.log"
    proc = launch(dump, log)
    assert proc.wait(timeout=600) == 0, log.read_text()[-5000:]

    logs = [(tmp_path / f"launch{i}.log") for i in range(4)]
    resumed = [restored_step(line) for line in logs[1:]]
    # each restart restores a checkpoint of the phase the kill interrupted (metrics below: and goes on in it)
    assert [phase_of(s) for s in resumed] == list(KILLS), resumed
    # planned once (third launch), never again after the restart in the stable phase
    assert "plan written" in logs[2].read_text() and "plan written" not in logs[3].read_text()
    assert (out / "plan.json").read_bytes() == plan_bytes
    # the trace: every record flushed before a kill, up to the restored step, is kept as it was ...
    final = trace_lines(out)
    for snap, step in zip(snapshots, resumed):
        for r in range(2):
            kept = [line for line in snap[r] if json.loads(line)["step"] <= step]
            assert [line for line in final[r] if json.loads(line)["step"] <= step] == kept
    # ... and no (step, action) appears twice, none is missing
    meta = json.loads((out / "trace" / "meta.json").read_text())
    for r in range(2):
        seen: dict[tuple[int, str], int] = {}
        for line in final[r]:
            rec = json.loads(line)
            seen[(rec["step"], rec["action"])] = seen.get((rec["step"], rec["action"]), 0) + 1
            assert rec["phase"] == phase_of(rec["step"]), rec
        assert set(seen.values()) == {1}
        assert set(seen) == {(s, a) for s in range(1, STEPS + 1) for a in meta["rank_orders"][str(r)]}
    # the stable steps after the last restart freeze what the plan in force says: plan.json, or the latest
    # re-plan of the final metrics (a loaded machine can drift past the re-planning threshold), which
    # applies from the step after it
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    replanned = sorted(m["step"] for m in rows if m.get("replan"))
    for line in final[0]:
        rec = json.loads(line)
        if rec["step"] > resumed[2] and rec["action"].startswith("0B"):
            before = [n for n in replanned if n < rec["step"]]
            plan = load_plan(out / "replans" / f"plan_step{before[-1]}.json" if before else out / "plan.json")
            target = plan.actions[rec["action"]].freeze_ratio * meta["freezable_tensors"]["0"]
            assert frozen_count_fits(rec["frozen_tensors"], target)
    # complete final outputs: one metrics row per step in its phase, the summary, the timeline
    steps = [m["step"] for m in rows if "phase" in m]
    assert steps == list(range(1, STEPS + 1))
    assert all(m["phase"] == phase_of(m["step"]) for m in rows if "phase" in m)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == STEPS and not summary["failures"]
    assert summary["phases"] == {p: list(r) for p, r in PHASES.items()}
    assert (out / "timeline.png").stat().st_size > 10_000
