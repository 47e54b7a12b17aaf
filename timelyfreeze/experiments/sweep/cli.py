"""Command lines of the sweep (its one door is ``scripts/sweep.py``; ``scripts/sweep_report.py`` is its report
alone):

    python scripts/sweep.py run  --config base.toml --grid grid.toml --out sweeps/s1
    python scripts/sweep.py run  --config base.toml --out sweeps/s1 --schedule 1F1B \\
        --method none --method timelyfreeze=0.4,0.8 --method apf=0.05 --seed 0 --set training.steps=40
    python scripts/sweep.py run  ... --extend-to-target 2   # freezing runs go on to the no-freezing loss
    python scripts/sweep.py run  ... --dry-run          # print the expanded grid and the commands
    python scripts/sweep.py report sweeps/s1 [--tta-step N] [--throughput stable|all] [--no-planner]

``run`` runs the grid (``grid`` explains the grid file, ``runner`` the job folders and resume) and then
writes the report (``report``), unless ``--no-report``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

from timelyfreeze.data import corpus
from timelyfreeze.data.corpus import PRETRAINED_MARKER
from timelyfreeze.experiments.pretrain import ensure_pretrained
from timelyfreeze.experiments.sweep.command import build_command
from timelyfreeze.experiments.sweep.extend import extension_overrides
from timelyfreeze.experiments.sweep.grid import (
    KNOBS,
    GridError,
    Job,
    expand_grid,
    load_grid_file,
    parse_method_flag,
    parse_set_flag,
)
from timelyfreeze.experiments.sweep.predictions import Planner
from timelyfreeze.experiments.sweep.report import build_report
from timelyfreeze.experiments.sweep.runner import file_sha256, resume_plan, run_sweep, write_json
from timelyfreeze.titan.launch import REPO_ROOT

RUN_DESCRIPTION = "Run a grid of TimelyFreeze / baseline training jobs from one base TOML, one ``torchrun`` at a time."


def grid_from_args(args: argparse.Namespace) -> dict[str, Any]:
    grid = load_grid_file(args.grid) if args.grid else {}
    if args.method:
        grid["methods"] = dict(parse_method_flag(m) for m in args.method)
        for name, values in list(grid["methods"].items()):
            grid["methods"][name] = True if KNOBS.get(name, ()) is None and values is None else values
    if args.schedule:
        grid["schedules"] = args.schedule
    if args.seed:
        grid["seeds"] = args.seed
    if args.set:
        grid["overrides"] = {**dict(grid.get("overrides", {})), **dict(parse_set_flag(s) for s in args.set)}
    if args.config:
        grid["config"] = str(Path(args.config).resolve())
    if args.extend_to_target is not None:
        grid["extend_to_target"] = args.extend_to_target
    return grid


def grid_record(path: Path, grid: dict, jobs: list[Job]) -> dict:
    """What ``grid.json`` keeps: the grid as run, with the base config relative to the repository where it is
    inside it, and its schedules and job ids merged with those of earlier runs into the same folder (a run
    with ``--schedule`` or ``--method`` adds to the record instead of replacing it)."""
    rec = {**grid, "jobs": [j.job_id for j in jobs]}
    base = Path(grid["config"]).resolve()
    if base.is_relative_to(REPO_ROOT):
        rec["config"] = base.relative_to(REPO_ROOT).as_posix()
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return rec
    for key in ("schedules", "jobs"):
        if isinstance(old.get(key), list) and isinstance(rec.get(key), list):
            rec[key] = list(dict.fromkeys(old[key] + rec[key]))
    return rec


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
    finetunes = PRETRAINED_MARKER in base.read_text()
    start = corpus.start_fingerprint() if finetunes and args.launcher is None else None

    def command_fn(job: Job, dump: Path) -> list[str]:
        extra, note = extension_overrides(job, out / "jobs", base, start)
        if note and not args.dry_run:
            print(f"sweep: {job.job_id}: {note}; it trains its plain length")
        job = dataclasses.replace(job, overrides=job.overrides + extra)
        return build_command(job, base, args.python, dump, args.launcher, args.nproc_per_node)

    if args.dry_run:
        for k, (job, _, skip, why) in enumerate(resume_plan(jobs, out, file_sha256(base), start), 1):
            print(f"[{k}/{len(jobs)}] {job.job_id}  ({'skip: ' if skip else ''}{why})")
            print("    " + shlex.join(command_fn(job, out / "jobs" / job.job_id / "dump")))
        print(f"{len(jobs)} jobs")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "grid.json", grid_record(out / "grid.json", grid, jobs))
    if args.launcher is None and finetunes:
        # the fine-tuning setting starts every job from the cached pre-trained checkpoint: build it once, and
        # let every job's spec name it (a job that started from another machine's checkpoint runs again)
        ensure_pretrained()
        start = corpus.start_fingerprint()
        print(f"sweep: every job starts from the pre-trained checkpoint {start}")
    try:
        res = run_sweep(jobs, out, command_fn, file_sha256(base), args.retry_failed, args.timeout, start_sha=start)
    except KeyboardInterrupt:  # between jobs: nothing is running, nothing to mark
        print("sweep: interrupted", file=sys.stderr)
        return 130
    if args.report and not res.interrupted:
        try:
            report_main([str(out)])
        except Exception as e:  # a broken report must not hide the sweep's own result
            print(f"sweep: report failed: {e!r}", file=sys.stderr)
    return res.exit_code


def main(argv: Iterable[str] | None = None) -> int:
    """``sweep.py [run] ...`` or ``sweep.py report ...``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "report":
        return report_main(argv[1:])
    if argv and argv[0] == "run":
        argv = argv[1:]
    p = argparse.ArgumentParser(
        prog="sweep.py", description=RUN_DESCRIPTION, epilog="`sweep.py report <out> --help` for the report's options"
    )
    p.add_argument("--config", help="base TorchTitan TOML (overrides the grid file's `config`)")
    p.add_argument("--grid", help="grid file (.toml or .json); the flags below override its keys")
    p.add_argument("--out", required=True, help="sweep folder (jobs/, report/)")
    p.add_argument(
        "--method",
        action="append",
        metavar="NAME[=V1,V2]",
        help="method and its knob values, repeatable (e.g. timelyfreeze=0.4,0.8, none)",
    )
    p.add_argument("--schedule", action="append", help="pipeline schedule, repeatable")
    p.add_argument("--seed", action="append", type=int, help="seed, repeatable (default 0)")
    p.add_argument(
        "--set",
        action="append",
        metavar="SECTION.FIELD=VALUE",
        help="override for every job, repeatable (e.g. training.steps=40)",
    )
    p.add_argument(
        "--extend-to-target",
        type=float,
        default=None,
        metavar="F",
        help="time to accuracy: freezing jobs train on, up to F times the no-freezing job's steps, "
        "until they reach its final validation loss (the grid key extend_to_target)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the expanded grid and commands, run nothing")
    p.add_argument(
        "--retry-failed",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="re-run jobs that failed or timed out before (default on)",
    )
    p.add_argument("--timeout", type=float, default=None, help="per-job timeout in seconds")
    p.add_argument(
        "--launcher", help="replace torchrun: a command given the training arguments (e.g. 'python tests/fake_job.py')"
    )
    p.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        help="torchrun processes (default: parallelism.pipeline_parallel_degree)",
    )
    p.add_argument("--python", default=sys.executable, help="python that runs torchrun")
    p.add_argument(
        "--report", action=argparse.BooleanOptionalAction, default=True, help="write the report at the end (default on)"
    )
    return cmd_run(p.parse_args(argv))


def report_main(argv: Sequence[str] | None = None) -> int:
    """``sweep.py report <out> ...`` (= ``sweep_report.py <out> ...``)."""
    p = argparse.ArgumentParser(prog="sweep.py report", description="Tables and plots of a sweep folder.")
    p.add_argument("out", help="the sweep folder (with jobs/)")
    p.add_argument(
        "--tta-step",
        type=float,
        default=None,
        help="no-freezing validation step whose loss is the TTA target (default: its last)",
    )
    p.add_argument(
        "--throughput",
        choices=("stable", "all"),
        default="stable",
        help="throughput of the Pareto plot and configs table (default: stable phase)",
    )
    p.add_argument("--no-planner", action="store_true", help="no planner predictions (r_max curves, planned timelines)")
    p.add_argument(
        "--python", default=None, help="ignored: the planner runs in this process (kept so older command lines work)"
    )
    args = p.parse_args(argv)
    if not (Path(args.out) / "jobs").is_dir():
        print(f"report: {args.out} has no jobs/ folder", file=sys.stderr)
        return 2
    build_report(args.out, args.tta_step, args.throughput, None if args.no_planner else Planner())
    return 0
