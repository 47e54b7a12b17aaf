"""The runtime benchmark: does the stable phase deliver what the plan promised? Repeated torchrun jobs on the
embedded default (llama3 debug model, PP=2, CPU), job order interleaved so that slow periods of the machine
spread over every cell, one result line per job written as it finishes (a re-run skips what is done).

Job kinds, per schedule and repeat:

* ``overhead``: ``[freeze] r_max = 0`` (the plan freezes nothing); in the stable phase, steps cycle
  between hooks detached (TorchTitan's own step) and TimelyFreeze at ratio 0 with everything on, online
  re-planning included (``timelyfreeze.experiments.runtime.overhead_trainer``). Overhead = mean over attached
  steps of (its time - the mean of its detached neighbours) / median detached step; *direct* = median
  time inside the runtime's own code per attached step (the rank that spent most) / median detached step.
  ``--overhead-probe`` (kind ``overhead_probe``): steps cycle attached, detached, *probe* (the hooked stage
  class with listeners that do nothing), detached, detached; the probe's overhead is what the hook mechanism
  costs. Cycles of odd length (``analysis.CYCLES``) put every kind on odd and even steps alike.
* ``overhead_masked`` (``--overhead-masked``): the same at ``--r-max`` with the phases jobs' monitoring windows
  and ramp, so that a plan holds its ratios; the detached steps (*masked*) apply the same plan's masks through a
  minimal path, so attached against masked is the runtime's cost at the plan's ratios, not freezing's speed-up;
  the masks' own cost (draw, switches) is timed in the masked steps. ``--profile DIR``: each overhead job also
  profiles the runtime's own code in its attached steps (``<DIR>/<job>/profile_rank<r>.pstats``, cProfile): where
  the direct cost goes; a diagnostic, since the profiler's own cost enters that job's figures.
* ``phases``: a TimelyFreeze run at ``r_max``: the measured median batch time per phase next to the plan.
  *Stable error*: median over stable steps of measured / predicted batch time of the plan in force - 1.
  *Achieved share* of the predicted speed-up: ``(upper / stable - 1) / (no_freeze / planned - 1)`` with the
  medians of the upper and stable phases and the monitoring plan (``plan.json``).
* ``load`` (``--load-change``): a ``phases`` run with a CPU-bound co-tenant process started when the stable
  phase begins (the bench watches ``metrics.jsonl``) and stopped when the job ends; ``--load-core N`` pins
  it to core N (kind ``load_coreN``), so that the rank pinned there is the one slowed. Reported against the
  plan in force after the last re-plan: error over the steps after it, and the share
  ``(no_freeze' / stable' - 1) / (no_freeze' / planned' - 1)`` with that plan's own predicted no-freeze and
  planned batch times (the upper bound is not re-measured under the new load).
* ``--noise-core N`` (with ``--noise-on``/``--noise-off`` seconds, default 2 and 2): every job but the
  overhead ones runs beside a co-tenant pinned to core N that busy-loops, sleeps, busy-loops, ... from the
  job's launch to its end (a host whose speed swings; the rank pinned to core N is the one slowed while it
  runs). Same kinds; each result line says so (``noise``), and the report adds means with 95 % intervals.
* ``unpinned`` (``--pinning-ab``): a ``phases`` run with ``[experiment] cpu_pinning = false``, next to the
  ``phases`` runs of the same schedule, which (like ``load`` and ``overhead``) run with ``cpu_pinning = true``.
* ``noreplan`` (``--replan-ab``): a ``phases`` run with ``[freeze] replan = false``, right after the ``phases``
  run of the same schedule and repeat; with ``--load-change`` on that schedule also ``<load kind>_noreplan``
  after its ``load`` run. Reported as the paired ratio of stable batch times, re-planning on over off.

Where the stable error comes from (``decompose``, from a run's trace and metrics, per stable step ``k``):
measured batch ``M_k`` / predicted ``P_k`` = (``M_k / L_k``) x (``L_k / P_k``), with ``L_k`` the DAG's longest
path over the step's *measured* action times plus the plan's delays on cross-rank edges. ``M_k / L_k - 1``
is what the DAG model misses given the true action times (Python and scheduling between actions, waits
the edges do not carry); ``L_k / P_k - 1`` is how far the actions themselves ran from the plan's estimates.
Both are reported as medians over the stable steps.

Outputs under ``--out``: ``results.jsonl`` (one line per job, the resume record, keyed by kind, schedule,
repeat and layout: a re-run with the same layout skips what is done), ``bench_runtime.csv`` and
``bench_runtime.md`` (median [min, max] over the repeats; a layout other than the embedded default writes
``bench_runtime_<layout>.md``). Job dumps (traces, logs) go to ``--dumps``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from timelyfreeze.experiments.runtime.analysis import (
    CYCLES,
    MODE_ENV,
    PROFILE_ENV,
    after_replan,
    decompose,
    overhead_figures,
    phase_median,
    share,
)
from timelyfreeze.experiments.runtime.report import WARMUP, load_kind, noise_text, report, write_csv
from timelyfreeze.experiments.sweep.runner import fmt_duration
from timelyfreeze.titan import launch
from timelyfreeze.titan.launch import CONFIGS, REPO_ROOT

CONFIG = {
    "GPipe": "llama3_debug_gpipe_cpu.toml",
    "1F1B": "llama3_debug_1f1b_cpu.toml",
    "Interleaved1F1B": "llama3_debug_interleaved1f1b_cpu.toml",
    "ZBVZeroBubble": "llama3_debug_zbv_cpu.toml",
}
DEFAULT_LAYOUT = "PP=2; seq 256, 8 microbatches"
"""The layout of a result line without a ``layout`` field (the embedded default)."""


class BenchError(Exception):
    """A job that failed: one line naming its log."""


# -- jobs ------------------------------------------------------------------------------------------
def torchrun(
    target: list[str],
    config: str,
    dump: Path,
    nproc: int,
    layout: list[str],
    args: list[str],
    on_row: Callable[[dict], None] | None = None,
    env: dict | None = None,
) -> None:
    """One bench job (``launch``): ``target`` on ``config`` with tensorboard and validation off, its log in
    ``<dump>/bench.log``; ``on_row`` is called for every new metrics row. BenchError when it fails."""
    cmd = launch.torchrun_command(
        CONFIGS / config,
        "--metrics.no-enable-tensorboard",
        "--validation.no-enable",
        *layout,
        *args,
        nproc=nproc,
        dump_folder=dump,
        target=target,
    )
    rc = launch.run(cmd, dump / "bench.log", metrics=dump / "timelyfreeze" / "metrics.jsonl", on_row=on_row, env=env)
    if rc != 0:
        raise BenchError(f"job failed (exit {rc}), see {dump / 'bench.log'}")


def cycle_args(r_max: float, monitor: int, ramp: int, stable: int) -> list[str]:
    return [
        "--freeze.r_max",
        str(r_max),
        "--freeze.warmup_steps",
        str(WARMUP),
        "--freeze.monitor_steps",
        str(monitor),
        "--freeze.ramp_steps",
        str(ramp),
        "--training.steps",
        str(WARMUP + 2 * monitor + ramp + stable),
    ]


def overhead_job(schedule: str, dump: Path, opts, mode: str = "plain") -> dict:
    """``mode`` (``analysis.CYCLES``): ``plain`` and ``probe`` at ratio 0 (2-step monitoring windows, a 1-step
    ramp); ``masked`` at ``--r-max`` with the phases jobs' windows and ramp, so that a plan is in force."""
    r_max, monitor, ramp = (opts.r_max, opts.monitor, opts.ramp) if mode == "masked" else (0.0, 2, 1)
    torchrun(
        ["-m", "timelyfreeze.experiments.runtime.overhead_trainer"],
        CONFIG[schedule],
        dump,
        opts.nproc,
        opts.layout,
        [*cycle_args(r_max, monitor, ramp, len(CYCLES[mode]) * opts.pairs), "--experiment.cpu-pinning"],
        env={MODE_ENV: mode}
        | ({PROFILE_ENV: str(Path(opts.profile) / dump.name)} if getattr(opts, "profile", "") else {}),
    )
    return overhead_figures([r for r in json.loads((dump / "bench_overhead.json").read_text()) if r["kind"] != "cycle"])


