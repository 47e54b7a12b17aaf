"""Run jobs one at a time: each in ``<out>/jobs/<job_id>/`` (``log.txt``, ``dump/`` = its
``--job.dump_folder``, ``job.json``), with resume, per-job timeout, progress/ETA and Ctrl-C / SIGTERM handling.

Re-running the same sweep skips jobs whose ``job.json`` says ``ok`` for the same spec and whose
``summary.json`` exists; everything else runs (again). A job is ``ok`` only when it exited 0, wrote
``summary.json`` and that summary lists no ``failures`` (a run that survived e.g. a failed plan).

An ok job's trace folder is packed into ``trace.tar.gz`` beside it (``planner.trace.archive.pack_trace``) before
its ``job.json`` says ok; a packing failure leaves the folder and is recorded as ``pack_error`` (the job stays ok).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable

from planner.errors import PlannerError
from planner.trace.archive import TRACE_NAME, pack_trace
from timelyfreeze.experiments.sweep.grid import Job, back_to_back, bracket_blocks
from timelyfreeze.titan import launch
from timelyfreeze.titan.launch import REPO_ROOT

STATUSES = ("ok", "failed", "timeout", "interrupted", "running")
LOG_TAIL_LINES = 40


def _now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically (a killed sweep never leaves half a job.json)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def read_job_json(job_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((job_dir / "job.json").read_text())
    except (OSError, ValueError):
        return None


def summary_path(job_dir: Path) -> Path:
    return job_dir / "dump" / "timelyfreeze" / "summary.json"


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def job_spec(job: Job, base_config_sha: str | None, start_sha: str | None = None) -> dict[str, Any]:
    """What a finished job must match to be skipped on resume (stored in its job.json as ``spec``)."""
    spec = {**job.spec(), "base_config_sha256": base_config_sha}
    if start_sha is not None:
        spec["start_sha256"] = start_sha
    return spec


def resume_state(job_dir: Path, spec: dict[str, Any]) -> tuple[bool, str]:
    """(skip?, why): a job is done when its job.json says ok for the same spec and summary.json exists."""
    rec = read_job_json(job_dir)
    if rec is None:
        return False, "new" if not job_dir.exists() else "incomplete (no job.json)"
    if rec.get("spec") != spec:
        old = rec.get("spec") or {}
        if old.get("start_sha256") != spec.get("start_sha256") and {**old, "start_sha256": None} == {
            **spec,
            "start_sha256": None,
        }:
            return False, "stale (started from another pre-trained checkpoint)"
        return False, "stale (spec or base config changed)"
    if rec.get("status") != "ok":
        return False, f"previous run {rec.get('status', '?')}"
    if not summary_path(job_dir).is_file():
        return False, "previous run ok but summary.json missing"
    return True, "done"


def whole_seeds_from_other_checkpoints(
    jobs: list[Job], jobs_dir: Path, base_config_sha: str | None, start_sha: str
) -> dict[str, str]:
    """{job_id: start_sha256} of finished jobs that started from another pre-trained checkpoint than
    ``start_sha`` but belong to a (schedule, seed) whose every job in ``jobs`` finished ok from one and the
    same checkpoint. Such a seed is complete in itself: each freezing run is compared with the no-freezing
    run of its own seed and checkpoint (``tta.tta_rows``), so it is kept; a seed with any job missing, failed
    or from a third checkpoint runs again whole."""
    groups: dict[tuple[str, int], list[Job]] = {}
    for job in jobs:
        groups.setdefault((job.schedule, job.seed), []).append(job)
    kept: dict[str, str] = {}
    for group in groups.values():
        starts = set()
        for job in group:
            rec = read_job_json(jobs_dir / job.job_id) or {}
            start = (rec.get("spec") or {}).get("start_sha256")
            if (
                rec.get("status") != "ok"
                or start is None
                or rec.get("spec") != job_spec(job, base_config_sha, start)
                or not summary_path(jobs_dir / job.job_id).is_file()
            ):
                break
            starts.add(start)
        else:
            if len(starts) == 1 and start_sha not in starts:
                kept.update({job.job_id: next(iter(starts)) for job in group})
    return kept


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _interrupt(signum, frame):
    raise KeyboardInterrupt


class stop_signals_interrupt:
    """While a sweep runs, SIGTERM and SIGHUP (``kill``, a closed terminal, a scheduler's stop) stop it as
    Ctrl-C does: the running job's process group is stopped and the job recorded ``interrupted``. Without
    this the sweep died at once, leaving its job ``running`` and the job's own process group (a session of
    its own) training on. Signals set to be ignored (``nohup``) stay ignored; main thread only."""

    SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def __enter__(self):
        self.previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self.previous[sig] = signal.signal(sig, _interrupt)
        return self

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        return False


def fmt_duration(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclasses.dataclass
class SweepResult:
    ok: list[str] = dataclasses.field(default_factory=list)
    failed: list[str] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)
    interrupted: str | None = None

    @property
    def exit_code(self) -> int:
        return 130 if self.interrupted else (1 if self.failed else 0)

    def line(self) -> str:
        text = f"sweep: {len(self.ok)} ok, {len(self.failed)} failed, {len(self.skipped)} skipped (done before)"
        if self.failed:
            text += "; failed: " + ", ".join(self.failed)
        if self.interrupted:
            text += f"; interrupted during {self.interrupted}"
        return text


CommandFn = Callable[[Job, Path], list[str]]
"""(job, dump_folder) -> command; the injection point for tests and other launchers."""


def _summary_failures(path: Path) -> list[str]:
    """The failures a finished run survived and reported in its summary (e.g. no plan)."""
    try:
        failures = json.loads(path.read_text()).get("failures") or []
    except (OSError, ValueError, AttributeError) as e:
        return [f"unreadable summary.json: {e}"]
    return [str(f) for f in failures]


def pack_job_trace(out: Path, rec: dict[str, Any]) -> None:
    """Pack the trace folder of an ok job's output folder ``out`` (``<dump>/timelyfreeze``), if it wrote one; a
    failure is recorded in ``rec`` as ``pack_error`` and the folder stays."""
    folder = out / TRACE_NAME
    if not folder.is_dir():
        return
    try:
        pack_trace(folder)
    except (PlannerError, OSError) as e:
        rec["pack_error"] = " ".join(str(e).split())


def run_one(
    job: Job,
    job_dir: Path,
    command: list[str],
    spec: dict[str, Any],
    timeout_s: float | None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run one job to completion; returns its job.json record (written too). KeyboardInterrupt
    stops the job, records it as ``interrupted`` and is re-raised."""
    job_dir.mkdir(parents=True, exist_ok=True)
    log = job_dir / "log.txt"
    summary = summary_path(job_dir)
    # An earlier run's output must not pass for this one's: its summary, packed trace and plans would, and its
    # final checkpoint would make TorchTitan resume from it and train no step at all. The dump folder is the
    # job's own output, so it goes whole.
    shutil.rmtree(job_dir / "dump", ignore_errors=True)
    rec: dict[str, Any] = {
        "job_id": job.job_id,
        "spec": spec,
        "command": command,
        "command_str": shlex.join(command),
        "cwd": str(REPO_ROOT),
        "log": str(log),
        "dump_folder": str(job_dir / "dump"),
        "start_time": _now(),
        "end_time": None,
        "duration_s": None,
        "exit_code": None,
        "status": "running",
    }
    write_json(job_dir / "job.json", rec)
    t0 = time.monotonic()
    interrupted, exit_code = False, None  # a stopped job (timeout, Ctrl-C) has no exit code of its own
    try:
        exit_code = launch.run(
            command, log, env=env, timeout=timeout_s, header=f"# {rec['start_time']} {rec['command_str']}"
        )
        status = "ok" if exit_code == 0 else "failed"
    except subprocess.TimeoutExpired:
        status = "timeout"
    except KeyboardInterrupt:
        status, interrupted = "interrupted", True
    rec.update(end_time=_now(), duration_s=round(time.monotonic() - t0, 3), exit_code=exit_code, status=status)
    if status == "ok" and not summary.is_file():
        rec.update(status="failed", reason="exit 0 but no timelyfreeze/summary.json in the dump folder")
    elif status == "ok" and (failures := _summary_failures(summary)):
        rec.update(status="failed", reason="the run reported: " + "; ".join(failures))
    elif status == "timeout":
        rec["reason"] = f"timed out after {timeout_s:g} s"
    if rec["status"] == "ok":
        try:
            pack_job_trace(summary.parent, rec)
        except KeyboardInterrupt:  # the run is done and ok; its trace stays a folder (packing is kill-safe)
            rec["pack_error"], interrupted = "interrupted while packing", True
    if rec["status"] != "ok":
        rec["log_tail"] = log_tail(log)
    write_json(job_dir / "job.json", rec)
    if interrupted:
        raise KeyboardInterrupt
    return rec


