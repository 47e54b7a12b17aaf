"""TimelyFreeze with data and tensor parallelism, real ``torchrun`` on CPU (gloo).

- Gradients under PP x FSDP2 (1F1B with AC, ZBV), PP x TP and PP x HSDP against a single-process reference
  (``tests/parallel_exact_job.py``; exact for FSDP2 and HSDP, within a stated tolerance for TP): two launches,
  the 4-rank layouts in one, HSDP (8 ranks) in the other.
- PP=2 x FSDP 2 (4 ranks, 1F1B), PP 2 x replicate 2 x shard 2 (HSDP, 8 ranks) and TP 2 x PP 2 (4 ranks)
  through a full cycle: one plan for every pipeline, equal to what the offline planner makes from the
  multi-replica trace; every replica froze the same tensors. ``make test`` checks the FSDP2 cycle as the
  first run of the resume test below; the HSDP, ZBV-under-FSDP2 and TP cycles are marked ``slow``.
- Resume under FSDP2 (DCP sharded state) in the lower-bound phase.
- Replicate-only data parallelism with PP: refused with one line (``slow``).
- Two torchrun agents on this host as two nodes (c10d rendezvous), two pipeline ranks each: PP=4 through
  a full cycle, checked as the single-node cycles are (``check_full_cycle``).

The runs use a smaller batch than the embedded default (4 microbatches of 128 tokens): up to eight ranks
share two cores here, and ``make test`` must stay under 20 minutes.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess

import pytest

from planner.plan import load_plan
from planner.schedule.actions import parse_action
from planner.trace.load import load_trace
from tests.test_runtime_torchrun import check_full_cycle, frozen_as_planned
from tests.torchrun_util import ENV, ROOT, Run, check_plan_from_trace, command, short_cycle, torchrun, two_agents
from timelyfreeze.experiments.studies.gpu_host_view import HOST_VIEW_ENV, check_start_times, load_host_view
from timelyfreeze.titan.launch import torchrun_prefix

pytestmark = pytest.mark.torchrun

SMALL = [
    "--training.local_batch_size",
    "4",
    "--training.seq_len",
    "128",
    "--validation.local_batch_size",
    "4",
    "--validation.seq_len",
    "128",
]
WARMUP, MONITOR, RAMP, STABLE = 1, 2, 1, 2
LOWER_END = WARMUP + 2 * MONITOR
STEPS = LOWER_END + RAMP + STABLE
FSDP2 = ["--parallelism.data_parallel_shard_degree", "2"]
HOST_VIEW_WORKER = ("-m", "timelyfreeze.experiments.studies.gpu_host_view")


# one launch per world size; every case of a launch is checked on its own (see tests/parallel_exact_job.py)
EXACT_LAUNCHES = {
    "4 ranks": (4, ["fsdp:1F1B:ac", "fsdp:ZBVZeroBubble:noac", "tp:1F1B:noac"]),
    "hsdp": (8, ["hsdp:1F1B:ac"]),
}


@pytest.mark.parametrize("launch", list(EXACT_LAUNCHES))
def test_parallel_gradients_match_one_process(tmp_path, launch):
    nproc, cases = EXACT_LAUNCHES[launch]
    out = tmp_path / "result.json"
    p = subprocess.run(
        [*torchrun_prefix(nproc), str(ROOT / "tests" / "parallel_exact_job.py"), str(out), *cases],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert out.exists(), (p.stdout + p.stderr)[-6000:]
    results = json.loads(out.read_text())
    assert sorted(results) == sorted(cases)
    for case, result in results.items():
        assert result["problems"] == [], case
        assert result["frozen_everywhere"] > 0 and result["checked"] > result["frozen_everywhere"], case
        if case.startswith("tp:"):
            assert result["dtensor_params"] > 0 and result["fsdp_modules_switched_to_sum"] == 0, case
        else:
            assert result["fsdp_modules_switched_to_sum"] > 0, case  # the CPU shim ran
            assert result["max_abs_diff"] == 0.0, case
    assert p.returncode == 0


def check_replicated_cycle(run: Run, schedule: str, num_stages: int, replicas: int) -> None:
    assert run.rc == 0, run.tail()
    trace = load_trace(run.out / "trace")
    assert trace.meta.replicas == replicas and trace.meta.num_stages == num_stages
    assert {(r.replica, r.rank) for r in trace.records} == {(d, r) for d in range(replicas) for r in range(2)}
    # one plan for every pipeline, and the offline planner makes the same plan from the trace with the options
    # the plan records (its estimator, the gap model, the anchored monitoring windows)
    plan = load_plan(run.out / "plan.json")
    check_plan_from_trace(plan, trace)
    # every replica froze the same number of tensors in every backward action (the same masks): all of them in
    # the lower-bound phase, and after it the plan's ratio on the ramp (within floor/ceil). Whether the plan
    # freezes anything depends on the measured bounds, so that is not asserted.
    n_tensors = {int(s): n for s, n in trace.meta.extra["freezable_tensors"].items()}
    frozen: dict[tuple[int, str], set] = {}
    for d in range(replicas):
        for r in range(2):
            name = "actions_rank%d.jsonl" % r if d == 0 else "actions_rank%d_replica%d.jsonl" % (r, d)
            for line in (run.out / "trace" / name).read_text().splitlines():
                rec = json.loads(line)
                if "frozen_tensors" not in rec:
                    continue
                frozen.setdefault((rec["step"], rec["action"]), set()).add(rec["frozen_tensors"])
                act = parse_action(rec["action"])  # a DualPipeV pair: the stage of its backward part
                if act.kind in ("F", "I"):
                    continue
                stage = act.stage
                if rec["phase"] == "lower":
                    assert rec["frozen_tensors"] == n_tensors[stage], rec
                elif rec["step"] > LOWER_END:
                    ratio = plan.actions[rec["action"]].freeze_ratio
                    assert frozen_as_planned(
                        rec["frozen_tensors"], ratio, rec["step"], n_tensors[stage], LOWER_END, RAMP
                    ), rec
    assert frozen and all(len(v) == 1 for v in frozen.values())
    summary = run.summary()
    assert summary["replicas"] == replicas and not summary["failures"]
    assert len(summary["replica_mean_batch_ms"]["stable"]) == replicas
    assert summary["avg_freeze_ratio"] > 0
    assert all(math.isfinite(line) for _, line in summary["loss_curve"]) and len(summary["loss_curve"]) == STEPS
    rows = [m for m in run.metrics() if "phase" in m]
    assert len(rows) == STEPS and all(len(m["replica_batch_ms"]) == replicas for m in rows)


HSDP = ["--parallelism.data_parallel_replicate_degree", "2", "--parallelism.data_parallel_shard_degree", "2"]


@pytest.mark.parametrize(
    "config,schedule,num_stages,data_parallel,nproc,replicas",
    [
        # the first run of test_resume_under_fsdp2 is this cycle (with checkpoints) and is checked the same way
        pytest.param("llama3_debug_1f1b_cpu.toml", "1F1B", 2, FSDP2, 4, 2, marks=pytest.mark.slow),
        # HSDP's gradients stay in the suite (test_parallel_gradients_match_one_process, 8 ranks); its 8-rank
        # cycle (about 85 s on two cores) is left to `pytest -m slow`
        pytest.param("llama3_debug_1f1b_cpu.toml", "1F1B", 2, HSDP, 8, 4, marks=pytest.mark.slow),
        # ZBV's gradients under FSDP2 stay in the suite (test_parallel_gradients_match_one_process), and so does
        # its full cycle without data parallelism (test_runtime_torchrun); this 4-rank cycle is the one to lose
        # from `make test` for its 20-minute budget (`pytest -m slow`)
        pytest.param("llama3_debug_zbv_cpu.toml", "ZBVZeroBubble", 4, FSDP2, 4, 2, marks=pytest.mark.slow),
    ],
    ids=["fsdp2-1F1B", "hsdp-1F1B", "fsdp2-ZBV"],
)
def test_pp2_x_data_parallel_full_cycle(tmp_path, config, schedule, num_stages, data_parallel, nproc, replicas):
    run = torchrun(
        config,
        tmp_path / "run",
        *short_cycle(WARMUP, MONITOR, RAMP, STABLE),
        *SMALL,
        *data_parallel,
        nproc=nproc,
        timeout=600,
    )
    check_replicated_cycle(run, schedule, num_stages, replicas=replicas)


def test_resume_under_fsdp2(tmp_path):
    """A checkpoint taken in the lower-bound phase (DCP, sharded) resumes on every rank of both replicas:
    the upper-bound measurements of both pipelines are restored, the plan is made once, the trace is
    complete and free of duplicates for every (replica, rank)."""
    ckpt_step = WARMUP + MONITOR + 1
    args = [
        *short_cycle(WARMUP, MONITOR, RAMP, STABLE),
        *SMALL,
        *FSDP2,
        "--checkpoint.enable",
        "--checkpoint.interval",
        str(ckpt_step),
        "--checkpoint.no-last-save-model-only",
    ]
    # the first run is the GPU check's worker (the trainer with the host's view of each action's start recorded,
    # timelyfreeze.experiments.studies.gpu_host_view), so that its wrapping of the profiler runs in the suite
    views = tmp_path / "host_view"
    first = torchrun("llama3_debug_1f1b_cpu.toml", tmp_path / "run", *args, nproc=4, timeout=600,
                     target=HOST_VIEW_WORKER, env={HOST_VIEW_ENV: str(views)})  # fmt: skip
    check_replicated_cycle(first, "1F1B", 2, replicas=2)  # the PP=2 x FSDP 2 full cycle of `make test`
    rows = load_host_view(views)
    assert {r.rank for r in rows} == {0, 1, 2, 3} and max(r.step for r in rows) == STEPS
    assert check_start_times(rows).ok  # on CPU a start is the host clock at the call: inside the bounds
    ckpt = tmp_path / "run" / "checkpoint"
    for d in ckpt.iterdir():
        if d.name != f"step-{ckpt_step}":
            shutil.rmtree(d)
    (first.out / "plan.json").unlink()
    second = torchrun("llama3_debug_1f1b_cpu.toml", tmp_path / "run", *args, nproc=4, timeout=600)
    assert "restored freezing state at step %d" % ckpt_step in second.log
    check_replicated_cycle(second, "1F1B", 2, replicas=2)
    trace = load_trace(second.out / "trace")
    seen: dict[tuple, int] = {}
    for rec in trace.records:
        key = (rec.replica, rec.rank, rec.step, rec.action)
        seen[key] = seen.get(key, 0) + 1
    assert set(seen.values()) == {1}
    assert {r.step for r in trace.records if r.phase == "upper"} == set(range(WARMUP + 1, WARMUP + MONITOR + 1))
    # steps before the plan are deterministic (seeded weights, no or all tensors frozen): bit for bit
    before = dict(map(tuple, first.summary()["loss_curve"]))
    after = dict(map(tuple, second.summary()["loss_curve"]))
    assert [after[s] for s in range(1, WARMUP + 2 * MONITOR + 1)] == [
        before[s] for s in range(1, WARMUP + 2 * MONITOR + 1)
    ]


# back in `make test` (issue 48 item 6): the suite ran 13:10 on a fresh clone without it, and its 4-rank cycle
# takes about 47 s on two cores
def test_tp2_x_pp2_short_cycle(tmp_path):
    def launch(name: str):
        return torchrun(
            "llama3_debug_1f1b_cpu.toml",
            tmp_path / name,
            *short_cycle(WARMUP, MONITOR, RAMP, STABLE),
            *SMALL,
            "--parallelism.tensor_parallel_degree",
            "2",
            "--parallelism.data_parallel_shard_degree",
            "1",
            nproc=4,
            timeout=600,
        )

    run = launch("run")
    if run.rc != 0 and _gloo_collective_segfault(run.log):
        run = launch("run_again")  # once: see _gloo_collective_segfault
    check_replicated_cycle(run, "1F1B", 2, replicas=2)


def _gloo_collective_segfault(log: str) -> bool:
    """True when a rank died of a segmentation fault inside one of torch's functional collectives (TP's DTensor
    all-gather on gloo). Seen once on 2026-11-29 (rank 0, step 1, the first backward's all_gather_single; the
    same clone's run before it passed): a crash in torch's native code, not in this project's, so the launch is
    repeated once and everything is asserted on the repeated run; a second such crash fails the test."""
    return "Fatal Python error: Segmentation fault" in log and "_functional_collectives.py" in log


@pytest.mark.slow  # the rule is unit-tested (tests/test_config.py) and one error line from every rank is checked
# by test_bad_freeze_setting_fails_with_one_line; this 4-rank launch (about 24 s) is left to `pytest -m slow`
def test_replicate_only_with_pp_is_refused(tmp_path):
    run = torchrun(
        "llama3_debug_1f1b_cpu.toml",
        tmp_path / "run",
        "--parallelism.data_parallel_replicate_degree",
        "2",
        "--parallelism.data_parallel_shard_degree",
        "1",
        nproc=4,
        timeout=180,
    )
    assert run.rc != 0
    lines = [line for line in run.log.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "use HSDP" in lines[0], run.tail()
    assert not any(
        line.startswith("[rank") and "Traceback" in line for line in run.log.splitlines()
    )  # (torchrun's own is there)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_pp4_on_two_nodes_on_this_host(tmp_path):
    """Two torchrun agents (``--nnodes 2 --node_rank i``, one c10d rendezvous endpoint), two pipeline ranks
    each, PP=4 through a full cycle: the freezing runtime needs nothing across hosts beyond what TorchTitan
    does, and a 4-stage pipeline is checked as the 2-stage ones are (also ``make test``'s PP=4 run)."""
    port = _free_port()
    dump = tmp_path / "run"
    cycle = (WARMUP, MONITOR, RAMP, STABLE)
    cmd = command(
        "llama3_debug_1f1b_cpu.toml", dump, *short_cycle(*cycle), "--parallelism.pipeline_parallel_degree", "4", nproc=2
    )
    envs = [dict(ENV, TORCHELASTIC_ERROR_FILE=str(tmp_path / f"err{node}.json")) for node in range(2)]
    rcs, logs = two_agents([cmd, cmd], envs, port, "tf-two-nodes")
    dump.mkdir(parents=True, exist_ok=True)
    (dump / "torchrun.log").write_text("\n=====\n".join(logs))
    run = Run(max(rcs, key=abs), "\n".join(logs), dump)
    assert rcs == [0, 0], run.tail()
    summary = run.summary()
    assert summary["pp_degree"] == 4 and summary["steps"] == STEPS and not summary["failures"]
    assert (run.out / "plan.json").exists()
    assert all(os.path.exists(run.out / "trace" / f"actions_rank{r}.jsonl") for r in range(4))
    check_full_cycle(run, "1F1B", 4, cycle=cycle)
