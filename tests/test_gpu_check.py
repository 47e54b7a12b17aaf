"""The GPU check without a GPU: one ``error:`` line and exit code 2 when CUDA is asked for; part (c) (one
transformer block) run on CPU at small sizes through the same path as on a GPU, its times read from its result
file only; the parts chosen for each GPU count; the check of recorded start times against the host's view, on
fake numbers, on the CPU profiler, and on the CUDA profiler with fake events whose device runs behind the host."""

from __future__ import annotations

import json
import math
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.test_step_clock import FakeDevice
from timelyfreeze.experiments.studies import gpu_check
from timelyfreeze.experiments.studies.gpu_block import BlockSize
from timelyfreeze.experiments.studies.gpu_host_view import (
    HOST_VIEW_ENV,
    RUN_AHEAD_MS,
    HostView,
    HostViewRecorder,
    check_start_times,
    load_host_view,
)
from timelyfreeze.hooks.profiler import ActionProfiler
from timelyfreeze.hooks.step_clock import StepClock
from timelyfreeze.titan.launch import REPO_ROOT as ROOT


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA host runs the check itself")
def test_without_cuda_one_error_line_and_exit_2():
    p = subprocess.run(
        [sys.executable, "scripts/gpu_check.py"], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("error: no CUDA device") and p.stderr.count("\n") == 1


def test_block_part_runs_on_cpu(tmp_path, capsys):
    rc = gpu_check.main(["--device", "cpu", "--hidden", "64", "--seq", "32", "--repeats", "2", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "results.json").read_text())
    assert rc == 0, results["block"]
    times = results["block"]["times"]
    assert (times["device"], times["hidden"], times["seq"], times["dtype"]) == ("cpu", 64, 32, "float32")
    for k in ("F_ms", "B_ms", "I_ms", "W_ms", "B_all_frozen_ms", "W_share_of_F_plus_B"):
        assert math.isfinite(times[k]), k
    assert set(results["not_tested"]) == {p.name for p in gpu_check.PARTS} - {"block"}
    assert "not tested: NCCL with one GPU per rank" in capsys.readouterr().out


def test_block_part_without_its_result_file_fails_loudly(tmp_path):
    """A run that prints its times (or a warning) and exits 0 but writes no result file has failed."""
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho \'{"F_ms": 1.0}\'\necho "UserWarning: something" >&2\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    res = gpu_check.run_block(tmp_path, device="cpu", size=BlockSize(64, 32, 2), timeout_s=30, python=str(fake))
    assert res["rc"] == 1 and "times" not in res and "no block.json written" in res["error"]


def test_parts_by_gpu_count():
    assert gpu_check.plan_parts(0, "cpu").run == ("block",)
    one = gpu_check.plan_parts(1)
    assert one.run == ("1f1b", "zbv", "1f1b_compile", "block")
    assert set(one.not_tested) == {"nccl_pp2", "nccl_pp2_fsdp2"}
    assert "start times against the host's view" in one.not_tested["nccl_pp2"]
    assert "needs 2 GPUs, 1 at hand" in one.not_tested["nccl_pp2"]
    assert gpu_check.plan_parts(2).run == gpu_check.plan_parts(3).run == (*one.run, "nccl_pp2")
    four = gpu_check.plan_parts(4)
    assert four.run == (*one.run, "nccl_pp2", "nccl_pp2_fsdp2") and four.not_tested == {}


def _row(action="0F0", start=120.0, enqueued=100.0, pending=119.9, seen=120.2, step=1, ms=5.0):
    return HostView(0, step, action, start, ms, enqueued, pending, seen)


def test_start_times_inside_the_host_bounds_pass_and_test_the_claim():
    c = check_start_times([_row(), _row("0B0", start=125.0, enqueued=100.1, pending=124.95, seen=125.3)])
    assert c.ok and c.tested and c.max_lead_ms == pytest.approx(24.85)
    assert c.line().startswith("start times: OK")


def test_host_timed_starts_fail_when_the_host_ran_ahead():
    """A profiler reading the host clock at the call records the time the action was enqueued: too early."""
    c = check_start_times([_row(start=100.0)])
    assert not c.ok and c.early and "before the GPU started" in c.line()


def test_start_time_failures_and_an_untested_claim():
    assert check_start_times([_row(start=121.0)]).late
    assert check_start_times([_row(seen=None)]).unseen
    swapped = check_start_times([_row("0F0", start=130.0, pending=100.0, seen=131.0), _row("0B0", enqueued=101.0)])
    assert swapped.out_of_order == ("rank 0 step 1 0B0 before 0F0",)
    calm = check_start_times([_row(enqueued=119.0, pending=119.0 + RUN_AHEAD_MS / 2)])
    assert calm.ok and not calm.tested and "NOT TESTED" in calm.line()
    empty = check_start_times([])
    assert not empty.ok and "no rows" in empty.line()


def test_recorder_on_the_cpu_profiler(tmp_path):
    prof = ActionProfiler(0, use_cuda=False)
    HostViewRecorder(tmp_path, 0).attach(prof)
    for step in (1, 2):
        for kind in ("F", "B"):
            prof.before_action(0, kind, 0)
            prof.after_action(0, kind, 0)
        assert [a for a, _, _ in prof.collect()] == ["0F0", "0B0"]
    rows = load_host_view(tmp_path)
    assert [(r.step, r.action) for r in rows] == [(1, "0F0"), (1, "0B0"), (2, "0F0"), (2, "0B0")]
    c = check_start_times(rows)
    assert c.ok and not c.tested  # on CPU the host never runs ahead: the start is the host clock at the call


def vars_of(r: HostView) -> tuple:
    return r.ms, r.enqueued_ms, r.pending_ms, r.seen_ms


def test_recorder_on_the_cuda_profiler_with_a_host_ahead(tmp_path):
    dev = FakeDevice(lag_s=0.5)  # one stream on the host's clock, 0.5 s behind the host at first
    clock = StepClock(True, event=dev.event_class(), now=dev.now)
    prof = ActionProfiler(0, use_cuda=True, clock=clock)
    rec = HostViewRecorder(tmp_path, 0, now=lambda: dev.now() * 1e3, poll_thread=False)
    rec.attach(prof)
    clock.begin_step()
    for kind, seconds in (("F", 0.010), ("B", 0.020)):
        prof.before_action(0, kind, 0)
        dev.run(seconds)
        prof.after_action(0, kind, 0)
        dev.host_s += 0.050  # the host goes on for 50 ms; the GPU is still behind
        rec.poll()
    prof.collect()  # the step's one synchronisation
    [f, b] = load_host_view(tmp_path)
    assert (f.action, f.start_ms, b.start_ms) == ("0F0", pytest.approx(100_500.0), pytest.approx(100_510.0))
    assert f.pending_ms >= f.enqueued_ms + 50.0 and f.seen_ms >= f.start_ms and b.seen_ms >= b.start_ms
    c = check_start_times([f, b])
    assert c.ok and c.tested
    host_timed = [HostView(r.rank, r.step, r.action, r.enqueued_ms, *vars_of(r)) for r in (f, b)]
    assert check_start_times(host_timed).early  # the host's clock at the call would have been caught


@pytest.mark.parametrize("parallel", [(), gpu_check.FSDP2])
def test_nccl_part_launches_the_worker_and_fails_on_a_bad_start_time(tmp_path, monkeypatch, parallel):
    """The command, without running it: torchrun with the host-view worker on as many processes as
    ``launch.nproc_of`` counts for the run's arguments; a row outside the host's bounds fails the part even when
    the run succeeded."""
    seen = {}

    def nproc_of(config, extra):
        seen["extra"] = list(extra)
        return 7

    def fake_run(cmd, log, *, env, timeout):
        from timelyfreeze.experiments.studies.gpu_host_view import _Enqueued

        seen.update(cmd=cmd, env=env)
        e = _Enqueued("0F0", 99.0, None, 130.0)
        e.pending_ms = 120.0  # the GPU had not started at 120 ms: a start recorded at 100 ms is too early
        HostViewRecorder(Path(env[HOST_VIEW_ENV]), 0)._write([("0F0", 5.0, 100.0)], [e], set())
        log.write_text("ok\n")
        return 0

    monkeypatch.setattr(gpu_check.launch, "nproc_of", nproc_of)
    monkeypatch.setattr(gpu_check.launch, "run", fake_run)
    part = {p.name: p for p in gpu_check.PARTS}["nccl_pp2_fsdp2" if parallel else "nccl_pp2"]
    res = gpu_check._nccl_cycle(part, tmp_path, *parallel)
    assert seen["extra"][-len(parallel) :] == list(parallel) if parallel else seen["extra"] == gpu_check.CYCLE
    assert "--nproc_per_node=7" in seen["cmd"] and res["nproc"] == 7
    assert seen["cmd"][seen["cmd"].index("-m", 3) + 1] == "timelyfreeze.experiments.studies.gpu_host_view"
    assert res["rc"] == 1 and not res["start_times"]["ok"] and res["start_times"]["early"]
