"""Launch real ``torchrun`` training jobs from tests (CPU, gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "torchtitan_configs"


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
        return [json.loads(l) for l in (self.out / "metrics.jsonl").read_text().splitlines() if l.strip()]

    def tail(self) -> str:
        """The failing rank's traceback (lines from ``[rankN]:``) and the end of the log."""
        lines = [l for l in self.log.splitlines() if "lspci" not in l]
        errors = [l for l in lines if l.startswith("[rank") or "Error" in l][:80]
        return "\n".join(errors)[-8000:] + "\n...\n" + "\n".join(lines)[-3000:]


TRAIN = ("-m", "timelyfreeze.train")


def command(config: str, dump: Path, *args: str, nproc: int = 2, tensorboard: bool = False,
            target: tuple[str, ...] = TRAIN) -> list[str]:
    """The ``torchrun ... -m timelyfreeze.train`` command line of a test run (``target``: another entry
    point, e.g. a test job script). The model's initial weights are seeded (``--debug.seed 0``), so
    everything before the plan is the same in every run."""
    return [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
        "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0",
        *target,
        "--job.config_file", str(CONFIGS / config),
        "--job.dump_folder", str(dump),
        "--metrics.enable-tensorboard" if tensorboard else "--metrics.no-enable-tensorboard",
        "--debug.seed", "0",
        "--comm.init_timeout_seconds", "120",
        "--comm.train_timeout_seconds", "120",
        *args,
    ]


ENV = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")


def torchrun(config: str, dump: Path, *args: str, nproc: int = 2, timeout: int = 420,
             tensorboard: bool = False, target: tuple[str, ...] = TRAIN, env: dict | None = None) -> Run:
    """Run ``timelyfreeze.train`` (or ``target``) on ``nproc`` CPU processes; returns exit code, log and
    dump folder. ``env``: variables added to the job's environment."""
    cmd = command(config, dump, *args, nproc=nproc, tensorboard=tensorboard, target=target)
    p = subprocess.run(cmd, cwd=ROOT, env={**ENV, **(env or {})}, capture_output=True, text=True, timeout=timeout)
    log = p.stdout + p.stderr
    Path(dump).mkdir(parents=True, exist_ok=True)
    (Path(dump) / "torchrun.log").write_text(log)  # the whole log, for a failure's post-mortem
    return Run(p.returncode, log, Path(dump))


def short_cycle(warmup: int = 2, monitor: int = 3, ramp: int = 3, stable: int = 3) -> list[str]:
    """CLI overrides for a compact full TimelyFreeze cycle."""
    steps = warmup + 2 * monitor + ramp + stable
    return [
        "--training.steps", str(steps),
        "--freeze.warmup_steps", str(warmup),
        "--freeze.monitor_steps", str(monitor),
        "--freeze.ramp_steps", str(ramp),
        "--validation.freq", str(steps),
        "--validation.steps", "2",
    ]
