"""timelyfreeze.experiments (grid, runner, resume; tables, TTA, plots), as scripts/sweep.py drives it,
with a fake launcher (tests/fake_job.py) and hand-written job outputs: no real training."""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from planner.errors import PlannerError
from timelyfreeze.experiments.sweep.cli import main
from timelyfreeze.experiments.sweep.command import build_command
from timelyfreeze.experiments.sweep.grid import KNOBS, GridError, Job, expand_grid, load_grid_file
from timelyfreeze.experiments.sweep.pareto import pareto_front
from timelyfreeze.experiments.sweep.plots import _plt
from timelyfreeze.experiments.sweep.predictions import Planner
from timelyfreeze.experiments.sweep.report import build_report
from timelyfreeze.experiments.sweep.runner import run_sweep
from timelyfreeze.experiments.sweep.tta import interp_at, steps_to_reach, tta_rows

REPO = Path(__file__).resolve().parent.parent

FAKE = f"{sys.executable} {REPO / 'tests' / 'fake_job.py'}"


@pytest.fixture
def base_toml(tmp_path):
    p = tmp_path / "base.toml"
    p.write_text("[training]\nsteps = 20\n[parallelism]\npipeline_parallel_degree = 2\n")
    return p


# ------------------------------------------------------------------------------------------ grid
def test_expand_grid_counts_ids_and_knobs(base_toml):
    grid = {
        "schedules": ["1F1B", "GPipe"],
        "seeds": [0, 1],
        "methods": {"none": True, "timelyfreeze": [0.4, 0.8], "apf": [0.05], "egeria": [2]},
        "overrides": {"training.steps": 40},
    }
    jobs = expand_grid(grid)
    assert len(jobs) == 2 * 2 * (1 + 2 + 1 + 1)
    ids = [j.job_id for j in jobs]
    assert len(set(ids)) == len(ids)
    assert "1F1B__timelyfreeze__r_max=0.8__seed=0" in ids
    assert "GPipe__none__seed=1" in ids
    assert "1F1B__apf__threshold=0.05__seed=1" in ids
    assert "GPipe__egeria__tolerance_coef=2__seed=0" in ids
    none = [j for j in jobs if j.method == "none"]
    assert len(none) == 4 and all(j.knob_value is None and j.knob_name is None for j in none)
    # interleaved: every cell's seed 0 runs before any seed 1
    assert [j.seed for j in jobs] == [0] * (len(jobs) // 2) + [1] * (len(jobs) // 2)

    by_id = {j.job_id: j for j in jobs}
    cmd = build_command(
        by_id["1F1B__timelyfreeze__r_max=0.8__seed=0"], base_toml, "/venv/python", dump_folder="/o/jobs/x/dump"
    )
    assert cmd[:6] == [
        "/venv/python",
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=localhost:0",
    ]
    assert cmd[6:8] == ["-m", "timelyfreeze.train"]
    tail = " ".join(cmd[8:])
    assert f"--job.config_file {base_toml} --job.dump_folder /o/jobs/x/dump" in tail
    assert "--freeze.method timelyfreeze" in tail and "--freeze.r_max 0.8" in tail
    assert "--freeze.seed 0" in tail and "--parallelism.pipeline_parallel_schedule 1F1B" in tail
    assert "--training.steps 40" in tail
    # every parallel degree counts: a job that shards each stage over 2 ranks needs 4 processes
    fsdp = by_id["1F1B__timelyfreeze__r_max=0.8__seed=0"]
    fsdp = fsdp.__class__(**{**fsdp.__dict__, "overrides": (("parallelism.data_parallel_shard_degree", 2),)})
    assert build_command(fsdp, base_toml, "py")[3] == "--nproc_per_node=4"

    apf = " ".join(build_command(by_id["GPipe__apf__threshold=0.05__seed=1"], base_toml, "py"))
    assert "--freeze.apf.threshold 0.05" in apf and "r_max" not in apf
    plain = " ".join(build_command(by_id["GPipe__none__seed=1"], base_toml, "py"))
    assert "--freeze.method none" in plain
    assert not any(flag in plain for _, flag in filter(None, KNOBS.values()))

    fake = build_command(none[0], base_toml, "py", launcher="python tests/fake_job.py")
    assert fake[:2] == ["python", "tests/fake_job.py"] and fake[2] == "--job.config_file"


def test_grid_file_schedule_and_method_overrides(tmp_path, base_toml):
    g = tmp_path / "grid.toml"
    g.write_text(f'''config = "{base_toml.name}"
schedules = ["1F1B", "Interleaved1F1B"]
[overrides]
"training.steps" = 10
"validation.enable" = false
[methods]
timelyfreeze_apf = {{values = [0.8], overrides = {{"freeze.apf.threshold" = 0.05}}}}
[schedule_overrides.Interleaved1F1B]
"parallelism.pipeline_parallel_layers_per_stage" = 1
"parallelism.pipeline_parallel_degree" = 4
''')
    grid = load_grid_file(g)
    assert grid["config"] == str(base_toml)
    jobs = expand_grid(grid)
    assert [j.job_id for j in jobs] == [
        "1F1B__timelyfreeze_apf__r_max=0.8__seed=0",
        "Interleaved1F1B__timelyfreeze_apf__r_max=0.8__seed=0",
    ]
    c1, c2 = (build_command(j, base_toml, "py") for j in jobs)
    assert "--validation.no-enable" in c1 and "--freeze.apf.threshold" in c1
    assert "--parallelism.pipeline_parallel_layers_per_stage" not in c1 and "--nproc_per_node=2" in c1
    assert "--parallelism.pipeline_parallel_layers_per_stage" in c2 and "--nproc_per_node=4" in c2


@pytest.mark.parametrize(
    "grid, msg",
    [
        ({"schedules": ["1F1B"], "methods": {"freezeall": [1]}}, "unknown method"),
        ({"schedules": ["1F1B"], "methods": {"none": [0.5]}}, "no knob"),
        ({"schedules": ["1F1B"], "methods": {"timelyfreeze": []}}, "r_max values"),
        ({"schedules": ["1F1B"], "methods": {"apf": ["x"]}}, "not a number"),
        ({"schedules": ["1F1B"], "methods": {}}, "no methods"),
        ({"methods": {"none": True}}, "no schedules"),
        ({"schedules": ["1F1B", "1F1B"], "methods": {"none": True}}, "repeats"),
    ],
)
def test_grid_errors(grid, msg):
    with pytest.raises(GridError, match=msg):
        expand_grid(grid)


def test_cli_flags_dry_run(base_toml, tmp_path, capsys):
    rc = main(
        [
            "run",
            "--config",
            str(base_toml),
            "--out",
            str(tmp_path / "o"),
            "--schedule",
            "1F1B",
            "--method",
            "none",
            "--method",
            "timelyfreeze=0.5,1",
            "--seed",
            "3",
            "--set",
            "training.steps=7",
            "--dry-run",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "3 jobs" in out
    assert "1F1B__timelyfreeze__r_max=1__seed=3" in out and "--training.steps 7" in out
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------------------- runner
def _run(base_toml, out, *extra):
    return main(
        [
            "run",
            "--config",
            str(base_toml),
            "--out",
            str(out),
            "--schedule",
            "1F1B",
            "--method",
            "none",
            "--method",
            "timelyfreeze=0.5",
            "--method",
            "apf=0.1",
            "--launcher",
            FAKE,
            "--no-report",
            *extra,
        ]
    )


def test_grid_record_adds_up_runs_of_one_schedule_each(base_toml, tmp_path):
    """grid.json: a run with --schedule adds its schedule and jobs to the record of earlier runs into the same
    folder instead of replacing it."""
    out = tmp_path / "o"
    for schedule in ("1F1B", "GPipe"):
        assert (
            main(
                [
                    "run",
                    "--config",
                    str(base_toml),
                    "--out",
                    str(out),
                    "--schedule",
                    schedule,
                    "--method",
                    "none",
                    "--launcher",
                    FAKE,
                    "--no-report",
                ]
            )
            == 0
        )
    rec = json.loads((out / "grid.json").read_text())
    assert rec["schedules"] == ["1F1B", "GPipe"]
    assert rec["jobs"] == ["1F1B__none__seed=0", "GPipe__none__seed=0"]


def _calls(path):
    return path.read_text().split() if path.exists() else []


def test_sweep_failure_resume_and_retry(base_toml, tmp_path, monkeypatch, capsys):
    out, calls = tmp_path / "o", tmp_path / "calls.txt"
    monkeypatch.setenv("FAKE_JOB_CALLS", str(calls))
    monkeypatch.setenv("FAKE_JOB_FAIL", "none")
    assert _run(base_toml, out) == 1  # a failed job makes the sweep exit non-zero...
    text = capsys.readouterr().out
    assert len(_calls(calls)) == 3  # ...but the jobs after it still ran
    nf_dir = out / "jobs" / "1F1B__none__seed=0"
    assert f"[1/3] 1F1B__none__seed=0 ... FAILED (exit 1, see {nf_dir / 'log.txt'})" in text
    assert "[2/3] 1F1B__timelyfreeze__r_max=0.5__seed=0 ... ok " in text and "ETA" in text
    assert "sweep: 2 ok, 1 failed, 0 skipped (done before); failed: 1F1B__none__seed=0" in text
    rec = json.loads((nf_dir / "job.json").read_text())
    assert rec["status"] == "failed" and rec["exit_code"] == 1 and "fake failure" in rec["log_tail"]
    assert rec["command"][:2] == FAKE.split() and rec["start_time"] and rec["end_time"]
    apf_dir = out / "jobs" / "1F1B__apf__threshold=0.1__seed=0"
    ok = json.loads((apf_dir / "job.json").read_text())
    assert ok["status"] == "ok" and ok["exit_code"] == 0 and "log_tail" not in ok
    assert (apf_dir / "log.txt").read_text().count("fake job: method=apf") == 1

    # second run: the failed job runs again (and now succeeds), finished ones are skipped
    calls.unlink()
    monkeypatch.delenv("FAKE_JOB_FAIL")
    assert _run(base_toml, out) == 0
    assert _calls(calls) == ["1F1B__none__seed=0"]
    assert "skipped (done)" in capsys.readouterr().out

    # incomplete jobs run again: summary.json gone, or job.json left 'running' by a killed sweep
    calls.unlink()
    (out / "jobs" / "1F1B__none__seed=0" / "dump" / "timelyfreeze" / "summary.json").unlink()
    tf = out / "jobs" / "1F1B__timelyfreeze__r_max=0.5__seed=0" / "job.json"
    tf.write_text(json.dumps({**json.loads(tf.read_text()), "status": "running"}))
    assert _run(base_toml, out) == 0
    assert sorted(_calls(calls)) == ["1F1B__none__seed=0", "1F1B__timelyfreeze__r_max=0.5__seed=0"]

    # a changed override makes finished results stale
    calls.unlink()
    assert _run(base_toml, out, "--set", "training.steps=10") == 0
    assert len(_calls(calls)) == 3


def test_an_ok_jobs_trace_is_packed_before_job_json_says_ok(base_toml, tmp_path, monkeypatch, capsys):
    """The trace folder becomes trace.tar.gz (planner.trace.archive); a packed job is done on resume; a job that
    failed keeps its folder; a re-run removes the archive an earlier run packed."""
    from planner.trace.archive import read_archive
    from timelyfreeze.experiments.sweep.results import load_job

    out, calls = tmp_path / "o", tmp_path / "calls.txt"
    monkeypatch.setenv("FAKE_JOB_CALLS", str(calls))
    monkeypatch.setenv("FAKE_JOB_TRACE", "none,timelyfreeze,apf")
    monkeypatch.setenv("FAKE_JOB_FAIL", "apf")
    assert _run(base_toml, out) == 1
    jobs = out / "jobs"
    tf = jobs / "1F1B__timelyfreeze__r_max=0.5__seed=0" / "dump" / "timelyfreeze"
    assert not (tf / "trace").exists()
    assert set(read_archive(tf / "trace.tar.gz")) == {"meta.json", "actions_rank0.jsonl"}
    rec = json.loads((tf.parents[1] / "job.json").read_text())
    assert rec["status"] == "ok" and "pack_error" not in rec
    assert (jobs / "1F1B__none__seed=0" / "dump" / "timelyfreeze" / "trace.tar.gz").is_file()
    assert not (jobs / "1F1B__apf__threshold=0.1__seed=0" / "dump" / "timelyfreeze" / "trace").exists()  # exit 1
    calls.unlink()
    monkeypatch.delenv("FAKE_JOB_FAIL")
    capsys.readouterr()
    assert _run(base_toml, out) == 0
    assert _calls(calls) == ["1F1B__apf__threshold=0.1__seed=0"]  # the packed jobs are done
    assert capsys.readouterr().out.count("skipped (done)") == 2
    assert load_job(tf.parents[1])["_trace"] == tf / "trace.tar.gz"  # what the report's planner calls read

    # a stale job runs again: its earlier run's output goes before the new run starts, the packed trace and the
    # final checkpoint (from which TorchTitan would resume and train no step) included
    calls.unlink()
    monkeypatch.setenv("FAKE_JOB_TRACE", "")
    stale = tf.parent / "checkpoint" / "step-30"
    stale.mkdir(parents=True)
    (tf / "replans").mkdir()
    (tf / "replans" / "plan_step25.json").write_text("{}")
    assert _run(base_toml, out, "--set", "training.steps=10") == 0
    assert len(_calls(calls)) == 3 and not (tf / "trace.tar.gz").exists() and not (tf / "trace").exists()
    assert not stale.parent.exists() and not (tf / "replans").exists() and (tf / "summary.json").is_file()


def test_a_pack_failure_leaves_the_folder_and_the_job_ok(base_toml, tmp_path, monkeypatch, capsys):
    from timelyfreeze.experiments.sweep import runner

    def fail(folder):
        raise PlannerError(f"{folder}: cannot write: No space left on device")

    monkeypatch.setattr(runner, "pack_trace", fail)
    monkeypatch.setenv("FAKE_JOB_TRACE", "timelyfreeze")
    out = tmp_path / "o"
    assert _run(base_toml, out) == 0
    job = out / "jobs" / "1F1B__timelyfreeze__r_max=0.5__seed=0"
    rec = json.loads((job / "job.json").read_text())
    assert rec["status"] == "ok" and rec["pack_error"].endswith("trace: cannot write: No space left on device")
    assert (job / "dump" / "timelyfreeze" / "trace" / "meta.json").is_file()
    text = capsys.readouterr().out
    assert f"1F1B__timelyfreeze__r_max=0.5__seed=0 ... trace left unpacked: {rec['pack_error']}" in text
    assert "sweep: 3 ok, 0 failed" in text


def test_no_retry_failed_and_missing_summary(base_toml, tmp_path, monkeypatch, capsys):
    out, calls = tmp_path / "o", tmp_path / "calls.txt"
    monkeypatch.setenv("FAKE_JOB_CALLS", str(calls))
    monkeypatch.setenv("FAKE_JOB_FAIL", "apf")
    monkeypatch.setenv("FAKE_JOB_NO_SUMMARY", "none")
    assert _run(base_toml, out) == 1
    rec = json.loads((out / "jobs" / "1F1B__none__seed=0" / "job.json").read_text())
    assert rec["status"] == "failed" and rec["exit_code"] == 0 and "no timelyfreeze/summary.json" in rec["reason"]
    assert "FAILED (exit 0 but no summary.json" in capsys.readouterr().out
    calls.unlink()
    assert _run(base_toml, out, "--no-retry-failed") == 1
    assert _calls(calls) == []


def test_a_run_that_survived_a_failed_plan_is_a_failed_job(base_toml, tmp_path, monkeypatch, capsys):
    out = tmp_path / "o"
    monkeypatch.setenv("FAKE_JOB_PLAN_FAILED", "none")
    assert _run(base_toml, out) == 1
    rec = json.loads((out / "jobs" / "1F1B__none__seed=0" / "job.json").read_text())
    assert rec["status"] == "failed" and rec["exit_code"] == 0 and "planning failed: fake" in rec["reason"]
    assert "FAILED (the run reported: planning failed: fake" in capsys.readouterr().out


def test_timeout_and_interrupt(base_toml, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_JOB_SLEEP", "30")
    job = Job("1F1B", "none", None, 0)
    lines = []
    res = run_sweep(
        [job],
        tmp_path,
        lambda j, d: build_command(j, base_toml, launcher=FAKE, dump_folder=d),
        timeout_s=1.0,
        print_fn=lines.append,
    )
    rec = json.loads((tmp_path / "jobs" / job.job_id / "job.json").read_text())
    # stopped before its 30 s sleep ended (a job that ran to its end would take longer); no tighter bound, as a
    # loaded machine may be slow to start and stop it
    assert rec["status"] == "timeout" and rec["duration_s"] < 30 and res.failed == [job.job_id]
    assert "TIMEOUT" in lines[1]

    # Ctrl-C: the running job is stopped and marked interrupted, the sweep stops there
    jobs = [Job("1F1B", "random", 0.5, 0), Job("1F1B", "random", 0.6, 0)]
    # a process started in the background by a non-interactive shell inherits SIGINT ignored, and
    # Python then raises no KeyboardInterrupt: restore the default handler as an interactive run has it
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        res = run_sweep(
            jobs,
            tmp_path,
            lambda j, d: build_command(j, base_toml, launcher=FAKE, dump_folder=d),
            print_fn=lines.append,
        )
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert res.interrupted == jobs[0].job_id and res.exit_code == 130
    rec = json.loads((tmp_path / "jobs" / jobs[0].job_id / "job.json").read_text())
    assert rec["status"] == "interrupted" and rec["duration_s"] < 20
    assert not (tmp_path / "jobs" / jobs[1].job_id).exists()


def test_sigterm_stops_a_sweep_as_ctrl_c_does(base_toml, tmp_path, monkeypatch):
    """kill <sweep pid>: the running job's process group is stopped and the job recorded interrupted (it was
    left "running", its training going on in a session of its own); the handler is restored afterwards."""
    monkeypatch.setenv("FAKE_JOB_SLEEP", "30")
    jobs = [Job("1F1B", "random", 0.5, 0), Job("1F1B", "random", 0.6, 0)]
    before = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        res = run_sweep(
            jobs,
            tmp_path,
            lambda j, d: build_command(j, base_toml, launcher=FAKE, dump_folder=d),
            print_fn=lambda line: None,
        )
    finally:
        timer.cancel()
    assert res.interrupted == jobs[0].job_id and res.exit_code == 130
    rec = json.loads((tmp_path / "jobs" / jobs[0].job_id / "job.json").read_text())
    assert rec["status"] == "interrupted" and rec["duration_s"] < 20
    assert not (tmp_path / "jobs" / jobs[1].job_id).exists()
    assert signal.getsignal(signal.SIGTERM) == before


# ---------------------------------------------------------------------------------------- report
def write_job(out, job_id, summary=None, status="ok", metrics=None, timeline=False):
    d = out / "jobs" / job_id
    tf = d / "dump" / "timelyfreeze"
    tf.mkdir(parents=True)
    (d / "job.json").write_text(json.dumps({"job_id": job_id, "status": status}))
    if summary is not None:
        schedule, method, *rest = job_id.split("__")
        knob = None
        if len(rest) == 2:
            k, v = rest[0].split("=")
            knob = {"name": k, "value": float(v)}
        full = {
            "format": "timelyfreeze-run/1",
            "method": method,
            "knob": knob,
            "schedule": schedule,
            "seed": int(rest[-1].split("=")[1]),
            "steps": 30,
            "tokens_per_step": 1000,
            "tokens_per_s": {"all": None, "stable": None},
            "mean_batch_ms": {"all": 100.0, "stable": 90.0},
            "predicted_batch_ms": None,
            "avg_freeze_ratio": 0.0,
            "final_loss": 6.0,
            "val_loss": None,
            "val_curve": [],
        }
        full.update(summary)
        (tf / "summary.json").write_text(json.dumps(full))
    if metrics is not None:
        (tf / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics) + '{"step": 4, "lo')
    if timeline:
        (tf / "trace").mkdir()
        (tf / "trace" / "meta.json").write_text("{}")
        (tf / "plan.json").write_text("{}")
    return d


def tps(stable, all_=None):
    return {"tokens_per_s": {"stable": stable, "all": all_ if all_ is not None else stable * 0.8}}


@pytest.fixture
def fabricated(tmp_path):
    """1F1B, seed 0 unless named: (stable tokens/s, last val loss)
    none (1000, 5.00), tf 0.5 (1250, 4.95) + seed 1 (1350, 4.85), tf 0.8 (1600, 5.20), apf (1100, 5.30),
    random (1600, 5.25); GPipe: none (900, 5.0), tf 0.8 of another length; one failed job."""
    out = tmp_path / "sweep"
    nf_curve = [[10, 6.0], [20, 5.5], [30, 5.0]]

    def steps(ms):  # 30 steps of ``ms`` each (the wall clock of time to accuracy)
        return [
            {"step": k, "step_ms": ms, "batch_ms": ms - 10, "tokens_per_s": 1e6 / ms, "loss": 6.0, "freeze_ratio": 0.0}
            for k in range(1, 31)
        ]

    write_job(out, "1F1B__none__seed=0", {**tps(1000), "val_loss": 5.0, "val_curve": nf_curve}, metrics=steps(100.0))
    write_job(
        out,
        "1F1B__timelyfreeze__r_max=0.5__seed=0",
        {
            **tps(1250),
            "val_loss": 4.95,
            "val_curve": [[10, 5.8], [20, 5.2], [30, 4.95]],
            "predicted_batch_ms": {"no_freeze": 120.0, "all_frozen": 80.0, "planned": 100.0},
            "avg_freeze_ratio": 0.3,
        },
        timeline=True,
        metrics=steps(80.0),
    )
    write_job(
        out,
        "1F1B__timelyfreeze__r_max=0.5__seed=1",
        {**tps(1350), "val_loss": 4.85, "val_curve": [[10, 5.7], [30, 4.85]]},
    )
    write_job(
        out,
        "1F1B__timelyfreeze__r_max=0.8__seed=0",
        {
            **tps(1600),
            "val_loss": 5.2,
            "val_curve": [[10, 6.2], [20, 5.6], [30, 5.2]],
            "predicted_batch_ms": {"no_freeze": 120.0, "all_frozen": 80.0, "planned": 90.0},
        },
        timeline=True,
    )
    write_job(out, "1F1B__apf__threshold=0.1__seed=0", {**tps(1100), "val_loss": 5.3, "val_curve": [[30, 5.3]]})
    write_job(out, "1F1B__random__ratio=0.3__seed=0", {**tps(1600), "val_loss": 5.25, "val_curve": [[30, 5.25]]})
    write_job(out, "GPipe__none__seed=0", {**tps(900), "val_loss": 5.0, "val_curve": [[20, 5.0]]})
    write_job(
        out,
        "GPipe__timelyfreeze__r_max=0.8__seed=0",
        {**tps(1000), "steps": 20, "val_loss": 5.1, "val_curve": [[20, 5.1]]},
    )
    write_job(
        out,
        "GPipe__apf__threshold=0.1__seed=0",
        None,
        status="failed",
        metrics=[
            {"step": 1, "step_ms": 100.0, "batch_ms": 80.0, "tokens_per_s": 1000.0, "loss": 7.0, "freeze_ratio": 0.0},
            {
                "step": 2,
                "step_ms": 300.0,
                "batch_ms": 280.0,
                "tokens_per_s": 2000.0,
                "loss": 6.5,
                "freeze_ratio": 0.2,
                "val_loss": 6.8,
            },
        ],
    )
    return out


def test_curve_helpers():
    curve = [[10, 6.0], [20, 5.5], [30, 5.0], [40, 5.2]]
    assert interp_at(curve, 25) == pytest.approx(5.25)
    assert interp_at(curve, 40) == 5.2 and interp_at(curve, 50) is None
    assert steps_to_reach(curve, 5.2) == pytest.approx(26.0)  # 5.0 then 5.2: at or below from step 26 on
    assert steps_to_reach(curve, 5.1) is None  # the last point is above: not held
    assert steps_to_reach(curve, 6.5) == 10.0  # there from the first validation point on
    assert steps_to_reach(curve, 4.9) is None
    # touching the target early does not count: the crossing into the final run at or below it does
    bumpy = [[10, 5.0], [20, 5.3], [30, 5.1], [40, 4.9], [50, 4.8]]
    assert steps_to_reach(bumpy, 5.0) == pytest.approx(35.0)
    assert steps_to_reach(bumpy, 5.2) == pytest.approx(25.0)


def test_pareto_front_hand_checked():
    pts = [(1000, 5.0), (1250, 4.95), (1600, 5.2), (1100, 5.3), (1600, 5.25), (1250, 4.95)]
    assert pareto_front(pts) == [False, True, True, False, False, True]


def test_report_tables_on_fabricated_outputs(fabricated):
    rep = build_report(fabricated, planner=None, print_fn=lambda s: None)
    with open(fabricated / "report" / "results.csv") as f:
        rows = {r["job_id"]: r for r in csv.DictReader(f)}
    assert len(rows) == 9
    r = rows["1F1B__timelyfreeze__r_max=0.5__seed=0"]
    assert (r["method"], r["knob_name"], float(r["knob_value"]), r["schedule"], r["seed"], r["steps"]) == (
        "timelyfreeze",
        "r_max",
        0.5,
        "1F1B",
        "0",
        "30",
    )
    assert float(r["tokens_per_s_stable"]) == 1250 and float(r["tokens_per_s_all"]) == 1000
    assert float(r["mean_batch_ms_stable"]) == 90 and float(r["predicted_batch_ms"]) == 100
    assert float(r["avg_freeze_ratio"]) == 0.3 and float(r["val_loss"]) == 4.95 and r["status"] == "ok"
    nf = rows["1F1B__none__seed=0"]
    assert nf["knob_name"] == "" and nf["knob_value"] == "" and nf["predicted_batch_ms"] == ""
    # the failed job: figures from its metrics.jsonl (torn last line ignored)
    f = rows["GPipe__apf__threshold=0.1__seed=0"]
    assert f["status"] == "failed" and f["steps"] == "2" and f["method"] == "apf"
    assert float(f["tokens_per_s_all"]) == pytest.approx(1750.0)  # (100 + 600) tokens / 0.4 s
    assert float(f["final_loss"]) == 6.5 and float(f["val_loss"]) == 6.8 and float(f["avg_freeze_ratio"]) == 0.1

    configs = {(c["schedule"], c["method"], c["knob_value"]): c for c in rep["configs"]}
    tf05 = configs[("1F1B", "timelyfreeze", 0.5)]
    assert tf05["seeds"] == 2 and tf05["tokens_per_s"] == 1300 and tf05["loss"] == pytest.approx(4.9)
    front = {k for k, c in configs.items() if c["pareto"]}
    assert front == {
        ("1F1B", "timelyfreeze", 0.5),
        ("1F1B", "timelyfreeze", 0.8),
        ("GPipe", "none", None),
        ("GPipe", "timelyfreeze", 0.8),
    }  # 900 @ 5.0 vs 1000 @ 5.1
    assert ("GPipe", "apf", 0.1) not in configs  # failed jobs are not configurations
    with open(fabricated / "report" / "configs.csv") as f:
        assert sum(1 for r in csv.DictReader(f) if r["pareto"] == "True") == 4

    tta = {t["job_id"]: t for t in rep["tta"]}
    t = tta["1F1B__timelyfreeze__r_max=0.5__seed=0"]
    # target: no-freezing loss at its last validation point (step 30) = 5.0, reached by NF at step 30
    assert t["target_step"] == 30 and t["target_loss"] == 5.0 and t["steps_nf"] == 30
    assert t["steps_method"] == pytest.approx(28.0)  # 20 + (5.2 - 5.0) / (5.2 - 4.95) * 10
    assert t["kappa"] == pytest.approx(1.25) and t["steps_ratio"] == pytest.approx(28 / 30)
    # wall clock: 28 steps of 80 ms vs 30 steps of 100 ms
    assert t["wall_s_method"] == pytest.approx(2.24) and t["wall_s_nf"] == pytest.approx(3.0)
    assert t["tta_ratio"] == pytest.approx(2.24 / 3.0)
    assert t["val_loss_same_step"] == 4.95 and t["dval"] == pytest.approx(-0.05)
    assert t["predicted_speedup"] == pytest.approx(1.2)  # its plan: 120 ms without freezing, 100 ms planned
    t = tta["1F1B__timelyfreeze__r_max=0.8__seed=0"]
    assert t["kappa"] == pytest.approx(1.6) and t["steps_method"] is None
    assert t["note"] == "not reached within 30 steps" and t["dval"] == pytest.approx(0.2)
    assert t["tta_ratio"] is None
    assert tta["1F1B__none__seed=0"]["tta_ratio"] == 1.0 and tta["1F1B__none__seed=0"]["dval"] == 0.0
    assert "no no-freezing run" in tta["1F1B__timelyfreeze__r_max=0.5__seed=1"]["note"]
    t = tta["GPipe__timelyfreeze__r_max=0.8__seed=0"]
    assert t["note"] == "not reached within 20 steps" and t["dval"] == pytest.approx(0.1)
    cells = {(c["schedule"], c["method"], c["knob_value"]): c for c in rep["cells"]}
    c = cells[("1F1B", "timelyfreeze", 0.5)]  # seed 1 has no no-freezing partner: one paired value
    assert c["seeds"] == 2 and c["reached"] == 1 and c["kappa_mean"] == pytest.approx(1.25)
    assert c["kappa_lo"] is None and c["throughput"] is None
    assert (fabricated / "report" / "cells.csv").is_file()
    # an earlier target step: NF loss at step 15 = 5.75; tf 0.5 reaches it at 10 + (5.8-5.75)/0.6*10
    t = {t["job_id"]: t for t in tta_rows(rep["rows"], tta_step=15)}["1F1B__timelyfreeze__r_max=0.5__seed=0"]
    assert t["target_loss"] == pytest.approx(5.75) and t["steps_nf"] == pytest.approx(15.0)
    assert t["steps_method"] == pytest.approx(10 + 0.05 / 0.6 * 10)
    with open(fabricated / "report" / "tta.csv") as f:
        assert {r["job_id"]: r["note"] for r in csv.DictReader(f)}[
            "1F1B__timelyfreeze__r_max=0.8__seed=0"
        ] == "not reached within 30 steps"
    md = (fabricated / "report" / "report.md").read_text()
    assert "| 1F1B__timelyfreeze__r_max=0.5__seed=0 | timelyfreeze | r_max | 0.5 |  | 1F1B |" in md
    assert "not reached" in md and "![" in md


class FakePlanner:
    def __init__(self):
        self.sweeps, self.gantts = [], []

    def sweep(self, trace, r_values):
        self.sweeps.append((trace, list(r_values)))
        return [{"r_max": r, "batch_ms": 120 / (1 + 0.4 * r), "speedup": 1 + 0.4 * r} for r in r_values]

    def gantt(self, trace, plan, out_png):
        self.gantts.append(plan)
        plt = _plt()
        fig, ax = plt.subplots(figsize=(4, 2))
        ax.barh([0, 1], [3, 5], left=[0, 1])
        fig.savefig(out_png)
        plt.close(fig)


def _nontrivial_png(path):
    import matplotlib.image as mpimg

    assert path.is_file() and path.stat().st_size > 5000, path
    img = mpimg.imread(path)
    assert img.shape[0] > 200 and img.shape[1] > 300 and img[..., :3].std() > 0.05, path


def test_plots_with_planner(fabricated):
    planner = FakePlanner()
    rep = build_report(fabricated, planner=planner, print_fn=lambda s: None)
    d = fabricated / "report"
    for name in ("pareto.png", "throughput_vs_rmax.png", "tta.png", "tta_curves.png"):
        _nontrivial_png(d / name)
    assert (d / "timeline_1F1B.png").is_file()
    # one planner sweep per TimelyFreeze job with a trace, over 0..1 plus the grid's r_max values
    assert len(planner.sweeps) == 2 and {0.0, 0.5, 0.8, 1.0} <= set(planner.sweeps[0][1])
    # the timeline is of the largest-r_max plain TimelyFreeze run
    assert planner.gantts == [
        fabricated / "jobs" / "1F1B__timelyfreeze__r_max=0.8__seed=0" / "dump" / "timelyfreeze" / "plan.json"
    ]
    assert "throughput_vs_rmax.png" in (d / "report.md").read_text()
    assert any("no trace" in w for w in rep["warnings"])


def test_report_without_planner_falls_back(fabricated, capsys):
    tl = fabricated / "jobs" / "1F1B__timelyfreeze__r_max=0.8__seed=0" / "dump" / "timelyfreeze" / "timeline.png"
    tl.write_bytes(b"\x89PNG fake")
    assert main(["report", str(fabricated), "--no-planner"]) == 0
    assert (fabricated / "report" / "timeline_1F1B.png").read_bytes() == b"\x89PNG fake"
    assert "copied the runtime's timeline.png" in capsys.readouterr().out
    assert main(["report", str(fabricated / "nothing")]) == 2


@pytest.mark.skipif(not (REPO / "planner" / "cli.py").is_file(), reason="planner CLI not in this tree yet")
def test_report_with_real_planner_sweep(fabricated):
    """The real planner sweep (in process) on a synthetic trace feeds the throughput-vs-r_max plot."""
    trace = fabricated / "jobs" / "1F1B__timelyfreeze__r_max=0.8__seed=0" / "dump" / "timelyfreeze" / "trace"
    shutil.rmtree(trace)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "planner",
            "simulate",
            "--schedule",
            "1F1B",
            "--pp",
            "2",
            "--microbatches",
            "4",
            "--out",
            str(trace),
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    rows = Planner().sweep(trace, [0.0, 0.5, 1.0])
    assert [r["r_max"] for r in rows] == [0.0, 0.5, 1.0] and rows[0]["speedup"] == pytest.approx(1.0)
    assert rows[2]["speedup"] > rows[1]["speedup"] > 1.0
    with pytest.raises(PlannerError, match="does not exist"):
        Planner().sweep(fabricated / "no_trace", [0.5])
    rep = build_report(fabricated, planner=Planner(), print_fn=lambda s: None)
    with open(fabricated / "report" / "planner_sweep.csv") as f:
        table = list(csv.DictReader(f))
    mine = [t for t in table if t["job_id"] == "1F1B__timelyfreeze__r_max=0.8__seed=0"]
    assert len(mine) == 11 and mine[0]["seed"] == "0" and float(mine[0]["speedup"]) == pytest.approx(1.0)
    assert {"batch_ms", "mean_ratio", "no_freeze_ms"} <= set(table[0])
    assert not any("0.8__seed=0: planner sweep failed" in w for w in rep["warnings"])
    _nontrivial_png(fabricated / "report" / "throughput_vs_rmax.png")


# -------------------------------------------------------------------- statistics and extension
def test_mean_ci_hand_checked_and_verdicts():
    from timelyfreeze.experiments.stats import NO_DIFFERENCE, fmt_ci, mean_ci, verdict

    # 1, 2, 3: mean 2, sd 1, t(0.975, 2) = 4.302653 -> half width 4.302653 / sqrt(3) = 2.484138
    m, lo, hi, n = mean_ci([1.0, 2.0, None, 3.0])
    assert (
        (m, n) == (2.0, 3)
        and lo == pytest.approx(2 - 2.484138, abs=1e-6)
        and hi == pytest.approx(2 + 2.484138, abs=1e-6)
    )
    assert mean_ci([1.5]) == (1.5, None, None, 1) and mean_ci([]) == (None, None, None, 0)
    assert verdict(1.01, 1.2, 1.0, "faster", "slower") == "faster"
    assert verdict(0.8, 0.99, 1.0, "faster", "slower") == "slower"
    assert verdict(0.9, 1.1, 1.0, "faster", "slower") == NO_DIFFERENCE
    assert verdict(None, None, 1.0, "faster", "slower") is None
    assert fmt_ci(1.0, 0.9, 1.1) == "1.000 [0.900, 1.100]" and fmt_ci(1.0, None, None) == "1.000"


def test_cell_stats_over_three_seeds():
    from timelyfreeze.experiments.stats import cell_stats

    paired = [
        {
            "schedule": "1F1B",
            "method": "timelyfreeze",
            "knob_name": "r_max",
            "knob_value": 0.8,
            "kappa": k,
            "speedup_in_run": 1.2,
            "dval": d,
            "steps_ratio": s,
            "tta_ratio": s and s / k,
            "steps_method": s,
        }
        for k, d, s in ((1.2, 0.01, 1.0), (1.3, 0.02, 1.1), (1.25, 0.015, None))
    ]
    (c,) = cell_stats(paired)
    assert c["seeds"] == 3 and c["reached"] == 2 and c["kappa_mean"] == pytest.approx(1.25)
    assert c["throughput"] == "faster" and c["accuracy"] == "worse"
    assert c["speedup_in_run_lo"] == c["speedup_in_run_hi"] == pytest.approx(1.2)  # no spread: a zero-width interval
    assert c["tta_ratio_mean"] == pytest.approx((1.0 / 1.2 + 1.1 / 1.3) / 2)


def test_extend_to_target_grid_and_overrides(base_toml, tmp_path):
    from timelyfreeze.experiments.sweep.extend import extension_overrides

    grid = {
        "config": str(base_toml),
        "schedules": ["1F1B"],
        "seeds": [0],
        "extend_to_target": 2,
        "methods": {"timelyfreeze": [0.8], "none": True},
    }
    jobs = expand_grid(grid)
    assert [j.method for j in jobs] == ["none", "timelyfreeze"]  # the target's run first
    assert jobs[0].extend is None and jobs[1].extend == 2.0 and jobs[1].spec()["extend_to_target"] == 2.0
    assert "extend_to_target" not in expand_grid({**grid, "extend_to_target": None})[1].spec()
    for bad in (0.5, True, "2"):
        with pytest.raises(GridError, match="extend_to_target"):
            expand_grid({**grid, "extend_to_target": bad})
    with pytest.raises(GridError, match="needs the 'none' method"):
        expand_grid({**grid, "methods": {"timelyfreeze": [0.8]}})
    jobs_dir = tmp_path / "jobs"
    extra, note = extension_overrides(jobs[1], jobs_dir, base_toml)
    assert extra == () and "1F1B__none__seed=0 is missing" in note
    write_job(tmp_path, "1F1B__none__seed=0", {"val_loss": 4.6571340560913086})
    extra, note = extension_overrides(jobs[1], jobs_dir, base_toml)
    ext = dict(extra)
    assert note is None and ext["training.steps"] == 40 and ext["lr_scheduler.total_steps"] == 20
    cmd = build_command(jobs[1].__class__(**{**jobs[1].__dict__, "overrides": extra}), base_toml, "py")
    assert float(cmd[cmd.index("--experiment.stop_at_val_loss") + 1]) == 4.6571340560913086  # the float, not rounded
    assert extension_overrides(jobs[0], jobs_dir, base_toml) == ((), None)


def test_sweep_extends_freezing_jobs_from_the_no_freezing_result(base_toml, tmp_path):
    out = tmp_path / "sweep"
    rc = main(
        [
            "run",
            "--config",
            str(base_toml),
            "--out",
            str(out),
            "--schedule",
            "1F1B",
            "--method",
            "none",
            "--method",
            "timelyfreeze=0.8",
            "--launcher",
            FAKE,
            "--extend-to-target",
            "1.5",
            "--no-report",
        ]
    )
    assert rc == 0
    rec = json.loads((out / "jobs" / "1F1B__timelyfreeze__r_max=0.8__seed=0" / "job.json").read_text())
    nf = json.loads((out / "jobs" / "1F1B__none__seed=0" / "dump" / "timelyfreeze" / "summary.json").read_text())
    cmd = rec["command"]
    assert cmd[cmd.index("--training.steps") + 1] == "30" and cmd[cmd.index("--lr_scheduler.total_steps") + 1] == "20"
    assert float(cmd[cmd.index("--experiment.stop_at_val_loss") + 1]) == nf["val_loss"]
    assert rec["spec"]["extend_to_target"] == 1.5


def test_knob_trend_slope_and_interval():
    from timelyfreeze.experiments.stats import knob_trends

    # dval = 0.01 * r_max exactly, plus a seed offset of +-0.001: slope 0.01; speed-up flat
    paired = [
        {
            "schedule": "1F1B",
            "method": "timelyfreeze",
            "knob_value": r,
            "dval": 0.01 * r + e,
            "speedup_in_run": 1.1,
            "kappa": None,
        }
        for r in (0.0, 0.5, 1.0)
        for e in (-0.001, 0.001)
    ]
    (d, s) = knob_trends(paired)
    assert d["quantity"] == "dval" and d["runs"] == 6 and d["slope"] == pytest.approx(0.01)
    assert d["slope_lo"] < 0.01 < d["slope_hi"] and d["verdict"] == "rises"
    assert s["quantity"] == "speedup_in_run" and s["slope"] == pytest.approx(0.0, abs=1e-12)
    assert knob_trends(paired[:2]) == []  # one knob value: no slope


def test_jobs_from_another_pretrained_checkpoint_are_stale_unpaired_and_give_no_target(base_toml, tmp_path):
    """The pre-trained checkpoint is built on each machine and differs between machines: a finished job that
    started from another one reruns, gives no time-to-accuracy target, and pairs with no no-freezing run."""
    from timelyfreeze.experiments.sweep.extend import target_loss
    from timelyfreeze.experiments.sweep.results import load_rows
    from timelyfreeze.experiments.sweep.runner import job_spec, resume_state

    grid = {
        "config": str(base_toml),
        "schedules": ["1F1B"],
        "seeds": [0],
        "extend_to_target": 2,
        "methods": {"timelyfreeze": [0.8], "none": True},
    }
    none_job, tf_job = expand_grid(grid)
    d = write_job(
        tmp_path,
        none_job.job_id,
        {"val_loss": 4.5, "val_curve": [[20, 4.5]], "tokens_per_s": {"all": 100.0, "stable": 100.0}},
    )
    rec = {"job_id": none_job.job_id, "status": "ok", "spec": job_spec(none_job, "abc", "old-start")}
    (d / "job.json").write_text(json.dumps(rec))
    assert resume_state(d, job_spec(none_job, "abc", "old-start")) == (True, "done")
    assert resume_state(d, job_spec(none_job, "abc", "new-start")) == (
        False,
        "stale (started from another pre-trained checkpoint)",
    )
    assert resume_state(d, job_spec(none_job, "other-config", "new-start"))[1] == "stale (spec or base config changed)"
    assert job_spec(none_job, "abc") == {**none_job.spec(), "base_config_sha256": "abc"}  # no fine-tuning: as before

    loss, why = target_loss(tmp_path / "jobs", tf_job, "new-start")
    assert loss is None and "started from another pre-trained checkpoint" in why
    assert target_loss(tmp_path / "jobs", tf_job, "old-start") == (4.5, None)

    t = write_job(
        tmp_path,
        tf_job.job_id,
        {"val_loss": 4.6, "val_curve": [[20, 4.6]], "tokens_per_s": {"all": 110.0, "stable": 110.0}},
    )
    (t / "job.json").write_text(
        json.dumps({"job_id": tf_job.job_id, "status": "ok", "spec": job_spec(tf_job, "abc", "new-start")})
    )
    (paired,) = [r for r in tta_rows(load_rows(tmp_path)) if r["method"] == "timelyfreeze"]
    assert paired["kappa"] is None and "same pre-trained checkpoint" in paired["note"]
    (t / "job.json").write_text(
        json.dumps({"job_id": tf_job.job_id, "status": "ok", "spec": job_spec(tf_job, "abc", "old-start")})
    )
    (paired,) = [r for r in tta_rows(load_rows(tmp_path)) if r["method"] == "timelyfreeze"]
    assert paired["kappa"] == pytest.approx(1.1) and paired["dval"] == pytest.approx(0.1)


def test_a_whole_seed_from_another_checkpoint_is_kept_a_partial_one_reruns(base_toml, tmp_path):
    """Seed 0 finished every job from checkpoint "old": it is complete in itself (each freezing run pairs with
    the no-freezing run of its seed and checkpoint) and is kept. Seed 1 finished only some: it runs again whole,
    its finished job from "old" included, so that no seed mixes checkpoints."""
    from timelyfreeze.experiments.sweep.runner import job_spec, run_sweep, whole_seeds_from_other_checkpoints

    grid = {
        "config": str(base_toml),
        "schedules": ["1F1B"],
        "seeds": [0, 1],
        "methods": {"timelyfreeze": [0.8], "none": True},
    }
    jobs = expand_grid(grid)
    done = [j for j in jobs if j.seed == 0] + [j for j in jobs if j.seed == 1 and j.method == "none"]
    for job in done:
        d = write_job(tmp_path, job.job_id, {"val_loss": 4.5})
        (d / "job.json").write_text(
            json.dumps({"job_id": job.job_id, "status": "ok", "spec": job_spec(job, "abc", "old")})
        )
    kept = whole_seeds_from_other_checkpoints(jobs, tmp_path / "jobs", "abc", "new")
    assert kept == {j.job_id: "old" for j in jobs if j.seed == 0}
    assert whole_seeds_from_other_checkpoints(jobs, tmp_path / "jobs", "other-config", "new") == {}
    assert whole_seeds_from_other_checkpoints(jobs, tmp_path / "jobs", "abc", "old") == {}  # current: resume as usual

    lines = []
    res = run_sweep(
        jobs,
        tmp_path,
        lambda j, d: build_command(j, base_toml, launcher=FAKE, dump_folder=d),
        base_config_sha="abc",
        print_fn=lines.append,
        start_sha="new",
    )
    assert sorted(res.skipped) == sorted(j.job_id for j in jobs if j.seed == 0)
    assert sorted(res.ok) == sorted(j.job_id for j in jobs if j.seed == 1)
    assert any("started from another pre-trained checkpoint" in line for line in lines)
    assert any("all its 1F1B jobs started from checkpoint old" in line for line in lines)


def _tta_row(job_id, method, curve, step_ms, seed=0, knob=None):
    return {
        "job_id": job_id,
        "schedule": "1F1B",
        "method": method,
        "knob_name": None if knob is None else "r_max",
        "knob_value": knob,
        "seed": seed,
        "steps": int(curve[-1][0]),
        "status": "ok",
        "_val_curve": curve,
        "_step_ms": step_ms,
    }


def test_tta_a_censored_run_at_its_bound_and_a_target_the_reference_does_not_keep():
    """A freezing run that never reaches the target gets ``tta_ratio_bound`` (its wall-clock to its last step
    over the no-freezing run's, a lower bound) and no ``tta_ratio``; a no-freezing curve that rose after the
    target step does not keep that target: a note, not a crash."""
    nf = _tta_row("nf", "none", [[1, 6.0], [10, 5.0], [20, 5.2]], {s: 100.0 for s in range(1, 21)})
    slow = _tta_row("tf", "timelyfreeze", [[1, 6.0], [10, 5.5], [30, 5.3]], {s: 80.0 for s in range(1, 31)}, knob=0.6)
    rows = {t["job_id"]: t for t in tta_rows([nf, slow])}
    t = rows["tf"]
    assert t["tta_ratio"] is None and t["note"] == "not reached within 30 steps"
    # the target, nf's final 5.2, is held from step 1 + 0.8 / 1.0 * 9 = 8.2: 30 steps of 80 ms over 8.2 of 100 ms
    assert t["steps_nf"] == pytest.approx(8.2) and t["tta_ratio_bound"] == pytest.approx(30 * 0.08 / 0.82)
    assert rows["nf"]["tta_ratio"] == rows["nf"]["tta_ratio_bound"] == 1.0
    fast = _tta_row("tf2", "timelyfreeze", [[1, 6.0], [10, 5.1], [20, 5.1]], {s: 50.0 for s in range(1, 21)}, knob=0.6)
    t = {t["job_id"]: t for t in tta_rows([nf, fast])}["tf2"]  # at or below 5.2 from 1 + 0.8 / 0.9 * 9 = 9 on
    assert t["tta_ratio"] == pytest.approx(0.45 / 0.82) and t["wall_s_diff"] == pytest.approx(0.45 - 0.82)
    notarget = {t["job_id"]: t for t in tta_rows([nf, slow], tta_step=10)}  # nf's loss at 10 is 5.0; it ends at 5.2
    t = notarget["tf"]
    assert t["steps_nf"] is None and t["tta_ratio"] is None and t["tta_ratio_bound"] is None
    assert t["note"].startswith("the no-freezing run does not keep its own loss at step 10 (5.0000)")
    from timelyfreeze.experiments.stats import cell_stats

    cells = {c["method"]: c for c in cell_stats(list(rows.values()) + [notarget["tf"] | {"seed": 1}])}
    c = cells["timelyfreeze"]  # one censored seed, one without a target: nothing measured there
    assert (c["seeds"], c["targets"], c["reached"]) == (2, 1, 0)
    assert c["tta_ratio_bound_mean"] == pytest.approx(30 * 0.08 / 0.82) and c["tta_ratio_mean"] is None


def test_flattening_of_the_no_freezing_curve():
    from timelyfreeze.experiments.sweep.tta import flattening

    flat = _tta_row("nf", "none", [[1, 6.0], [20, 5.2], [30, 5.02], [40, 5.0]], {})
    steep = _tta_row("nf", "none", [[1, 6.0], [20, 5.5], [40, 5.0]], {}) | {"schedule": "ZBV"}
    tf = _tta_row("tf", "timelyfreeze", [[1, 6.0], [40, 6.0]], {}, knob=0.6)
    a, b = flattening([flat, steep, tf])
    assert (a["schedule"], a["first_step"], a["quarter_step"], a["last_step"]) == ("1F1B", 1, 30.0, 40)
    assert a["fall_total"] == pytest.approx(1.0) and a["fall_last_quarter"] == pytest.approx(0.02)
    assert a["share"] == pytest.approx(0.02) and a["flattened"] is True
    assert b["fall_last_quarter"] == pytest.approx(0.25) and b["flattened"] is False  # 5.25 at step 30


def test_tta_curves_average_seeds_on_a_common_time_grid_without_extrapolating(tmp_path):
    from timelyfreeze.experiments.sweep.plots import plot_tta_curves, tta_curve_bands
    from timelyfreeze.experiments.sweep.tta import tta_targets

    ms = {s: 1000.0 for s in range(1, 32)}  # one second a step: a validation at step s is at s seconds
    rows = [
        _tta_row("nf0", "none", [[1, 6.0], [11, 5.0], [21, 4.0]], ms, seed=0),
        _tta_row("nf1", "none", [[1, 6.0], [11, 5.0], [21, 4.0]], ms, seed=1),
        _tta_row("tf0", "timelyfreeze", [[1, 6.0], [11, 5.6], [21, 5.2]], ms, seed=0, knob=0.6),
        _tta_row("tf1", "timelyfreeze", [[1, 6.2], [11, 5.8], [21, 5.4], [31, 5.0]], ms, seed=1, knob=0.6),
    ]
    bands = tta_curve_bands(rows, grid_s=5.0)
    assert list(bands["1F1B"]) == ["none", "timelyfreeze r_max=0.6"]  # the reference first
    nf, tf = bands["1F1B"]["none"], bands["1F1B"]["timelyfreeze r_max=0.6"]
    assert nf["t"] == [0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0]  # up to the schedule's longest run
    assert nf["n"] == [0, 2, 2, 2, 2, 0, 0] and nf["mean"][0] is None  # before the first point: no value
    assert nf["mean"][1] == pytest.approx(5.6) and nf["lo"][1] == nf["hi"][1] == pytest.approx(5.6)
    assert tf["mean"][3] == pytest.approx((5.44 + 5.64) / 2)  # t = 15: 0.4 of the way from 11 s to 21 s
    assert tf["lo"][3] < tf["mean"][3] < tf["hi"][3]
    assert tf["n"][5:] == [1, 1] and tf["lo"][5] is None  # past seed 0's end: seed 1 alone, no band
    assert tf["seeds"] == nf["seeds"] == 2
    assert tf["mean"][6] == pytest.approx(5.04)  # seed 1: 0.9 of the way from 5.4 (21 s) to 5.0 (31 s)
    targets = tta_targets(rows, tta_step=11)
    assert targets == {"1F1B": [("no freezing, final (step 21)", 4.0), ("no freezing, step 11", 5.0)]}
    assert plot_tta_curves(bands, targets, tmp_path / "curves.png")
    _nontrivial_png(tmp_path / "curves.png")
    assert not plot_tta_curves({}, {}, tmp_path / "none.png")
