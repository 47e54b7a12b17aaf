#!/usr/bin/env python
"""Benchmark the offline planner's LP (DAG + model build + two-stage HiGHS solve) across pipeline sizes.

Each size runs in a fresh subprocess so that its peak RSS is its own (and a time limit, ``--timeout``).

Default (``--schedules``): every torch schedule of ``planner.schedule.orders`` at the ``--sizes`` (pp, microbatches;
stages per rank as TorchTitan: 1 for GPipe/1F1B, 2 otherwise), with *real-like* timings
(``planner.trace.synthetic.real_like_weights``, seeded: stage costs spread +-40 %, +-5 % jitter per action and
bound, weight-grad work down to 10 % when frozen), ``r_max`` 0.5.  ``--timings uniform``: the older synthetic
timings (``synthetic_weights``: per-action lower bounds 30-60 % of the upper bound).  The ``gap`` column is
the certified relative gap of the planned batch time (0: exact optimum; the bounded region method,
``solver.method = highs-region-bounded``, stops at 0.1 %).

    .venv/bin/python scripts/bench_planner.py [--sizes 8x64,16x256,32x512] [--schedules ...] [--solver auto]
    .venv/bin/python scripts/bench_planner.py --legacy [--quick] [--max-actions N]   # the older size table
    .venv/bin/python scripts/bench_planner.py --process --sizes 32x512 --schedules Interleaved1F1B,ZBVZeroBubble
        # the whole `planner plan` process on simulated trace files, --repeats runs each

``--solver`` takes a name of ``planner.lp.solve.SOLVERS`` or, to time the whole LP under another HiGHS
configuration, a key of ``planner.lp.highs.CONFIGS`` (``dual``, ``dual-dse``, ``primal``, ``slack``,
``ipx``; ``fast`` is the default one).  Measured history: ``docs/planner-solver-notes.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SIZES = [  # (pp, stages per rank, microbatches)
    (4, 1, 8),
    (4, 2, 8),
    (4, 1, 32),
    (8, 2, 16),
    (4, 2, 32),
    (8, 2, 64),
    (8, 2, 256),
    (16, 2, 256),
    (16, 2, 512),
    (32, 2, 512),
]
QUICK = [(4, 1, 8), (4, 2, 8), (8, 2, 16), (8, 2, 64)]


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def make_meta(pp: int, spr: int, mb: int, split: bool):
    from planner.trace.load import TraceMeta

    try:
        from planner.schedule import orders as schedules

        name = "ZBVZeroBubble" if split else ("Interleaved1F1B" if spr > 1 else "1F1B")
        if split and spr != 2:
            raise ValueError("ZBV needs 2 stages per rank")
        s2r = schedules.stage_to_rank(name, pp, spr)
        orders = schedules.rank_orders(name, pp, mb, spr)
        return TraceMeta(name, pp, len(s2r), mb, s2r, orders), "schedules"
    except Exception:
        from planner.trace.synthetic import synthetic_meta

        return synthetic_meta(pp, spr, mb, split), "synthetic"


def schedule_meta(name: str, pp: int, mb: int):
    from planner.schedule import orders as schedules
    from planner.trace.load import validate_meta

    return validate_meta(schedules.schedule_meta(name, pp, mb), f"<{name} pp={pp} mb={mb}>")


def run_one(
    pp: int,
    spr: int,
    mb: int,
    split: bool,
    solver: str,
    schedule: str | None = None,
    timings: str = "uniform",
    gap: float | None = None,
) -> dict:
    """One measurement, in this process (``schedule``: a torch schedule name, else the legacy choice by ``split``)."""
    from planner.lp.solve import SOLVERS, solve_freeze_lp
    from planner.schedule.dag import build_dag
    from planner.trace.synthetic import real_like_weights, synthetic_weights

    base = _rss_mb()
    if schedule:
        meta, origin = schedule_meta(schedule, pp, mb), "schedules"
        spr = meta.num_stages // pp
    else:
        meta, origin = make_meta(pp, spr, mb, split)
    seed = pp * 1000 + mb
    if timings.startswith("replay:"):  # a measured trace's timings, resampled onto this size
        from planner.timing.estimate import estimate_weights
        from planner.trace.load import load_trace
        from planner.trace.synthetic import replay_weights

        src = load_trace(timings.split(":", 1)[1])
        w = replay_weights(estimate_weights(src, "median"), src.meta, meta, seed=seed)
    elif timings == "real-like":
        w = real_like_weights(meta, seed=seed)
    else:
        w = synthetic_weights(meta, seed=seed)
    t0 = time.perf_counter()
    dag = build_dag(meta)
    t_dag = time.perf_counter() - t0
    st: dict = {}
    kw = {"solver": solver} if solver in SOLVERS else {"solver": "whole", "_config": solver}
    sol = solve_freeze_lp(dag, w, 0.5, stats=st, gap=gap, **kw)
    method = "whole LP"
    if "rounds" in st and sol.solver != "highs-fast":
        kind = "bounded region" if sol.solver == "highs-region-bounded" else "region"
        method = f"{kind}: {st['rounds']} round{'s' if st['rounds'] > 1 else ''}, {st['region_actions']:,} actions"
    elif "rounds" in st:
        method = f"whole LP (region gave up after {st['rounds']} rounds)"
    fz = w.freezable
    total_r = sum((w.w_max[a] - d) / (w.w_max[a] - w.w_min[a]) for a, d in sol.durations.items() if a in fz)
    return {
        "schedule": meta.schedule,
        "timings": timings,
        "gap": sol.gap,
        "lower_bound": sol.lower_bound,
        "gap_target": sol.gap_target,
        "batch_ms": sol.makespan,
        "total_ratio": total_r,
        "pp": pp,
        "spr": spr,
        "mb": mb,
        "split": split,
        "orders": origin,
        "actions": st["actions"],
        "cols": st["cols"],
        "rows": st["rows"],
        "nnz": st["nnz"],
        "iters": st["iters1"] + st["iters2"],
        "method": method,
        "dag_s": t_dag,
        "lp_s": st["total_s"],
        "total_s": t_dag + st["total_s"],
        "peak_mb": _rss_mb(),
        "delta_mb": _rss_mb() - base,
    }


SCHEDULE_NAMES = (
    "GPipe",
    "1F1B",
    "Interleaved1F1B",
    "LoopedBFS",
    "InterleavedZeroBubble",
    "ZBVZeroBubble",
    "DualPipeV",
)


def schedules_table(a: argparse.Namespace) -> None:
    """One row per (size, schedule): real-like (or uniform) timings, the gap column."""
    try:
        sizes = [tuple(int(x) for x in item.split("x")) for item in a.sizes.split(",")]
        assert all(len(t) == 2 and t[0] > 0 and t[1] > 0 for t in sizes)
    except (ValueError, AssertionError):
        print(f"error: --sizes: expected PPxMICROBATCHES,..., got {a.sizes!r}", file=sys.stderr)
        sys.exit(2)
    names = [x for x in a.schedules.split(",") if x]
    if a.timings.startswith("replay:"):
        from planner.errors import PlannerError
        from planner.trace.load import load_trace

        try:
            names = [load_trace(a.timings.split(":", 1)[1]).meta.schedule]
        except PlannerError as e:
            print(f"error: --timings: {e}", file=sys.stderr)
            sys.exit(2)
    elif a.timings not in ("real-like", "uniform"):
        print(f"error: --timings: expected real-like, uniform or replay:TRACE, got {a.timings!r}", file=sys.stderr)
        sys.exit(2)
    unknown = [x for x in names if x not in SCHEDULE_NAMES]
    if unknown:
        print(f"error: --schedules: unknown {', '.join(unknown)} (known: {', '.join(SCHEDULE_NAMES)})", file=sys.stderr)
        sys.exit(2)
    print(f"timings: {a.timings}; r_max 0.5; solver {a.solver}; gap {'default' if a.gap is None else a.gap}\n")
    print(
        "| schedule | pp x stages x microbatches | actions | method | simplex iters | DAG s | LP s | total s "
        "| batch ms | gap | peak RSS MB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for pp, mb in sizes:
        for name in names:
            cmd = [
                sys.executable,
                __file__,
                "--one",
                json.dumps([pp, 0, mb, False, name]),
                "--solver",
                a.solver,
                "--timings",
                a.timings,
            ]
            if a.gap is not None:
                cmd += ["--gap", str(a.gap)]
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=a.timeout)
            except subprocess.TimeoutExpired:
                print(f"| {name} | {pp} x ? x {mb} | | timed out after {a.timeout:.0f} s | | | | | | | |", flush=True)
                continue
            if out.returncode != 0:
                tail = out.stderr.strip().splitlines()[-1:] or ["?"]
                print(f"| {name} | {pp} x ? x {mb} | | failed: {tail[0]} | | | | | | | |", flush=True)
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            if r.get("gap_target") is not None:  # fallback: the target gap was not reached, the best plan kept
                r["method"] += f" (target {100 * r['gap_target']:g} % missed)"
            print(
                f"| {name} | {pp} x {r['spr']} x {mb} | {r['actions']:,} | {r['method']} | {r['iters']:,} "
                f"| {r['dag_s']:.2f} | {r['lp_s']:.2f} | {r['total_s']:.2f} | {r['batch_ms']:.1f} "
                f"| {100 * r['gap']:.3f} % | {r['peak_mb']:.0f} |",
                flush=True,
            )


def _median_range(xs: list[float]) -> str:
    xs = sorted(xs)
    mid = xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2
    return f"{mid:.2f} [{xs[0]:.2f}, {xs[-1]:.2f}]" if len(xs) > 1 else f"{mid:.2f}"


def _children_cpu() -> float:
    """User + system CPU seconds of the finished child processes so far."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _load() -> str:
    """The 1, 5 and 15 minute load averages (other work on the machine stretches the wall times)."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


def process_table(a: argparse.Namespace) -> None:
    """The whole ``python -m planner plan`` process, timed from outside, on trace files written by
    ``planner.trace.simulate`` (one record per action and phase; per-stage costs ``U(0.6, 1.4)`` from ``--trace-seed``,
    +-5 % jitter per record): what a user waits for, trace loading, weights, DAG, LP, plan file and summary."""
    import random
    import tempfile

    from planner.trace.simulate import synthetic_trace, write_trace

    sizes = [tuple(int(x) for x in item.split("x")) for item in a.sizes.split(",")]
    names = [x for x in a.schedules.split(",") if x]
    print(
        f"whole `planner plan` process, r_max {a.r_max:g}, {a.repeats} runs each (median [min, max]); traces: "
        f"`planner simulate`, stage scales U(0.6, 1.4) seed {a.trace_seed}, jitter 0.05, 1 record per action "
        f"and phase; load average at the start {_load()}\n"
    )
    print("| schedule | pp x stages x microbatches | actions | method | process s | CPU s | LP s | batch ms | gap |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for pp, mb in sizes:
            for name in names:
                from planner.schedule import orders as schedules

                ns = pp * schedules.stages_per_rank(name)
                rng = random.Random(a.trace_seed)
                scale = [round(rng.uniform(0.6, 1.4), 4) for _ in range(ns)]
                trace = synthetic_trace(name, pp, mb, stage_scale=scale, jitter=0.05, seed=a.trace_seed, steps=1)
                tdir = os.path.join(tmp, f"{name}_{pp}x{mb}")
                write_trace(trace, tdir)
                out = os.path.join(tmp, "plan.json")
                walls, cpus, lps, plan, failure = [], [], [], None, None
                for _ in range(a.repeats):
                    t0, c0 = time.perf_counter(), _children_cpu()
                    try:
                        run = subprocess.run(
                            [sys.executable, "-m", "planner", "plan", tdir, "--r-max", f"{a.r_max:g}", "--out", out],
                            cwd=ROOT,
                            capture_output=True,
                            text=True,
                            check=False,
                            timeout=a.timeout,
                        )
                    except subprocess.TimeoutExpired:
                        failure = f"timed out after {a.timeout:.0f} s"
                        break
                    walls.append(time.perf_counter() - t0)
                    cpus.append(_children_cpu() - c0)
                    if run.returncode != 0:
                        failure = f"failed: {(run.stderr.strip().splitlines() or ['?'])[-1]}"
                        break
                    with open(out, encoding="utf-8") as f:
                        plan = json.load(f)
                    lps.append(plan["solver"]["seconds"])
                if failure or plan is None:
                    print(
                        f"| {name} | {pp} x {ns // pp} x {mb} | {len(trace.meta.all_actions()):,} | {failure} "
                        "| | | | | |",
                        flush=True,
                    )
                    continue
                print(
                    f"| {name} | {pp} x {ns // pp} x {mb} | {len(plan['actions']):,} | {plan['solver']['method']} "
                    f"| {_median_range(walls)} | {_median_range(cpus)} | {_median_range(lps)} "
                    f"| {plan['batch_time_ms']['planned']:.1f} "
                    f"| {100 * (plan['solver'].get('gap') or 0.0):.3f} % |",
                    flush=True,
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="only the small sizes")
    ap.add_argument("--max-actions", type=int, default=None, help="skip sizes with more actions than this")
    ap.add_argument("--solver", default="auto", help="planner.lp.solve.SOLVERS name or planner.lp.highs.CONFIGS key")
    ap.add_argument("--split", choices=["both", "yes", "no"], default="both")
    ap.add_argument(
        "--legacy", action="store_true", help="the older table: sizes x split (ZBV / Interleaved1F1B / 1F1B)"
    )
    ap.add_argument("--sizes", default="8x64,16x256,32x512", help="PPxMICROBATCHES,... (default 8x64,16x256,32x512)")
    ap.add_argument("--schedules", default=",".join(SCHEDULE_NAMES), help="schedule names, comma-separated")
    ap.add_argument(
        "--timings",
        default="real-like",
        help="real-like (default), uniform, or replay:TRACE (a measured trace's timings, from its folder or its "
        "trace.tar.gz, resampled onto each size; its schedule only)",
    )
    ap.add_argument("--gap", type=float, default=None, help="certified gap accepted (default: the planner's)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per size (default 600)")
    ap.add_argument(
        "--process",
        action="store_true",
        help="time the whole `python -m planner plan` process on simulated trace files (--repeats runs)",
    )
    ap.add_argument("--repeats", type=int, default=3, help="--process: runs per trace (default 3)")
    ap.add_argument("--trace-seed", type=int, default=7, help="--process: seed of the stage scales and jitter")
    ap.add_argument("--r-max", type=float, default=0.5, help="--process: the plan's r_max (default 0.5)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.process:
        process_table(a)
        return
    if a.one:
        pp, spr, mb, split, schedule = json.loads(a.one)
        print(json.dumps(run_one(pp, spr, mb, split, a.solver, schedule, a.timings, a.gap)))
        return
    if not a.legacy:
        schedules_table(a)
        return
    sizes = QUICK if a.quick else SIZES
    splits = {"both": (False, True), "yes": (True,), "no": (False,)}[a.split]
    print(
        "| pp | stages/rank | microbatches | split | orders | actions | method | LP vars | rows | simplex iters "
        "| DAG s | LP s | total s | peak RSS MB | KB/action (RSS growth) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for pp, spr, mb in sizes:
        for split in splits:
            if split and spr != 2:
                continue
            n = pp * spr * mb * (3 if split else 2)
            if a.max_actions is not None and n > a.max_actions:
                continue
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--one",
                    json.dumps([pp, spr, mb, split, None]),
                    "--solver",
                    a.solver,
                    "--timings",
                    "uniform",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if out.returncode != 0:
                print(f"| {pp} | {spr} | {mb} | {split} | failed: {out.stderr.strip().splitlines()[-1:]} |")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(
                f"| {pp} | {spr} | {mb} | {'yes' if split else 'no'} "
                f"| {r['orders']} | {r['actions']:,} | {r['method']} "
                f"| {r['cols']:,} | {r['rows']:,} | {r['iters']:,} | {r['dag_s']:.3f} | {r['lp_s']:.3f} "
                f"| {r['total_s']:.3f} | {r['peak_mb']:.0f} | {1024 * r['delta_mb'] / r['actions']:.1f} |",
                flush=True,
            )
    print(
        "\nDAG = networkx DAG from the orders; LP = solve_freeze_lp (model assembly, both HiGHS stages, for the region "
        "method every round and its whole-batch longest paths, the final longest-path check); LP vars/rows of the last "
        "model solved; orders from planner.schedule.orders where available."
    )


if __name__ == "__main__":
    main()
