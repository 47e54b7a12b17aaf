"""The one way this repository starts training processes: ``torchrun`` command lines and a runner for them.

``torchrun_command`` builds ``python -m torch.distributed.run --nproc_per_node=N ... -m timelyfreeze.train
--job.config_file X ...`` (``python -m``, so the venv's torch is the one that runs); ``run`` runs any command
with its output in a log file, an optional per-line and per-metrics-row callback, and a timeout. Every
launcher calls these: ``make run`` (``scripts/run_default.py``), the pre-training (``experiments.pretrain``),
the sweep (``experiments.sweep.command``, ``experiments.sweep.runner``), the benchmarks
(``experiments.runtime.bench``, ``experiments.studies.compile_bench``) and the torchrun tests
(``tests/torchrun_util.py``).

It lives beside the runtime rather than in ``timelyfreeze.experiments``: ``make run`` and the tests launch
training without being experiments, and the experiments depend on it, never the reverse. Nothing in the
runtime imports it (it starts the runtime; it is not part of it).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path
from typing import Any, Callable, Sequence

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The repository: every launched job runs here (relative paths in configs and grids are the repository's)."""
CONFIGS = REPO_ROOT / "torchtitan_configs"
TRAIN = ("-m", "timelyfreeze.train")
"""The default entry point of ``torchrun_command``: TimelyFreeze's trainer."""
POLL_S = 0.5
"""How often ``run`` looks for new metrics rows (it sees the job's end at once)."""


def torchrun_prefix(nproc: int = 2, python: str = sys.executable) -> list[str]:
    """``torchrun`` on ``nproc`` local processes, as ``python -m torch.distributed.run`` with a c10d
    rendezvous on a free local port; the entry point and its arguments follow."""
    return [
        python,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=localhost:0",
    ]


def torchrun_command(
    config: str | Path,
    *args: str,
    nproc: int = 2,
    dump_folder: str | Path | None = None,
    target: Sequence[str] = TRAIN,
    python: str = sys.executable,
) -> list[str]:
    """``torchrun_prefix`` running ``target`` with ``--job.config_file config`` (and ``--job.dump_folder``),
    then ``args``."""
    dump = ["--job.dump_folder", str(dump_folder)] if dump_folder is not None else []
    return [*torchrun_prefix(nproc, python), *target, "--job.config_file", str(config), *dump, *args]


def _flag_value(extra: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(extra):
        if a == flag:
            return extra[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _config_table(config: str | Path) -> dict[str, Any]:
    """The config TOML as tables: the one reader of a config's settings before TorchTitan parses it."""
    return tomllib.loads(Path(config).read_text())


def dump_folder_of(config: str | Path, extra: Sequence[str]) -> str:
    """The dump folder of a run: ``--job.dump_folder`` among ``extra``, else the config's, else ./outputs."""
    value = _flag_value(extra, "--job.dump_folder")
    if value is not None:
        return value
    return str(_config_table(config).get("job", {}).get("dump_folder", "./outputs"))


DEGREES = (
    "pipeline_parallel_degree",
    "data_parallel_replicate_degree",
    "data_parallel_shard_degree",
    "context_parallel_degree",
    "tensor_parallel_degree",
)
"""The ``[parallelism]`` degrees whose product is TorchTitan's world size (``ParallelDims._validate``); the
expert-parallel degree is carved out of these, never multiplies them."""


def world_size(degree_of: Callable[[str], Any]) -> int:
    """The processes a run needs: the product of every degree in ``DEGREES``, ``degree_of(name)`` giving each
    (None where unset: TorchTitan's default, 1). A data-parallel shard degree of -1 ("the ranks left over")
    counts as 1: nothing is left over when the launcher sizes the world from the other degrees."""
    n = 1
    for name in DEGREES:
        value = degree_of(name)
        n *= max(int(value), 1) if value is not None else 1
    return n


def nproc_of(config: str | Path, extra: Sequence[str]) -> int:
    """``world_size`` of a run: each ``[parallelism]`` degree from ``--parallelism.<degree>`` among ``extra``,
    else the config."""
    table = _config_table(config).get("parallelism", {})

    def degree_of(name: str) -> Any:
        value = _flag_value(extra, f"--parallelism.{name}")
        return value if value is not None else table.get(name)

    return world_size(degree_of)


def kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the job's process group (torchrun forwards it to its workers), then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


class _RowReader:
    """New complete lines of a growing ``metrics.jsonl``, parsed (a half-written last line waits)."""

    def __init__(self, path: Path, on_row: Callable[[dict], None]):
        self.path, self.on_row, self.seen = path, on_row, 0

    def poll(self) -> None:
        if not self.path.exists():
            return
        for line in self.path.read_text().splitlines()[self.seen :]:
            try:
                row = json.loads(line)
            except ValueError:
                break
            self.on_row(row)
            self.seen += 1


def _copy_lines(stream, log, on_line: Callable[[str], None]) -> None:
    for line in stream:
        log.write(line)
        log.flush()
        on_line(line)


def run(
    command: Sequence[str],
    log_path: str | Path,
    *,
    cwd: str | Path = REPO_ROOT,
    env: dict | None = None,
    timeout: float | None = None,
    header: str | None = None,
    on_line: Callable[[str], None] | None = None,
    metrics: str | Path | None = None,
    on_row: Callable[[dict], None] | None = None,
) -> int:
    """Run ``command`` in ``cwd`` to its end and return its exit code; stdout and stderr go to ``log_path``
    (after ``header``, when given). The job runs in a session of its own with ``PYTHONUNBUFFERED=1`` and
    ``env`` added to this process's environment.

    ``on_line(line)``: every output line as it comes. ``on_row(row)``: every new row of ``metrics`` (a
    ``metrics.jsonl``; one left by an earlier run is deleted first), polled every ``POLL_S`` seconds.
    ``timeout`` (s): the job's process group is stopped and ``subprocess.TimeoutExpired`` raised; so is it on
    ``KeyboardInterrupt``, which is re-raised."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    rows = _RowReader(Path(metrics), on_row) if on_row is not None and metrics is not None else None
    if rows is not None and rows.path.exists():
        rows.path.unlink()
    deadline = None if timeout is None else time.monotonic() + timeout
    with open(log_path, "w", errors="replace") as log:
        if header is not None:
            log.write(header.rstrip("\n") + "\n")
            log.flush()
        proc = subprocess.Popen(
            list(command),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            stdout=subprocess.PIPE if on_line is not None else log,
            text=True,
            errors="replace",
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        reader = None
        if on_line is not None:
            reader = threading.Thread(target=_copy_lines, args=(proc.stdout, log, on_line), daemon=True)
            reader.start()
        try:
            while proc.poll() is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    kill_group(proc)
                    raise subprocess.TimeoutExpired(shlex.join(command), timeout)
                try:
                    proc.wait(timeout=POLL_S if left is None else min(POLL_S, left))
                except subprocess.TimeoutExpired:
                    if rows is not None:
                        rows.poll()
        except KeyboardInterrupt:
            kill_group(proc)
            raise
        finally:
            if reader is not None:
                reader.join(timeout=10)
    return proc.returncode