def resume_plan(
    jobs: list[Job], out: Path, base_config_sha: str | None, start_sha: str | None, retry_failed: bool = True
) -> list[tuple[Job, dict[str, Any], bool, str]]:
    """(job, spec, skip?, why) for every job, in order: what a (re)run of the sweep under ``out`` does. A
    bracketed block (``grid.bracket_blocks``) is incomplete when any of its jobs has to run, or when all are done
    but did not run back to back (``grid.back_to_back``, from their job.json times): it runs again whole."""
    kept = (
        {}
        if start_sha is None
        else whole_seeds_from_other_checkpoints(jobs, Path(out) / "jobs", base_config_sha, start_sha)
    )
    plan: list[tuple[Job, dict[str, Any], bool, str]] = []
    for job in jobs:
        spec = job_spec(job, base_config_sha, start_sha)
        job_dir = Path(out) / "jobs" / job.job_id
        skip, why = resume_state(job_dir, spec)
        if job.job_id in kept:
            skip, why = (
                True,
                f"done (seed {job.seed}: all its {job.schedule} jobs started from checkpoint {kept[job.job_id]})",
            )
        if not skip and not retry_failed:
            rec = read_job_json(job_dir)
            if rec and rec.get("spec") == spec and rec.get("status") in ("failed", "timeout"):
                skip, why = True, f"previous run {rec['status']} (--no-retry-failed)"
        plan.append((job, spec, skip, why))
    # a bracketed block ([target, matched, target again]) runs whole or not at all: its jobs must run back to back
    state = {job.job_id: (skip, why) for job, _, skip, why in plan}
    rerun: dict[str, str] = {}
    for ids in {tuple(ids) for ids in bracket_blocks(jobs).values()}:
        if not all(state[i][0] for i in ids):
            rerun.update(dict.fromkeys(ids, "runs again with its block"))
        elif all(state[i][1].startswith("done") for i in ids):
            recs = [read_job_json(Path(out) / "jobs" / i) or {} for i in ids]
            if back_to_back([(rec.get("start_time"), rec.get("end_time")) for rec in recs])[0] is not True:
                rerun.update(dict.fromkeys(ids, "runs again with its block: its jobs did not run back to back"))
    return [
        (job, spec, False, rerun[job.job_id]) if skip and job.job_id in rerun else (job, spec, skip, why)
        for job, spec, skip, why in plan
    ]


