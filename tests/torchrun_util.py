"""Launch real ``torchrun`` training jobs from tests (CPU, gloo), through ``timelyfreeze.titan.launch``."""

from __future__ import annotations

import json
import math
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from timelyfreeze.titan.launch import CONFIGS, TRAIN, run, torchrun_command
from timelyfreeze.titan.launch import REPO_ROOT as ROOT


@dataclass
class Run:
    rc: int
    log: str
    dump: Path

    @property
    def out(self) -> Path:
        return self.dump / "timelyfreeze"

    def summary(self) -> dict:
        return json.loads((self.out / "summary.json").read_text())

    def metrics(self) -> list[dict]:
        return [json.loads(line) for line in (self.out / "metrics.jsonl").read_text().splitlines() if line.strip()]

    def tail(self) -> str:
        """The failing rank's traceback (lines from ``[rankN]:``) and the end of the log."""
        lines = [line for line in self.log.splitlines() if "lspci" not in line]
        errors = [line for line in lines if line.startswith("[rank") or "Error" in line][:80]
        return "\n".join(errors)[-8000:] + "\n...\n" + "\n".join(lines)[-3000:]


def command(
    config: str, dump: Path, *args: str, nproc: int = 2, tensorboard: bool = False, target: tuple[str, ...] = TRAIN
) -> list[str]:
    """The ``torchrun ... -m timelyfreeze.train`` command line of a test run (``target``: another entry
    point, e.g. a test job script). The model's initial weights are seeded (``--debug.seed 0``), so
    everything before the plan is the same in every run."""
    return torchrun_command(
        CONFIGS / config,
        "--metrics.enable-tensorboard" if tensorboard else "--metrics.no-enable-tensorboard",
        "--debug.seed",
        "0",
        "--comm.init_timeout_seconds",
        "120",
        "--comm.train_timeout_seconds",
        "120",
        *args,
        nproc=nproc,
        dump_folder=dump,
        target=target,
    )


TEST_ENV = {"OMP_NUM_THREADS": "1"}
"""What every test job adds to the environment (``launch.run`` adds ``PYTHONUNBUFFERED=1`` too)."""
ENV = dict(os.environ, PYTHONUNBUFFERED="1", **TEST_ENV)
"""The whole environment, for the tests that start ``command`` with their own ``subprocess`` call."""


def torchrun(
    config: str,
    dump: Path,
    *args: str,
    nproc: int = 2,
    timeout: int = 420,
    tensorboard: bool = False,
    target: tuple[str, ...] = TRAIN,
    env: dict | None = None,
) -> Run:
    """Run ``timelyfreeze.train`` (or ``target``) on ``nproc`` CPU processes; returns exit code, log and
    dump folder (the whole log is kept in ``<dump>/torchrun.log`` for a failure's post-mortem). ``env``:
    variables added to the job's environment."""
    cmd = command(config, dump, *args, nproc=nproc, tensorboard=tensorboard, target=target)
    log = Path(dump) / "torchrun.log"
    rc = run(cmd, log, cwd=ROOT, env={**TEST_ENV, **(env or {})}, timeout=timeout)
    return Run(rc, log.read_text(errors="replace"), Path(dump))


SHORT_SEQUENCES = ["--training.seq_len", "128", "--validation.seq_len", "128"]
"""Sequences of 128 tokens instead of the configs' 256 (still 8 microbatches of one sequence): about half
of each step's compute, which is most of a short test run after start-up. Every test whose runs check
behaviour rather than a configured size uses it (through ``short_cycle`` or directly)."""


def short_cycle(warmup: int = 2, monitor: int = 3, ramp: int = 3, stable: int = 3) -> list[str]:
    """CLI overrides for a compact full TimelyFreeze cycle (``SHORT_SEQUENCES`` included)."""
    steps = warmup + 2 * monitor + ramp + stable
    return [
        *SHORT_SEQUENCES,
        "--training.steps",
        str(steps),
        "--freeze.warmup_steps",
        str(warmup),
        "--freeze.monitor_steps",
        str(monitor),
        "--freeze.ramp_steps",
        str(ramp),
        "--validation.freq",
        str(steps),
        "--validation.steps",
        "2",
    ]


def two_agents(cmds: list[list[str]], envs: list[dict], port: int, rdzv_id: str, timeout: int = 600):
    """Start one torchrun agent per command as the nodes of one job (``--nnodes``, ``--node_rank``, one c10d
    rendezvous endpoint on this host at ``port``), each with its environment; wait for all of them (a
    timed-out agent is killed). Returns their exit codes and their logs."""
    procs = []
    for node, (cmd, env) in enumerate(zip(cmds, envs)):
        i = cmd.index("--rdzv-endpoint=localhost:0")
        cmd = (
            cmd[:i]
            + [
                f"--rdzv-endpoint=localhost:{port}",
                f"--nnodes={len(cmds)}",
                f"--node_rank={node}",
                f"--rdzv-id={rdzv_id}",
            ]
            + cmd[i + 1 :]
        )
        procs.append(
            subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    logs, rcs = [], []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            logs.append(out)
            rcs.append(p.returncode)
    finally:
        for p in procs:  # a timed-out agent must not outlive the test
            if p.poll() is None:
                p.kill()
                p.wait()
    return rcs, logs


def frozen_count_fits(frozen: int, target: float) -> bool:
    """A backward action froze as many tensors as ``target`` (ratio x tensors) asks for: the selection draws
    floor or ceil of it."""
    return math.floor(target - 1e-9) <= frozen <= math.ceil(target + 1e-9)


def check_plan_from_trace(plan, trace) -> None:
    """The run's ``plan.json`` is the plan the offline planner makes from the run's trace with the options the
    plan records (its estimator, the gap model, the anchored monitoring windows): the same ratio per action
    and the same predicted batch times. Unlike ``all_frozen <= planned <= no_freeze`` (which ``load_plan``
    already enforces, and which the LP meets by construction since ``w_min`` is clamped to ``w_max``), this
    fails if the runtime planned from other measurements or other options than its trace records."""
    from planner.plan import plan_from_trace

    monitoring = plan.extra.get("monitoring")
    offline = plan_from_trace(
        trace,
        plan.r_max,
        estimator=plan.extra["estimator"],
        gaps="gaps" in plan.extra and "classes" in plan.extra["gaps"],
        anchor=None if monitoring is None else monitoring["anchored"],
        cliff="cliff" in plan.extra,
    )
    assert {a: ap.freeze_ratio for a, ap in offline.actions.items()} == pytest.approx(
        {a: ap.freeze_ratio for a, ap in plan.actions.items()}, abs=1e-9
    )
    assert offline.batch_time_ms == pytest.approx(plan.batch_time_ms)
