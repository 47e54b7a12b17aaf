"""Predict the measured stable batch of the paper authors' own runs from their monitoring windows (issue 38).

    python scripts/authors_logs.py LOGS_DIR --out docs/results/authors-logs

``LOGS_DIR``: a copy of ``logs/h200/260102_llama8b/`` of ``orangingq/torchtitan`` (offline; see the results
README for how to fetch it).  For every TimelyFreeze-family run (``fullrand7`` = TimelyFreeze, ``timelyapf``,
``timelyauto``) of the four schedules: the authors' plan, this project's prediction of that run, this
project's own plan on the same trace, and the measured stable batch (mean of the measured blocks of steps
``400-1900``); for the no-freezing runs the same against the upper bound.  Writes ``results.csv`` and
``results.md`` into ``--out``.

The prediction of a run is made from its monitoring windows only (``planner.trace.authors_log``: upper block,
lower-window block): the authors' planned durations (their freeze ratios), a cliff stage's partial ratios on
the floor of the other stages (``planner.timing.cliff``), on the schedule DAG with the cross-rank delays and the gap
model fitted on the lower window (``planner.timing.comm``, ``planner.timing.gaps``), times the jitter factor.  The
stable blocks only score it.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys

from planner.defaults import PLAN_DEFAULTS
from planner.errors import PlannerError
from planner.fileio import replace_atomically
from planner.plan import plan_from_trace
from planner.schedule.dag import build_dag, longest_path
from planner.timing.cliff import find_cliffs, floor_duration
from planner.timing.comm import estimate_edge_delays
from planner.timing.estimate import estimate_weights
from planner.timing.gaps import with_gap_costs
from planner.timing.jitter import expected_factor, residual_steps
from planner.trace.authors_log import TRUNCATION_MS, log_to_trace, parse_log

SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "ZBVZeroBubble")
METHODS = ("fullrand7", "timelyapf", "timelyauto")
PREFIX = "260102_"
R_MAX = 0.8
STABLE = (400, 1900)


def durations(block) -> dict[str, float]:
    return {e.action: e.dur + TRUNCATION_MS for es in block.ranks.values() for e in es}


def measured_stable(log) -> tuple[float, int]:
    xs = [b.batch_ms for b in log.measured() if STABLE[0] <= b.step <= STABLE[1]]
    if not xs:
        raise PlannerError(f"{log.source}: no measured block of steps {STABLE[0]}-{STABLE[1]}")
    return statistics.fmean(xs), len(xs)


def predict_run(log, trace) -> dict:
    """This project's prediction of the run's stable batch (module docstring) and its parts."""
    dag = build_dag(trace.meta)
    cross = estimate_edge_delays(trace, dag)
    edge_ms, model = with_gap_costs(trace, dag, cross)
    hi, lo, plan = (durations(log.first(k)) for k in ("upper", "lower_bound", "plan"))
    cliffs = find_cliffs(estimate_weights(trace, PLAN_DEFAULTS["estimator"]))
    stages = set(cliffs["stages"])
    pred = {}
    for a, d in plan.items():
        stage = int(a.rstrip("0123456789")[:-1])
        if stage in stages and a.rstrip("0123456789").endswith("B") and hi[a] > lo[a]:
            pred[a] = floor_duration(lo[a], hi[a], (hi[a] - d) / (hi[a] - lo[a]), cliffs["share"])
        else:
            pred[a] = d
    jitter = expected_factor(dag, pred, residual_steps(trace), edge_ms)
    return {
        "no_idle_ms": longest_path(dag, pred, cross)[0],
        "predicted_ms": longest_path(dag, pred, edge_ms)[0] * jitter,
        "plan_lp_ms": longest_path(dag, plan)[0],
        "jitter": jitter,
        "cliff": sorted(stages),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("logs", metavar="LOGS_DIR")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    try:
        rows = run(args.logs)
        write(rows, args.out)
    except PlannerError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    return 0


def log_path(logs: str, name: str) -> str:
    """``<logs>/<name>.log``, or the kept ``<name>.log.gz`` (``planner.analysis.authors_logs_source``)."""
    plain = os.path.join(logs, f"{name}.log")
    return plain if os.path.exists(plain) or not os.path.exists(plain + ".gz") else plain + ".gz"


def run(logs: str) -> list[dict]:
    rows = []
    for s in SCHEDULES:
        upper_trace = None
        for m in METHODS:
            log = parse_log(log_path(logs, f"{PREFIX}{s}_{m}"))
            trace = log_to_trace(log)
            meas, n = measured_stable(log)
            pr = predict_run(log, trace)
            ours = plan_from_trace(trace, R_MAX, **PLAN_DEFAULTS)
            planned = ours.batch_time_ms["planned"] * ours.extra["jitter"]["planned"]
            rows.append(
                {
                    "schedule": s,
                    "run": m,
                    "authors_ms": log.plan_batch_ms,
                    "predicted_ms": round(pr["predicted_ms"], 1),
                    "measured_ms": round(meas, 1),
                    "error_pct": round(100 * (pr["predicted_ms"] / meas - 1), 2),
                    "authors_error_pct": round(100 * (log.plan_batch_ms / meas - 1), 2),
                    "no_idle_ms": round(pr["no_idle_ms"], 1),
                    "our_plan_ms": round(planned, 1),
                    "blocks": n,
                    "cliff_stages": " ".join(map(str, pr["cliff"])),
                }
            )
            if upper_trace is None:
                upper_trace = (log, trace, ours)
        log, trace, ours = upper_trace
        nf = parse_log(log_path(logs, f"{PREFIX}{s}_nofreeze"))
        meas, n = measured_stable(nf)
        pred = ours.batch_time_ms["no_freeze"] * ours.extra["jitter"]["no_freeze"]
        rows.append(
            {
                "schedule": s,
                "run": "nofreeze",
                "authors_ms": log.first("upper").batch_ms,
                "predicted_ms": round(pred, 1),
                "measured_ms": round(meas, 1),
                "error_pct": round(100 * (pred / meas - 1), 2),
                "authors_error_pct": round(100 * (log.first("upper").batch_ms / meas - 1), 2),
                "no_idle_ms": "",
                "our_plan_ms": "",
                "blocks": n,
                "cliff_stages": "",
            }
        )
    return rows


def write(rows: list[dict], out: str) -> None:
    os.makedirs(out, exist_ok=True)
    fields = list(rows[0])

    def write_csv(tmp: str) -> None:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fields)
            w.writeheader()
            w.writerows(rows)

    replace_atomically(os.path.join(out, "results.csv"), write_csv)
    tf = [r for r in rows if r["run"] != "nofreeze"]
    errs = [abs(r["error_pct"]) for r in tf]
    auth = [abs(r["authors_error_pct"]) for r in tf]
    lines = [
        "| schedule | run | authors' plan (ms) | predicted (ms) | measured stable (ms) | error | authors' error | "
        "no idle (ms) | our own plan (ms) | blocks |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['schedule']} | {r['run']} | {r['authors_ms']} | {r['predicted_ms']} | {r['measured_ms']} | "
            f"{r['error_pct']:+.1f} % | {r['authors_error_pct']:+.1f} % | {r['no_idle_ms']} | {r['our_plan_ms']} | "
            f"{r['blocks']} |"
        )
    lines += [
        "",
        f"TimelyFreeze-family runs ({len(tf)}): median |error| {statistics.median(errs):.2f} %, max "
        f"{max(errs):.2f} %, within 5 %: {sum(e <= 5 for e in errs)} of {len(tf)} (the authors' LP: median "
        f"{statistics.median(auth):.2f} %, max {max(auth):.2f} %).",
    ]
    text = "\n".join(lines) + "\n"

    def write_md(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    replace_atomically(os.path.join(out, "results.md"), write_md)
    print(text)


if __name__ == "__main__":  # (python -m planner.analysis.authors_logs)
    sys.exit(main())
