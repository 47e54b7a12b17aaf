"""Clocks across hosts, for real: two torchrun agents on this machine as two nodes (c10d rendezvous), one
pipeline rank each (PP=2, 1F1B), each writing to its own node-local dump folder, the second one's clock
shifted by +250 ms and its boot id faked (``TIMELYFREEZE_CLOCK_OFFSET_MS``, ``TIMELYFREEZE_BOOT_ID``), so it
counts as another host with another clock.

Checked (each guaranteed by construction, no timing threshold): the offset measured at every sample is 250 ms
within the sample's stated bound; rank 0 ends the run with its summary and its spans though it never reads
rank 1's file (the records travel through a collective); the spans of the run equal, within the largest
bound, the spans of the same run with the offset taken out exactly; and the runtime's plan is the plan the
offline planner makes from the aligned trace (it planned on aligned start times).
"""

from __future__ import annotations

import json
import shutil

import pytest

from planner.plan import load_plan
from planner.timing.spans import step_spans
from planner.trace.load import load_trace
from tests.test_parallel_torchrun import SMALL, _free_port
from tests.torchrun_util import ENV, Run, check_plan_from_trace, command, short_cycle, two_agents

pytestmark = pytest.mark.torchrun

OFFSET_MS = 250.0
CYCLE = (1, 2, 1, 2)  # warm-up, each monitoring window, ramp, stable: 8 steps


def _two_agents(tmp_path) -> tuple[list[int], str]:
    cmds, envs = [], []
    for node in range(2):
        cmds.append(
            command("llama3_debug_1f1b_cpu.toml", tmp_path / f"node{node}", *short_cycle(*CYCLE), *SMALL, nproc=1)
        )
        env = dict(ENV, TORCHELASTIC_ERROR_FILE=str(tmp_path / f"err{node}.json"))
        if node == 1:
            env.update(TIMELYFREEZE_CLOCK_OFFSET_MS=str(OFFSET_MS), TIMELYFREEZE_BOOT_ID="other-host")
        envs.append(env)
    rcs, logs = two_agents(cmds, envs, _free_port(), "tf-clock")
    return rcs, "\n=====\n".join(logs)


def test_offset_recovered_and_spans_aligned_across_two_hosts(tmp_path):
    rcs, log = _two_agents(tmp_path)
    run = Run(max(rcs, key=abs), log, tmp_path / "node0")
    assert rcs == [0, 0], run.tail()
    node0, node1 = tmp_path / "node0" / "timelyfreeze", tmp_path / "node1" / "timelyfreeze"
    # node-local folders: rank 1's records only on node 1, yet node 0 ends with the summary and its spans
    assert not (node0 / "trace" / "actions_rank1.jsonl").exists() and (node1 / "trace" / "actions_rank1.jsonl").exists()
    summary = run.summary()
    assert not summary["failures"] and summary["span_ms"] and summary["step_span_ms"]

    meta = json.loads((node0 / "trace" / "meta.json").read_text())
    assert meta["hosts"][1] == "other-host" and meta["hosts"][0] != "other-host"
    samples = meta["clock_sync"]["samples"]
    assert len(samples) >= 3  # both ends of the monitoring windows, and the end of the run
    for s in samples:
        assert s["offset_ms"][0] == 0.0 and s["error_ms"][0] == 0.0
        assert abs(s["offset_ms"][1] - OFFSET_MS) <= s["error_ms"][1]
    bound = max(s["error_ms"][1] for s in samples)

    # the whole trace in one folder (a copy, as a user would make for offline re-planning)
    whole = tmp_path / "whole"
    shutil.copytree(node0 / "trace", whole)
    shutil.copy(node1 / "trace" / "actions_rank1.jsonl", whole)
    aligned = load_trace(whole)
    spans = step_spans(aligned)
    assert {k: round(v, 3) for k, v in spans.items()} == {k: v for k, v in summary["step_span_ms"]}
    # the same run without the offset: rank 1's clock put back exactly
    exact = dict(meta, clock_sync={"key": "boot_id", "samples": [
        {"step": s["step"], "offset_ms": [0.0, OFFSET_MS], "error_ms": [0.0, 0.0]} for s in samples
    ]})  # fmt: skip
    (whole / "meta.json").write_text(json.dumps(exact))
    truth = step_spans(load_trace(whole))
    assert spans.keys() == truth.keys()
    assert all(abs(spans[k] - truth[k]) <= bound + 1e-6 for k in spans)

    # the runtime planned on aligned start times: the offline planner makes the same plan from the aligned trace
    check_plan_from_trace(load_plan(node0 / "plan.json"), aligned)
