"""Run a grid of TimelyFreeze / baseline training jobs from one base TOML, one ``torchrun`` at a time.

    python scripts/sweep.py run  --config base.toml --grid grid.toml --out sweeps/s1
    python scripts/sweep.py run  --config base.toml --out sweeps/s1 --schedule 1F1B \\
        --method none --method timelyfreeze=0.4,0.8 --method apf=0.05 --seed 0 --set training.steps=40
    python scripts/sweep.py run  ... --dry-run          # print the expanded grid and the commands
    python scripts/sweep.py report sweeps/s1            # CSV/Markdown/plots (also run after ``run``)

Every job runs in ``<out>/jobs/<job_id>/`` (``log.txt``, ``dump/`` = its ``--job.dump_folder``,
``job.json``). Re-running the same sweep skips jobs whose ``job.json`` says ``ok`` for the same spec
and whose ``summary.json`` exists; everything else runs (again). See ``scripts/sweep_report.py`` for
what the report reads and writes.

Grid file (TOML or JSON)::

    config = "torchtitan_configs/debug.toml"    # base TOML (relative to the grid file; --config wins)
    schedules = ["1F1B", "GPipe"]
    seeds = [0, 1]
    [overrides]                                 # --section.field overrides for every job
    "training.steps" = 40
    [methods]
    none = true                                 # no knob: one job per (schedule, seed)
    timelyfreeze = [0.4, 0.8]                   # the knob values (here r_max)
    timelyfreeze_apf = {values = [0.8], overrides = {"freeze.apf.threshold" = 0.05}}
    apf = [0.05]
    [schedule_overrides.Interleaved1F1B]        # extra overrides for jobs of one schedule
    "parallelism.pipeline_parallel_layers_per_stage" = 1
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any, Callable, Iterable

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from timelyfreeze.config import METHOD_KNOBS, METHODS  # noqa: E402  (one table of knobs for runtime and sweep)
from timelyfreeze.corpus import PRETRAINED_MARKER  # noqa: E402

# method -> (knob name as summary.json spells it, CLI flag); ``none`` has no knob.
KNOBS: dict[str, tuple[str, str] | None] = {
    m: (METHOD_KNOBS[m].split(".")[-1], f"--freeze.{METHOD_KNOBS[m]}") if m in METHOD_KNOBS else None
    for m in METHODS
}
STATUSES = ("ok", "failed", "timeout", "interrupted", "running")
LOG_TAIL_LINES = 40


class GridError(ValueError):
    """A grid file or grid flag that cannot be expanded; the message says what is wrong."""


@dataclasses.dataclass(frozen=True)
class Job:
    schedule: str
    method: str
    knob_value: float | None
    seed: int
    overrides: tuple[tuple[str, Any], ...] = ()
    """``--section.field`` overrides in order (grid, then schedule, then method ones)."""

    @property
    def knob_name(self) -> str | None:
        knob = KNOBS[self.method]
        return knob[0] if knob else None

    @property
    def job_id(self) -> str:
        parts = [self.schedule, self.method]
        if self.knob_name is not None:
            parts.append(f"{self.knob_name}={fmt_value(self.knob_value)}")
        parts.append(f"seed={self.seed}")
        return "__".join(parts)

    def spec(self) -> dict[str, Any]:
        """What identifies the job's result: a finished job with another spec is stale."""
        return {
            "schedule": self.schedule,
            "method": self.method,
            "knob": None if self.knob_name is None else {"name": self.knob_name, "value": self.knob_value},
            "seed": self.seed,
            "overrides": [[k, v] for k, v in self.overrides],
        }


