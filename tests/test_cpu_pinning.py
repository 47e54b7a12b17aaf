"""``cpu_shims.pin_cpu_cores``: each local rank gets its own equal share of the allowed cores (run in
subprocesses: pinning the test process itself would slow the rest of the suite)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE = """
import json, os, threading
from timelyfreeze.titan import cpu_shims
cpu_shims.apply_if_needed()
t = threading.Thread(target=lambda: None)  # a thread started after pinning inherits it
mine = cpu_shims.pin_cpu_cores()
print(json.dumps({"mine": mine, "now": sorted(os.sched_getaffinity(0))}))
"""


def pinned(local_rank: int, local_world: int) -> dict:
    env = dict(os.environ, LOCAL_RANK=str(local_rank), LOCAL_WORLD_SIZE=str(local_world))
    out = subprocess.run([sys.executable, "-c", CODE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity API")
def test_local_ranks_get_disjoint_equal_shares():
    allowed = sorted(os.sched_getaffinity(0))
    n = 2
    if len(allowed) < n:
        assert pinned(0, n)["mine"] is None
        return
    shares = [pinned(i, n) for i in range(n)]
    for s in shares:
        assert s["mine"] == s["now"] and len(s["mine"]) == len(allowed) // n
    assert not set(shares[0]["mine"]) & set(shares[1]["mine"])
    assert set(shares[0]["mine"]) | set(shares[1]["mine"]) <= set(allowed)


def test_one_local_rank_or_too_few_cores_changes_nothing():
    assert pinned(0, 1)["mine"] is None
    assert pinned(0, 10_000)["mine"] is None


def test_overlap_callback_is_turned_off_for_dualpipev_on_cpu_only(monkeypatch):
    """On a CPU host the trainer turns off TorchTitan's setting that registers the (accelerator-only) overlap
    callback for DualPipeV, before the schedule is built; other schedules and CUDA hosts keep their setting."""
    from types import SimpleNamespace

    from timelyfreeze.titan import cpu_shims

    def par(name):
        return SimpleNamespace(pipeline_parallel_schedule=name, pipeline_parallel_expert_parallel_overlap=True)

    monkeypatch.setattr(cpu_shims, "_APPLIED", True)
    p = par("DualPipeV")
    assert cpu_shims.no_overlap_callback(p) and p.pipeline_parallel_expert_parallel_overlap is False
    assert not cpu_shims.no_overlap_callback(p)  # already off
    p = par("1F1B")
    assert not cpu_shims.no_overlap_callback(p) and p.pipeline_parallel_expert_parallel_overlap is True
    monkeypatch.setattr(cpu_shims, "_APPLIED", False)
    p = par("DualPipeV")
    assert not cpu_shims.no_overlap_callback(p) and p.pipeline_parallel_expert_parallel_overlap is True