def phases_job(
    schedule: str,
    dump: Path,
    opts,
    extra: list[str] = (),
    load: bool = False,
    load_core: int | None = None,
) -> dict:
    stable = opts.load_stable if load else opts.stable
    hog: list[subprocess.Popen] = []
    noise = noisy_cotenant(opts)

    def on_row(row: dict) -> None:
        if load and not hog and row.get("phase") in ("progressive", "stable") and row["step"] >= ramp_end:
            pin = f"import os\nos.sched_setaffinity(0, {{{load_core}}})\n" if load_core is not None else ""
            hog.append(subprocess.Popen([sys.executable, "-c", pin + "while True:\n    pass\n"]))

    ramp_end = WARMUP + 2 * opts.monitor + opts.ramp
    try:
        torchrun(
            ["-m", "timelyfreeze.train"],
            CONFIG[schedule],
            dump,
            opts.nproc,
            opts.layout,
            [*cycle_args(opts.r_max, opts.monitor, opts.ramp, stable), *extra],
            on_row=on_row,
        )
    finally:
        alive = bool(hog) and all(p.poll() is None for p in hog)
        noise_alive = noise is None or noise.poll() is None
        for p in hog + ([noise] if noise is not None else []):
            p.kill()
            p.wait()
    if not noise_alive:
        raise BenchError(f"the noisy co-tenant died during the job ({dump})")
    if load and not alive:
        raise BenchError(f"the co-tenant process {'never started' if not hog else 'died'} ({dump})")
    out = dump / "timelyfreeze"
    s = json.loads((out / "summary.json").read_text())
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    pred = s["predicted_batch_ms"]
    med = {p: phase_median(metrics, p) for p in ("upper", "lower", "stable")}
    stable_rows = [m for m in metrics if m.get("phase") == "stable" and m.get("predicted_batch_ms")]
    res = {
        "upper_ms": med["upper"],
        "lower_ms": med["lower"],
        "stable_ms": med["stable"],
        "pred_no_freeze_ms": pred["no_freeze"],
        "pred_all_frozen_ms": pred["all_frozen"],
        "pred_planned_ms": pred["planned"],
        "error_pct": 100 * (statistics.median(m["batch_ms"] / m["predicted_batch_ms"] for m in stable_rows) - 1),
        "speedup_measured": med["upper"] / med["stable"],
        "speedup_predicted": pred["no_freeze"] / pred["planned"],
        "avg_freeze_ratio": s["avg_freeze_ratio"],
        "replans": len(s.get("replans") or []),
        "load_started": bool(hog),
    }
    if noise is not None:
        res["noise"] = noise_text(opts)
    res["share_pct"] = share(res["speedup_measured"], res["speedup_predicted"])
    res.update(decompose(dump))
    if load:
        res.update(after_replan(dump))
    return res


