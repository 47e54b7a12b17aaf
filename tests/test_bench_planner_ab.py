"""``scripts/bench_planner_ab.py`` refuses bad input with one ``error:`` line naming the flag, exit code 2, before
it makes a trace or runs a plan."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--before", "/nonexistent-tree"], "--before"),
        (["--after", "/nonexistent-tree"], "--after"),
        (["--runs", "0"], "--runs"),
        (["--r-max", "1.5"], "--r-max"),
    ],
)
def test_bad_input_is_one_error_line_with_exit_code_2(tmp_path, args, flag):
    base = {"--before": str(ROOT), "--after": str(ROOT), "--runs": "1", "--r-max": "0.5"}
    base.update(dict(zip(args[::2], args[1::2])))
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_planner_ab.py"), "--out", str(tmp_path / "o.jsonl")]
    done = subprocess.run(cmd + [x for kv in base.items() for x in kv], capture_output=True, text=True)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {flag}:"), done.stderr
    assert not (tmp_path / "o.jsonl").exists()
