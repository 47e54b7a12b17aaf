"""One job -> its command: ``torchrun -m timelyfreeze.train`` (``timelyfreeze.titan.launch``) with the job's training
arguments, or a launcher (e.g. ``python tests/fake_job.py``) given the same arguments."""

from __future__ import annotations

import shlex
import sys
import tomllib
from pathlib import Path
from typing import Any

from timelyfreeze.experiments.sweep.grid import KNOBS, MATCHABLE, Job, fmt_value
from timelyfreeze.titan.launch import torchrun_command, world_size


def override_args(key: str, value: Any) -> list[str]:
    """TorchTitan (tyro) CLI form of one override: bools as ``--a.b`` / ``--a.no-b``, lists of str
    comma-joined (TorchTitan's rule), other lists as several values."""
    flag = "--" + key.lstrip("-")
    if isinstance(value, bool):
        if value:
            return [flag]
        section, _, field = flag.rpartition(".")
        return [f"{section}.no-{field}" if section else f"--no-{field.lstrip('-')}"]
    if isinstance(value, list):
        if all(isinstance(v, str) for v in value):
            return [flag, ",".join(value)]
        return [flag, *(fmt_value(v) for v in value)]
    return [flag, fmt_value(value)]


def _lookup(toml: dict[str, Any], dotted: str) -> Any:
    node: Any = toml
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def job_setting(job: Job, base_toml: str | Path, key: str) -> Any:
    """A dotted setting of the job: its last override, else the base TOML's value, else None."""
    with open(base_toml, "rb") as f:
        return _setting(job, tomllib.load(f), key)


def _setting(job: Job, base: dict[str, Any], key: str) -> Any:
    for k, value in reversed(job.overrides):
        if k.replace("-", "_") == key:
            return value
    return _lookup(base, key)


def nproc_of_job(job: Job, base_toml: str | Path) -> int:
    """The processes of the job: ``launch.world_size`` of its ``[parallelism]`` degrees (its overrides, else the
    base TOML, read once)."""
    with open(base_toml, "rb") as f:
        base = tomllib.load(f)
    return world_size(lambda name: _setting(job, base, f"parallelism.{name}"))


def matched_dump(job: Job, dump_folder: str | Path) -> Path:
    """The dump folder of the job that ``job`` is matched to: a sibling of ``job``'s own under ``<out>/jobs/``."""
    return Path(dump_folder).resolve().parent.parent / str(job.matched_to) / "dump"


def job_args(job: Job, dump_folder: str | Path | None = None) -> list[str]:
    """The job's own ``timelyfreeze.train`` arguments: method, seed, schedule, knob (for a matched job, the
    matched job's dump folder, a sibling of ``dump_folder``) and overrides."""
    args = [
        "--freeze.method",
        job.method,
        "--freeze.seed",
        str(job.seed),
        "--parallelism.pipeline_parallel_schedule",
        job.schedule,
    ]
    knob = KNOBS[job.method]
    if job.matched_to is not None:
        if dump_folder is None:
            raise ValueError(f"{job.job_id}: a matched job's arguments need its dump folder")
        args += [f"--{MATCHABLE[job.method]}", str(matched_dump(job, dump_folder))]
    elif knob is not None:
        args += [knob[1], fmt_value(job.knob_value)]
    for key, value in job.overrides:
        args += override_args(key, value)
    return args


def train_args(job: Job, base_toml: str | Path, dump_folder: str | Path) -> list[str]:
    """The ``timelyfreeze.train`` arguments of a job (what a fake launcher receives too)."""
    return ["--job.config_file", str(base_toml), "--job.dump_folder", str(dump_folder), *job_args(job, dump_folder)]


def build_command(
    job: Job,
    base_toml: str | Path,
    python_exe: str = sys.executable,
    dump_folder: str | Path | None = None,
    launcher: str | None = None,
    nproc_per_node: int | None = None,
) -> list[str]:
    """The command of one job: ``launch.torchrun_command`` of ``timelyfreeze.train``, or ``launcher`` (a
    shell-style command such as ``"python tests/fake_job.py"``) followed by the same training arguments."""
    dump_folder = dump_folder if dump_folder is not None else Path("jobs") / job.job_id / "dump"
    if launcher:
        return shlex.split(launcher) + train_args(job, base_toml, dump_folder)
    nproc = nproc_per_node or nproc_of_job(job, base_toml)
    return torchrun_command(
        base_toml, *job_args(job, dump_folder), nproc=nproc, dump_folder=dump_folder, python=python_exe
    )