def fmt_value(v: Any) -> str:
    """Short, file-name-safe text of a knob value: 0.8 -> '0.8', 1e-05 -> '1e-05', 90.0 -> '90'."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (int, float)):
        return format(v, "g")
    return str(v)


# ----------------------------------------------------------------------------------------- grid
def load_grid_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_bytes()
        grid = json.loads(text) if path.suffix == ".json" else tomllib.loads(text.decode())
    except (OSError, ValueError) as e:  # tomllib.TOMLDecodeError and JSONDecodeError are ValueErrors
        raise GridError(f"{path}: {e}") from e
    if not isinstance(grid, dict):
        raise GridError(f"{path}: the grid must be a table/object")
    if "config" in grid and not Path(grid["config"]).is_absolute():
        grid["config"] = str((path.parent / grid["config"]).resolve())
    return grid


def parse_method_flag(text: str) -> tuple[str, list[float] | None]:
    """``timelyfreeze=0.4,0.8`` -> ("timelyfreeze", [0.4, 0.8]); ``none`` -> ("none", None)."""
    name, _, values = text.partition("=")
    name = name.strip()
    if not values.strip():
        return name, None
    try:
        return name, [float(v) for v in values.split(",") if v.strip()]
    except ValueError as e:
        raise GridError(f"--method {text!r}: knob values must be numbers ({e})") from e


def parse_set_flag(text: str) -> tuple[str, Any]:
    """``training.steps=40`` -> ("training.steps", 40); values are read as TOML when they parse."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise GridError(f"--set {text!r}: expected section.field=value")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip().lstrip("-"), value


def _method_entries(methods: Any) -> list[tuple[str, list[Any] | None, dict[str, Any]]]:
    if not isinstance(methods, dict) or not methods:
        raise GridError("the grid names no methods (a [methods] table or --method flags)")
    out = []
    for name, spec in methods.items():
        if name not in KNOBS:
            raise GridError(f"unknown method {name!r}; known: {', '.join(KNOBS)}")
        overrides: dict[str, Any] = {}
        if isinstance(spec, dict):
            unknown = set(spec) - {"values", "overrides"}
            if unknown:
                raise GridError(f"method {name!r}: unknown keys {sorted(unknown)} (values, overrides)")
            overrides = dict(spec.get("overrides", {}))
            spec = spec.get("values")
        if name == "none":
            if spec not in (None, True, [], False):
                raise GridError("method 'none' has no knob: write none = true")
            if spec is False:
                continue
            out.append((name, None, overrides))
            continue
        if isinstance(spec, (int, float)) and not isinstance(spec, bool):
            spec = [spec]
        if not isinstance(spec, list) or not spec:
            knob = KNOBS[name][0]
            raise GridError(f"method {name!r} needs a list of {knob} values, got {spec!r}")
        for v in spec:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise GridError(f"method {name!r}: knob value {v!r} is not a number")
        out.append((name, list(spec), overrides))
    return out


def _as_list(x: Any, what: str) -> list[Any]:
    if x is None:
        raise GridError(f"the grid names no {what}")
    lst = x if isinstance(x, list) else [x]
    if not lst:
        raise GridError(f"the grid names no {what}")
    return lst


def expand_grid(grid: dict[str, Any]) -> list[Job]:
    """One job per (schedule, method, knob value, seed), in that nesting order; ``none`` has no knob."""
    schedules = [str(s) for s in _as_list(grid.get("schedules"), "schedules")]
    seeds = _as_list(grid.get("seeds", [0]), "seeds")
    if any(isinstance(s, bool) or not isinstance(s, int) for s in seeds):
        raise GridError(f"seeds must be integers, got {seeds!r}")
    base_over = list(dict(grid.get("overrides", {})).items())
    sched_over = grid.get("schedule_overrides", {})
    unknown = set(grid) - {"config", "schedules", "seeds", "overrides", "methods", "schedule_overrides"}
    if unknown:
        raise GridError(f"unknown grid keys {sorted(unknown)}")
    jobs: list[Job] = []
    for schedule in schedules:
        s_over = list(dict(sched_over.get(schedule, {})).items())
        for method, values, m_over in _method_entries(grid.get("methods")):
            overrides = tuple(base_over + s_over + list(m_over.items()))
            for value in values if values is not None else [None]:
                for seed in seeds:
                    jobs.append(Job(schedule, method, value, seed, overrides))
    ids = [j.job_id for j in jobs]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise GridError(f"the grid repeats jobs: {', '.join(dup)}")
    return jobs