def run_sweep(
    jobs: list[Job],
    out: str | Path,
    command_fn: CommandFn,
    base_config_sha: str | None = None,
    retry_failed: bool = True,
    timeout_s: float | None = None,
    print_fn: Callable[[str], None] = print,
    env: dict[str, str] | None = None,
    start_sha: str | None = None,
) -> SweepResult:
    """Run the jobs one at a time under ``<out>/jobs/``; never raises for a failed job. ``start_sha``
    (``corpus.start_fingerprint``, fine-tuning grids) becomes part of every job's spec: a finished job that
    started from another checkpoint is stale and runs again, unless its whole seed did
    (``whole_seeds_from_other_checkpoints``)."""
    out = Path(out).resolve()
    res = SweepResult()
    plan = resume_plan(jobs, out, base_config_sha, start_sha, retry_failed)
    n = len(plan)
    to_run = sum(1 for p in plan if not p[2])
    durations: list[float] = []
    with stop_signals_interrupt():
        for k, (job, spec, skip, why) in enumerate(plan, 1):
            tag = f"[{k}/{n}] {job.job_id}"
            if skip:
                print_fn(f"{tag} ... skipped ({why})")
                (res.skipped if why.startswith("done") else res.failed).append(job.job_id)
                continue
            job_dir = out / "jobs" / job.job_id
            command = command_fn(job, job_dir / "dump")
            note = "" if why == "new" else f" ({why})"
            print_fn(f"{tag} ... started{note}")
            try:
                rec = run_one(job, job_dir, command, spec, timeout_s, env)
            except KeyboardInterrupt:
                print_fn(f"{tag} ... interrupted (see {job_dir / 'log.txt'})")
                res.interrupted = job.job_id
                break
            durations.append(rec["duration_s"])
            left = to_run - len(durations)
            eta = f", ETA {fmt_duration(left * sum(durations) / len(durations))}" if left else ""
            if rec["status"] == "ok":
                res.ok.append(job.job_id)
                print_fn(f"{tag} ... ok {rec['duration_s']:.1f} s{eta}")
                if rec.get("pack_error"):
                    print_fn(f"{tag} ... trace left unpacked: {rec['pack_error']}")
            else:
                res.failed.append(job.job_id)
                what = {"failed": f"FAILED (exit {rec['exit_code']}", "timeout": "TIMEOUT ("}[rec["status"]]
                if rec["status"] == "failed" and rec["exit_code"] == 0:
                    what = (
                        "FAILED (exit 0 but no summary.json"
                        if "no timelyfreeze/summary.json" in rec.get("reason", "")
                        else f"FAILED ({rec.get('reason', 'exit 0')}"
                    )
                sep = ", " if not what.endswith("(") else ""
                print_fn(f"{tag} ... {what}{sep}see {rec['log']}) {rec['duration_s']:.1f} s{eta}")
    print_fn(res.line())
    return res
