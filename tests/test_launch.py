"""The one launcher (``timelyfreeze.titan.launch``): command lines, and ``run`` with small Python jobs (no torch)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from timelyfreeze.titan import launch


def test_torchrun_command_puts_the_config_and_dump_before_the_arguments():
    cmd = launch.torchrun_command("c.toml", "--training.steps", "3", nproc=4, dump_folder="d", python="py")
    assert cmd == [
        "py",
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=4",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=localhost:0",
        "-m",
        "timelyfreeze.train",
        "--job.config_file",
        "c.toml",
        "--job.dump_folder",
        "d",
        "--training.steps",
        "3",
    ]
    other = launch.torchrun_command("c.toml", target=("x.py",), python="py")
    assert other[6:] == ["x.py", "--job.config_file", "c.toml"]


def test_dump_folder_and_processes_come_from_the_flags_else_the_config(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('[job]\ndump_folder = "./out/x"\n[parallelism]\npipeline_parallel_degree = 4\n')
    assert launch.dump_folder_of(toml, []) == "./out/x" and launch.nproc_of(toml, []) == 4
    assert launch.dump_folder_of(toml, ["--job.dump_folder", "y"]) == "y"
    assert launch.nproc_of(toml, ["--parallelism.pipeline_parallel_degree=2"]) == 2


def test_run_logs_the_output_and_reports_lines_and_metrics_rows(tmp_path):
    metrics, seen = tmp_path / "metrics.jsonl", tmp_path / "seen"
    metrics.write_text('{"step": 0}\n')  # left by an earlier run: not reported
    # the job writes a row and waits (up to 60 s) until the launcher has reported it
    job = (
        "import json, os, sys, time\n"
        "print('hello'); print('to stderr', file=sys.stderr)\n"
        f"open({str(metrics)!r}, 'a').write(json.dumps({{'step': 1}}) + '\\n')\n"
        f"t = time.time()\nwhile not os.path.exists({str(seen)!r}) and time.time() < t + 60:\n"
        "    time.sleep(0.05)\n"
        "sys.exit(int(os.environ['CODE']))\n"
    )
    lines, rows = [], []

    def on_row(row):
        rows.append(row)
        seen.touch()

    rc = launch.run(
        [sys.executable, "-c", job],
        tmp_path / "log" / "job.log",
        env={"CODE": "3"},
        header="# hi",
        on_line=lines.append,
        metrics=metrics,
        on_row=on_row,
    )
    log = (tmp_path / "log" / "job.log").read_text()
    assert rc == 3 and log.splitlines()[0] == "# hi" and "hello" in log and "to stderr" in log
    assert "hello\n" in lines and rows == [{"step": 1}]


def test_run_stops_a_job_at_its_timeout(tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        launch.run([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "job.log", timeout=0.5)