# -------------------------------------------------------------------------------------- command
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


def pp_degree(job: Job, base_toml: str | Path) -> int:
    """``parallelism.pipeline_parallel_degree`` of the job: its overrides, else the base TOML, else 1."""
    for key, value in reversed(job.overrides):
        if key.replace("-", "_") == "parallelism.pipeline_parallel_degree":
            return int(value)
    with open(base_toml, "rb") as f:
        value = _lookup(tomllib.load(f), "parallelism.pipeline_parallel_degree")
    return int(value) if value is not None else 1


def train_args(job: Job, base_toml: str | Path, dump_folder: str | Path) -> list[str]:
    """The ``timelyfreeze.train`` arguments of a job (what a fake launcher receives too)."""
    args = [
        "--job.config_file", str(base_toml),
        "--job.dump_folder", str(dump_folder),
        "--freeze.method", job.method,
        "--freeze.seed", str(job.seed),
        "--parallelism.pipeline_parallel_schedule", job.schedule,
    ]
    knob = KNOBS[job.method]
    if knob is not None:
        args += [knob[1], fmt_value(job.knob_value)]
    for key, value in job.overrides:
        args += override_args(key, value)
    return args


def build_command(
    job: Job,
    base_toml: str | Path,
    python_exe: str = sys.executable,
    dump_folder: str | Path | None = None,
    launcher: str | None = None,
    nproc_per_node: int | None = None,
) -> list[str]:
    """The command of one job: ``torchrun`` (as ``python -m torch.distributed.run``, so the venv's
    torch is used) with ``-m timelyfreeze.train``, or ``launcher`` (a shell-style command such as
    ``"python tests/fake_job.py"``) followed by the same training arguments."""
    dump_folder = dump_folder if dump_folder is not None else Path("jobs") / job.job_id / "dump"
    args = train_args(job, base_toml, dump_folder)
    if launcher:
        return shlex.split(launcher) + args
    nproc = nproc_per_node or pp_degree(job, base_toml)
    return [
        python_exe, "-m", "torch.distributed.run",
        f"--nproc_per_node={nproc}", "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0",
        "-m", "timelyfreeze.train", *args,
    ]


# --------------------------------------------------------------------------------------- runner
def _now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def _write_json(path: Path, obj: Any) -> None:
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


def resume_state(job_dir: Path, spec: dict[str, Any]) -> tuple[bool, str]:
    """(skip?, why): a job is done when its job.json says ok for the same spec and summary.json exists."""
    rec = read_job_json(job_dir)
    if rec is None:
        return False, "new" if not job_dir.exists() else "incomplete (no job.json)"
    if rec.get("spec") != spec:
        return False, "stale (spec or base config changed)"
    if rec.get("status") != "ok":
        return False, f"previous run {rec.get('status', '?')}"
    if not summary_path(job_dir).is_file():
        return False, "previous run ok but summary.json missing"
    return True, "done"


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
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