def noisy_cotenant(opts) -> subprocess.Popen | None:
    """With ``--noise-core N``: a co-tenant pinned to core N that busy-loops ``--noise-on`` s, then sleeps
    ``--noise-off`` s, over and over, from the job's launch to its end (a host whose speed swings); else None."""
    if getattr(opts, "noise_core", None) is None:
        return None
    code = (
        f"import os, time\nos.sched_setaffinity(0, {{{opts.noise_core}}})\n"
        f"while True:\n    t = time.monotonic()\n    while time.monotonic() - t < {opts.noise_on}:\n        pass\n"
        f"    time.sleep({opts.noise_off})\n"
    )
    return subprocess.Popen([sys.executable, "-c", code])


# -- the run ---------------------------------------------------------------------------------------
OVERHEAD_KINDS = {"plain": "overhead", "probe": "overhead_probe", "masked": "overhead_masked"}


def overhead_mode(opts) -> str:
    """The overhead jobs' mode (``analysis.CYCLES``) from the flags."""
    if getattr(opts, "overhead_masked", False):
        return "masked"
    return "probe" if getattr(opts, "overhead_probe", False) else "plain"


def overhead_kind(opts) -> str:
    return OVERHEAD_KINDS[overhead_mode(opts)]


def plan_jobs(opts) -> list[tuple[str, str, int]]:
    """(kind, schedule, repeat) in run order: repeat i of every cell before repeat i + 1."""
    jobs = []
    for i in range(opts.repeats):
        for s in opts.schedules:
            if not opts.skip_overhead:
                jobs.append((overhead_kind(opts), s, i))
            if not getattr(opts, "overhead_only", False):
                jobs.append(("phases", s, i))
        for s in opts.load_change:
            if i < opts.load_repeats:
                jobs.append((load_kind(opts), s, i))
        for s in opts.pinning_ab:
            jobs.append(("unpinned", s, i))
        for s in getattr(opts, "replan_ab", []):
            jobs.append(("noreplan", s, i))
            if s in opts.load_change and i < opts.load_repeats:
                jobs.append((load_kind(opts) + "_noreplan", s, i))
    return jobs


