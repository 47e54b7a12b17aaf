"""The GPU check without a GPU: one ``error:`` line and exit code 2, nothing written."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from timelyfreeze.titan.launch import REPO_ROOT as ROOT


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA host runs the check itself")
def test_without_cuda_one_error_line_and_exit_2():
    p = subprocess.run(
        [sys.executable, "scripts/gpu_check.py"], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("error: no CUDA device") and p.stderr.count("\n") == 1
