#!/usr/bin/env python
"""Benchmark the offline planner's LP (DAG + model build + two-stage HiGHS solve) across pipeline sizes.

Each size runs in a fresh subprocess so that its peak RSS is its own.  Orders come from
``planner.schedules`` (ZBVZeroBubble for split backward, Interleaved1F1B / 1F1B otherwise) when it is
importable, else from ``planner.synthetic`` (list-scheduled 1F1B-like orders).  Timings are synthetic
(seeded): per-stage F/I/W ms with B/W lower bounds 30-60% of the upper bound.

    .venv/bin/python scripts/bench_planner.py [--quick] [--max-actions N] [--solver auto]

``--solver`` takes a name of ``planner.lp.SOLVERS`` or, to time the whole LP under another HiGHS
configuration, a key of ``planner.lp_solve.CONFIGS`` (``dual``, ``dual-dse``, ``primal``, ``slack``,
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
sys.path.insert(0, ROOT)

SIZES = [  # (pp, stages per rank, microbatches)
    (4, 1, 8), (4, 2, 8), (4, 1, 32), (8, 2, 16), (4, 2, 32), (8, 2, 64),
    (8, 2, 256), (16, 2, 256), (16, 2, 512), (32, 2, 512),
]
QUICK = [(4, 1, 8), (4, 2, 8), (8, 2, 16), (8, 2, 64)]


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def make_meta(pp: int, spr: int, mb: int, split: bool):
    from planner.trace import TraceMeta

    try:
        from planner import schedules

        name = "ZBVZeroBubble" if split else ("Interleaved1F1B" if spr > 1 else "1F1B")
        if split and spr != 2:
            raise ValueError("ZBV needs 2 stages per rank")
        s2r = schedules.stage_to_rank(name, pp, spr)
        orders = schedules.rank_orders(name, pp, mb, spr)
        return TraceMeta(name, pp, len(s2r), mb, s2r, orders), "schedules"
    except Exception:  # noqa: BLE001 - fall back to the local generator
        from planner.synthetic import synthetic_meta

        return synthetic_meta(pp, spr, mb, split), "synthetic"


def run_one(pp: int, spr: int, mb: int, split: bool, solver: str) -> dict:
    """One measurement, in this process."""
    from planner.dag import build_dag
    from planner.lp import SOLVERS, solve_freeze_lp
    from planner.synthetic import synthetic_weights

    base = _rss_mb()
    meta, origin = make_meta(pp, spr, mb, split)
    w = synthetic_weights(meta, seed=pp * 1000 + mb)
    t0 = time.perf_counter()
    dag = build_dag(meta)
    t_dag = time.perf_counter() - t0
    st: dict = {}
    kw = {"solver": solver} if solver in SOLVERS else {"solver": "whole", "_config": solver}
    solve_freeze_lp(dag, w, 0.5, stats=st, **kw)
    method = "whole LP"
    if "rounds" in st:
        method = f"region: {st['rounds']} round{'s' if st['rounds'] > 1 else ''}, {st['region_actions']:,} actions"
    return {
        "pp": pp, "spr": spr, "mb": mb, "split": split, "orders": origin, "actions": st["actions"],
        "cols": st["cols"], "rows": st["rows"], "nnz": st["nnz"], "iters": st["iters1"] + st["iters2"],
        "method": method, "dag_s": t_dag, "lp_s": st["total_s"], "total_s": t_dag + st["total_s"],
        "peak_mb": _rss_mb(), "delta_mb": _rss_mb() - base,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="only the small sizes")
    ap.add_argument("--max-actions", type=int, default=None, help="skip sizes with more actions than this")
    ap.add_argument("--solver", default="auto", help="planner.lp.SOLVERS name or planner.lp_solve.CONFIGS key")
    ap.add_argument("--split", choices=["both", "yes", "no"], default="both")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        pp, spr, mb, split = json.loads(a.one)
        print(json.dumps(run_one(pp, spr, mb, split, a.solver)))
        return
    sizes = QUICK if a.quick else SIZES
    splits = {"both": (False, True), "yes": (True,), "no": (False,)}[a.split]
    print("| pp | stages/rank | microbatches | split | orders | actions | method | LP vars | rows | simplex iters "
          "| DAG s | LP s | total s | peak RSS MB | KB/action (RSS growth) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for pp, spr, mb in sizes:
        for split in splits:
            if split and spr != 2:
                continue
            n = pp * spr * mb * (3 if split else 2)
            if a.max_actions is not None and n > a.max_actions:
                continue
            out = subprocess.run(
                [sys.executable, __file__, "--one", json.dumps([pp, spr, mb, split]), "--solver", a.solver],
                capture_output=True, text=True, check=False,
            )
            if out.returncode != 0:
                print(f"| {pp} | {spr} | {mb} | {split} | failed: {out.stderr.strip().splitlines()[-1:]} |")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(
                f"| {pp} | {spr} | {mb} | {'yes' if split else 'no'} | {r['orders']} | {r['actions']:,} | {r['method']} "
                f"| {r['cols']:,} | {r['rows']:,} | {r['iters']:,} | {r['dag_s']:.3f} | {r['lp_s']:.3f} "
                f"| {r['total_s']:.3f} | {r['peak_mb']:.0f} | {1024 * r['delta_mb'] / r['actions']:.1f} |",
                flush=True,
            )
    print("\nDAG = networkx DAG from the orders; LP = solve_freeze_lp (model assembly, both HiGHS stages, for the region "
          "method every round and its whole-batch longest paths, the final longest-path check); LP vars/rows of the last "
          "model solved; orders from planner.schedules where available.")


if __name__ == "__main__":
    main()