def run(opts) -> list[dict]:
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.jsonl"
    done = {}
    if results_path.exists():
        for line in results_path.read_text().splitlines():
            r = json.loads(line)
            if r.get("layout", DEFAULT_LAYOUT) == opts.layout_key:
                done[(r["kind"], r["schedule"], r["repeat"])] = r
    jobs = plan_jobs(opts)
    todo = [j for j in jobs if j not in done]
    print(f"{len(jobs)} jobs, {len(jobs) - len(todo)} already done ({results_path})", flush=True)
    durations: list[float] = []
    for n, (kind, s, i) in enumerate(todo, 1):
        dump = Path(opts.dumps) / job_dir_name(kind, s, i, opts)
        t0 = time.time()
        print(f"[{n}/{len(todo)}] {kind} {s} #{i} ...", end=" ", flush=True)
        if kind.startswith("overhead"):
            res = overhead_job(s, dump, opts, mode={v: k for k, v in OVERHEAD_KINDS.items()}[kind])
        else:
            # every job but the A/B's other half runs pinned, as the results so far were measured
            pin = "--experiment.no-cpu-pinning" if kind == "unpinned" else "--experiment.cpu-pinning"
            extra = [pin, "--freeze.no-replan"] if kind.endswith("noreplan") else [pin]
            res = phases_job(s, dump, opts, extra=extra, load=kind.startswith("load"), load_core=opts.load_core)
        durations.append(time.time() - t0)
        rec = {
            "kind": kind,
            "schedule": s,
            "repeat": i,
            "layout": opts.layout_key,
            "seconds": round(durations[-1], 1),
            "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "loadavg_1m": os.getloadavg()[0],
            **res,
        }
        with open(results_path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        done[(kind, s, i)] = rec
        left = len(todo) - n
        eta = f", ETA {fmt_duration(left * statistics.fmean(durations))}" if left else ""
        print(f"{durations[-1]:.0f} s{eta}", flush=True)
    return [done[j] for j in jobs]


def _reanalyse(opts) -> None:
    path = Path(opts.out) / "results.jsonl"
    if not path.exists():
        return
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for r in rows:
        if r["kind"] != "overhead":
            if r.get("layout", DEFAULT_LAYOUT) == opts.layout_key:
                dump = Path(opts.dumps) / job_dir_name(r["kind"], r["schedule"], r["repeat"], opts)
                r.update(decompose(dump))
                if r["kind"].startswith("load") and (dump / "timelyfreeze" / "summary.json").exists():
                    for k in (
                        "replan_step",
                        "steps_after",
                        "stable_after_ms",
                        "pred_after_planned_ms",
                        "pred_after_no_freeze_ms",
                        "error_after_pct",
                        "share_after_pct",
                    ):
                        r.pop(k, None)
                    r.update(after_replan(dump))
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)