def run_one(job: Job, job_dir: Path, command: list[str], spec: dict[str, Any],
            timeout_s: float | None, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one job to completion; returns its job.json record (written too). KeyboardInterrupt
    stops the job, records it as ``interrupted`` and is re-raised."""
    job_dir.mkdir(parents=True, exist_ok=True)
    log = job_dir / "log.txt"
    summary = summary_path(job_dir)
    if summary.exists():
        summary.unlink()  # a summary left by an earlier run must not pass for this one's
    rec: dict[str, Any] = {
        "job_id": job.job_id, "spec": spec, "command": command, "command_str": shlex.join(command),
        "cwd": str(REPO_ROOT), "log": str(log), "dump_folder": str(job_dir / "dump"),
        "start_time": _now(), "end_time": None, "duration_s": None, "exit_code": None,
        "status": "running",
    }
    _write_json(job_dir / "job.json", rec)
    t0 = time.monotonic()
    interrupted = False
    with open(log, "wb") as logf:
        logf.write(f"# {rec['start_time']} {rec['command_str']}\n".encode())
        logf.flush()
        proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, **(env or {})})
        try:
            proc.wait(timeout=timeout_s)
            status = "ok" if proc.returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            status = "timeout"
        except KeyboardInterrupt:
            _kill_group(proc)
            status, interrupted = "interrupted", True
    rec.update(end_time=_now(), duration_s=round(time.monotonic() - t0, 3), exit_code=proc.returncode,
               status=status)
    if status == "ok" and not summary.is_file():
        rec.update(status="failed", reason="exit 0 but no timelyfreeze/summary.json in the dump folder")
    elif status == "ok" and (failures := _summary_failures(summary)):
        rec.update(status="failed", reason="the run reported: " + "; ".join(failures))
    elif status == "timeout":
        rec["reason"] = f"timed out after {timeout_s:g} s"
    if rec["status"] != "ok":
        rec["log_tail"] = log_tail(log)
    _write_json(job_dir / "job.json", rec)
    if interrupted:
        raise KeyboardInterrupt
    return rec


def run_sweep(
    jobs: list[Job],
    out: str | Path,
    command_fn: CommandFn,
    base_config_sha: str | None = None,
    retry_failed: bool = True,
    timeout_s: float | None = None,
    print_fn: Callable[[str], None] = print,
    env: dict[str, str] | None = None,
) -> SweepResult:
    """Run the jobs one at a time under ``<out>/jobs/``; never raises for a failed job."""
    out = Path(out).resolve()
    res = SweepResult()
    plan: list[tuple[Job, dict[str, Any], bool, str]] = []
    for job in jobs:
        spec = {**job.spec(), "base_config_sha256": base_config_sha}
        job_dir = out / "jobs" / job.job_id
        skip, why = resume_state(job_dir, spec)
        if not skip and not retry_failed:
            rec = read_job_json(job_dir)
            if rec and rec.get("spec") == spec and rec.get("status") in ("failed", "timeout"):
                skip, why = True, f"previous run {rec['status']} (--no-retry-failed)"
        plan.append((job, spec, skip, why))
    n = len(plan)
    to_run = sum(1 for p in plan if not p[2])
    durations: list[float] = []
    for k, (job, spec, skip, why) in enumerate(plan, 1):
        tag = f"[{k}/{n}] {job.job_id}"
        if skip:
            print_fn(f"{tag} ... skipped ({why})")
            (res.skipped if why == "done" else res.failed).append(job.job_id)
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
        else:
            res.failed.append(job.job_id)
            what = {"failed": f"FAILED (exit {rec['exit_code']}", "timeout": "TIMEOUT ("}[rec["status"]]
            if rec["status"] == "failed" and rec["exit_code"] == 0:
                what = ("FAILED (exit 0 but no summary.json" if "no timelyfreeze/summary.json" in rec.get("reason", "")
                        else f"FAILED ({rec.get('reason', 'exit 0')}")
            sep = ", " if not what.endswith("(") else ""
            print_fn(f"{tag} ... {what}{sep}see {rec['log']}) {rec['duration_s']:.1f} s{eta}")
    print_fn(res.line())
    return res


# ------------------------------------------------------------------------------------------ CLI
def grid_from_args(args: argparse.Namespace) -> dict[str, Any]:
    grid = load_grid_file(args.grid) if args.grid else {}
    if args.method:
        grid["methods"] = dict(parse_method_flag(m) for m in args.method)
        for name, values in list(grid["methods"].items()):
            grid["methods"][name] = True if name == "none" and values is None else values
    if args.schedule:
        grid["schedules"] = args.schedule
    if args.seed:
        grid["seeds"] = args.seed
    if args.set:
        grid["overrides"] = {**dict(grid.get("overrides", {})), **dict(parse_set_flag(s) for s in args.set)}
    if args.config:
        grid["config"] = str(Path(args.config).resolve())
    return grid


def cmd_run(args: argparse.Namespace) -> int:
    try:
        grid = grid_from_args(args)
        if not grid.get("config"):
            raise GridError("no base TOML: pass --config or set config = ... in the grid file")
        base = Path(grid["config"])
        if not base.is_file():
            raise GridError(f"base config {base} does not exist")
        jobs = expand_grid(grid)
    except GridError as e:
        print(f"sweep: {e}", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()

    def command_fn(job: Job, dump: Path) -> list[str]:
        return build_command(job, base, args.python, dump, args.launcher, args.nproc_per_node)

    if args.dry_run:
        for k, job in enumerate(jobs, 1):
            skip, why = resume_state(out / "jobs" / job.job_id, {**job.spec(), "base_config_sha256": file_sha256(base)})
            print(f"[{k}/{len(jobs)}] {job.job_id}  ({'skip: ' if skip else ''}{why})")
            print("    " + shlex.join(command_fn(job, out / "jobs" / job.job_id / "dump")))
        print(f"{len(jobs)} jobs")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "grid.json", {**grid, "jobs": [j.job_id for j in jobs]})
    if args.launcher is None and PRETRAINED_MARKER in base.read_text():
        # the fine-tuning setting starts every job from the cached pre-trained checkpoint: build it once
        from pretrain import ensure_pretrained

        ensure_pretrained()
    try:
        res = run_sweep(jobs, out, command_fn, file_sha256(base), args.retry_failed, args.timeout)
    except KeyboardInterrupt:  # between jobs: nothing is running, nothing to mark
        print("sweep: interrupted", file=sys.stderr)
        return 130
    if args.report and not res.interrupted:
        import sweep_report

        try:
            sweep_report.main([str(out), "--python", args.python])
        except Exception as e:  # a broken report must not hide the sweep's own result
            print(f"sweep: report failed: {e!r}", file=sys.stderr)
    return res.exit_code


def main(argv: Iterable[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "report":
        import sweep_report

        return sweep_report.main(argv[1:])
    if argv and argv[0] == "run":
        argv = argv[1:]
    p = argparse.ArgumentParser(prog="sweep.py", description=__doc__.split("\n\n")[0],
                                epilog="`sweep.py report <out> --help` for the report's options")
    p.add_argument("--config", help="base TorchTitan TOML (overrides the grid file's `config`)")
    p.add_argument("--grid", help="grid file (.toml or .json); the flags below override its keys")
    p.add_argument("--out", required=True, help="sweep folder (jobs/, report/)")
    p.add_argument("--method", action="append", metavar="NAME[=V1,V2]",
                   help="method and its knob values, repeatable (e.g. timelyfreeze=0.4,0.8, none)")
    p.add_argument("--schedule", action="append", help="pipeline schedule, repeatable")
    p.add_argument("--seed", action="append", type=int, help="seed, repeatable (default 0)")
    p.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                   help="override for every job, repeatable (e.g. training.steps=40)")
    p.add_argument("--dry-run", action="store_true", help="print the expanded grid and commands, run nothing")
    p.add_argument("--retry-failed", action=argparse.BooleanOptionalAction, default=True,
                   help="re-run jobs that failed or timed out before (default on)")
    p.add_argument("--timeout", type=float, default=None, help="per-job timeout in seconds")
    p.add_argument("--launcher", help="replace torchrun: a command given the training arguments "
                   "(e.g. 'python tests/fake_job.py')")
    p.add_argument("--nproc-per-node", type=int, default=None,
                   help="torchrun processes (default: parallelism.pipeline_parallel_degree)")
    p.add_argument("--python", default=sys.executable, help="python that runs torchrun and the planner")
    p.add_argument("--report", action=argparse.BooleanOptionalAction, default=True,
                   help="write the report at the end (default on)")
    return cmd_run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
