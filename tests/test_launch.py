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


def test_processes_are_the_product_of_every_parallel_degree(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text(
        "[parallelism]\npipeline_parallel_degree = 4\ndata_parallel_shard_degree = 2\n"
        "tensor_parallel_degree = 2\ncontext_parallel_degree = 1\nexpert_parallel_degree = 8\n"
    )
    assert launch.nproc_of(toml, []) == 16
    assert launch.nproc_of(toml, ["--parallelism.data_parallel_replicate_degree", "2"]) == 32
    assert launch.nproc_of(toml, ["--parallelism.data_parallel_shard_degree=-1"]) == 8  # -1: none left over
    assert launch.nproc_of(launch.CONFIGS / "llama3_8b_gpu.toml", []) == 8  # PP 4 x FSDP 2
    (tmp_path / "d.toml").write_text("[job]\n")
    assert launch.nproc_of(tmp_path / "d.toml", []) == 1  # TorchTitan's defaults: one process


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


def _launch_lines(text: str) -> list[str]:
    """``torchrun --nproc_per_node=N ...`` lines of a page or a TOML's comments, with ``\\`` continuations joined."""
    lines = [line.lstrip("#").strip() for line in text.splitlines()]
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        while line.endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line[:-1].rstrip() + " " + lines[i]
        if line.startswith("torchrun ") and "--nproc_per_node=" in line:
            out.append(line.split("   #")[0])
        i += 1
    return out


def test_every_documented_launch_line_starts_the_processes_its_config_needs():
    pages = [launch.REPO_ROOT / "README.md", *sorted((launch.REPO_ROOT / "docs").glob("*.md"))]
    pages += sorted(launch.CONFIGS.glob("*.toml"))
    checked = 0
    for page in pages:
        for line in _launch_lines(page.read_text()):
            words = line.split()
            config = launch.REPO_ROOT / words[words.index("--job.config_file") + 1]
            if not config.is_file():
                continue  # a placeholder such as your.toml
            nproc = int(next(w for w in words if w.startswith("--nproc_per_node=")).split("=")[1])
            extra = words[words.index("--job.config_file") + 2 :]
            assert nproc == launch.nproc_of(config, extra), f"{page.name}: {line}"
            checked += 1
    assert checked >= 10  # the README's 8B line, docs/runtime.md's layouts, every shipped config's own line