def layout_tag(opts) -> str:
    """``""`` for the embedded default's layout, else ``_`` and the layout key in file-name characters."""
    return (
        "" if opts.layout_key == DEFAULT_LAYOUT else "_" + "".join(c if c.isalnum() else "-" for c in opts.layout_key)
    )


def job_dir_name(kind: str, schedule: str, repeat: int, opts) -> str:
    return f"{kind}_{schedule}_{repeat}{layout_tag(opts)}"


def _profile_folder(folder: str, skip_overhead: bool) -> Path:
    """``--profile``'s folder, made now and absolute (the jobs write there from their own working folder); a
    path that is a file or cannot be made, or no overhead job to profile, is bad input."""
    if skip_overhead:
        _fail("--profile: profiles the overhead jobs, and --skip-overhead drops them")
    path = Path(folder).resolve()
    if path.exists() and not path.is_dir():
        _fail(f"--profile: {folder} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _fail(f"--profile: cannot make the folder {folder} ({e.strerror or e})")
    if not os.access(path, os.W_OK):
        _fail(f"--profile: cannot write in the folder {folder}")
    return path


def _fail(msg: str) -> None:
    """Bad input: one ``error:`` line, exit code 2."""
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def _schedules(text: str, flag: str) -> list[str]:
    out = [s.strip() for s in text.split(",") if s.strip()]
    for s in out:
        if s not in CONFIG:
            _fail(f"{flag}: unknown schedule {s!r} (choose from {', '.join(CONFIG)})")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="bench_runtime.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--schedules", default=",".join(CONFIG))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=10, help="paired stable steps of an overhead job")
    ap.add_argument("--monitor", type=int, default=4)
    ap.add_argument("--ramp", type=int, default=3)
    ap.add_argument("--stable", type=int, default=12)
    ap.add_argument("--load-stable", type=int, default=16, help="stable steps of a --load-change job")
    ap.add_argument("--r-max", type=float, default=0.8)
    ap.add_argument("--load-change", default="", help="schedules that also run with a co-tenant (comma list)")
    ap.add_argument("--load-repeats", type=int, default=5)
    ap.add_argument(
        "--load-core",
        type=int,
        default=None,
        help="pin the co-tenant to this core (the rank pinned there slows; default: free to move)",
    )
    ap.add_argument(
        "--noise-core",
        type=int,
        default=None,
        help="every job but the overhead ones runs beside a co-tenant pinned to this core that comes and goes",
    )
    ap.add_argument("--noise-on", type=float, default=2.0, help="seconds the noisy co-tenant busy-loops")
    ap.add_argument("--noise-off", type=float, default=2.0, help="seconds the noisy co-tenant then sleeps")
    ap.add_argument("--pinning-ab", default="", help="schedules that also run with cpu_pinning off")
    ap.add_argument("--replan-ab", default="", help="schedules that also run with replan off (and under load)")
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--overhead-only", action="store_true", help="only the overhead jobs (no phases jobs)")
    ap.add_argument(
        "--overhead-probe",
        action="store_true",
        help="overhead jobs cycle attached, detached, no-op hooks, detached (kind overhead_probe)",
    )
    ap.add_argument(
        "--overhead-masked",
        action="store_true",
        help="overhead jobs at --r-max: attached steps against detached ones that apply the same plan's masks "
        "(kind overhead_masked)",
    )
    ap.add_argument(
        "--profile",
        default="",
        help="a folder: each overhead job profiles the runtime's own code in its attached steps and writes "
        "<folder>/<job>/profile_rank<r>.pstats (a diagnostic: the profiler's cost enters that job's figures)",
    )
    ap.add_argument("--out", default="docs/results/runtime")
    ap.add_argument("--dumps", default="outputs/bench_runtime")
    ap.add_argument("--dp-shard", type=int, default=1)
    ap.add_argument("--dp-replicate", type=int, default=1)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--small", action="store_true", help="4 microbatches of 128 tokens instead of 8 of 256")
    ap.add_argument(
        "--reanalyse",
        action="store_true",
        help="recompute the error decomposition of finished phases jobs from their dumps, then report",
    )
    opts = ap.parse_args(argv)
    for name in ("dp_shard", "dp_replicate", "tp", "repeats", "pairs", "monitor", "ramp", "stable", "load_stable"):
        if getattr(opts, name) < 1:
            _fail(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(opts, name)}")
    if opts.noise_core is not None and not 0 <= opts.noise_core < (os.cpu_count() or 1):
        _fail(f"--noise-core: no core {opts.noise_core} on this machine (cores 0..{(os.cpu_count() or 1) - 1})")
    for name in ("noise_on", "noise_off"):
        if not 0 < getattr(opts, name) < float("inf"):
            _fail(f"--{name.replace('_', '-')}: must be a number of seconds > 0, got {getattr(opts, name)}")
    if not 0 <= opts.r_max <= 1:
        _fail(f"--r-max: must lie in [0, 1], got {opts.r_max}")
    if opts.overhead_masked and opts.overhead_probe:
        _fail("--overhead-masked and --overhead-probe: choose one")
    if opts.overhead_masked and opts.r_max == 0:
        _fail("--overhead-masked: needs --r-max above 0 (at ratio 0 no mask is drawn)")
    if opts.profile:
        opts.profile = str(_profile_folder(opts.profile, opts.skip_overhead))
    opts.schedules = _schedules(opts.schedules, "--schedules")
    opts.load_change = _schedules(opts.load_change, "--load-change")
    opts.pinning_ab = _schedules(opts.pinning_ab, "--pinning-ab")
    opts.replan_ab = _schedules(opts.replan_ab, "--replan-ab")
    opts.nproc = 2 * opts.dp_shard * opts.dp_replicate * opts.tp
    opts.layout = [
        "--parallelism.data_parallel_shard_degree",
        str(opts.dp_shard),
        "--parallelism.data_parallel_replicate_degree",
        str(opts.dp_replicate),
        "--parallelism.tensor_parallel_degree",
        str(opts.tp),
    ]
    opts.layout_text = "PP=2" + "".join(
        f" x {n} {k}" for n, k in (("FSDP", opts.dp_shard), ("replicate", opts.dp_replicate), ("TP", opts.tp)) if k > 1
    )
    opts.size_text = "seq 128, 4 microbatches" if opts.small else "seq 256, 8 microbatches"
    if opts.small:
        opts.layout += ["--training.local_batch_size", "4", "--training.seq_len", "128"]
    opts.layout_key = f"{opts.layout_text}; {opts.size_text}"
    opts.out = str((REPO_ROOT / opts.out).resolve())
    opts.dumps = str((REPO_ROOT / opts.dumps).resolve())
    if opts.reanalyse:
        _reanalyse(opts)
    try:
        rows = run(opts)
    except BenchError as e:
        print(f"\nerror: {e}", file=sys.stderr)
        return 1
    text = report(rows, opts)
    print("\n" + text)
    out = Path(opts.out)
    write_csv(rows, out / f"bench_runtime{layout_tag(opts)}.csv")
    (out / f"bench_runtime{layout_tag(opts)}.md").write_text(text + "\n")
    return 0
