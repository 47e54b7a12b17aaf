"""Predict the measured stable batch of the paper authors' own runs from their monitoring windows (issues 38, 49).

    python scripts/authors_logs.py LOGS_DIR --out docs/results/authors-logs

``LOGS_DIR``: the kept lines of the authors' logs (``docs/results/authors-logs/logs``, written by
``scripts/extract_authors_logs.py``; ``sources.csv`` there names the development and held-out runs).  For
every development TimelyFreeze-family run (``fullrand7`` = TimelyFreeze, ``timelyapf``, ``timelyauto``) of
the four schedules of ``260102_llama8b``: the authors' plan, this project's prediction of that run without
and with the lower-bound cliff rule, this project's own plan on the same trace (the planner's defaults), and
the measured stable batch (mean of the measured blocks of steps ``400-1900``); for the no-freezing runs the
same against the upper bound.  For every held-out run the same predictions and the measured batch.  Writes
``results.csv``/``results.md`` (development) and ``heldout.csv``/``heldout.md`` into ``--out``.

The prediction of a run is made from its monitoring windows only (``planner.trace.authors_log``: upper block,
lower-window block): the authors' planned durations (their freeze ratios), with the cliff rule a cliff
stage's partial ratios on the floor of the other stages (``planner.timing.cliff``), on the schedule DAG with
the cross-rank delays and the gap model fitted on the lower window (``planner.timing.comm``,
``planner.timing.gaps``), times the jitter factor.  The stable blocks only score it.
"""

from __future__ import annotations

import argparse
import os
import posixpath
import statistics
import sys

from planner.analysis.authors_logs_source import DEV_FOLDER, METHODS, STABLE, kept_path, read_sources, write_csv
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
PREFIX = "260102_"
R_MAX = 0.8


def durations(block) -> dict[str, float]:
    return {e.action: e.dur + TRUNCATION_MS for es in block.ranks.values() for e in es}


def measured_stable(log) -> tuple[float, int]:
    xs = [b.batch_ms for b in log.measured() if STABLE[0] <= b.step <= STABLE[1]]
    if not xs:
        raise PlannerError(f"{log.source}: no measured block of steps {STABLE[0]}-{STABLE[1]}")
    return statistics.fmean(xs), len(xs)


def cliff_durations(log, trace) -> tuple[dict[str, float], dict[str, float], list[int]]:
    """``(plan, with_cliff, stages)``: their planned durations, the same with a cliff stage's ``B`` at a ratio
    below 1 on the straight line to the other stages' floor (``planner.timing.cliff.floor_duration``), and the
    cliff stages the monitoring windows show."""
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
    return plan, pred, sorted(stages)


def predict_run(log, trace, *, cliff: bool) -> dict:
    """This project's prediction of the run's stable batch (module docstring) and its parts; ``cliff``: with the
    lower-bound cliff rule (:func:`cliff_durations`)."""
    dag = build_dag(trace.meta)
    cross = estimate_edge_delays(trace, dag)
    edge_ms, _ = with_gap_costs(trace, dag, cross)
    plan, with_cliff, stages = cliff_durations(log, trace)
    pred = with_cliff if cliff else plan
    jitter = expected_factor(dag, pred, residual_steps(trace), edge_ms)
    return {
        "no_idle_ms": longest_path(dag, pred, cross)[0],
        "predicted_ms": longest_path(dag, pred, edge_ms)[0] * jitter,
        "plan_lp_ms": longest_path(dag, plan)[0],
        "jitter": jitter,
        "cliff": stages,
    }


def stage_b_errors(log, trace) -> dict:
    """The cliff rule on the durations themselves: over a cliff stage's ``B`` actions their plan put at a ratio
    strictly between 0 and 1, the mean of (predicted - measured) in ms, measured being the median over the stable
    blocks, for their planned duration (``plan``) and for the rule's (``cliff``); ``n`` such actions."""
    plan, with_cliff, _ = cliff_durations(log, trace)
    stable = [durations(b) for b in log.measured() if STABLE[0] <= b.step <= STABLE[1]]
    acts = [a for a in plan if with_cliff[a] != plan[a]]
    if not acts:
        return {"n": 0, "plan": None, "cliff": None}
    meas = {a: statistics.median(s[a] for s in stable) for a in acts}
    return {
        "n": len(acts),
        "plan": statistics.fmean(plan[a] - meas[a] for a in acts),
        "cliff": statistics.fmean(with_cliff[a] - meas[a] for a in acts),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("logs", metavar="LOGS_DIR")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    try:
        dev, test = run(args.logs)
        write(dev, test, args.out)
    except PlannerError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    return 0


def _pct(pred: float, meas: float) -> float:
    return round(100 * (pred / meas - 1), 2)


def _opt(x: float | None) -> float | str:
    return "" if x is None else round(x, 1)


def own_plan(trace, *, cliff: bool):
    """``(plan, batch_ms)``: ``planner plan --r-max 0.8`` on the run's trace (the planner's defaults, the cliff rule
    as given), and its predicted batch times its jitter factor."""
    plan = plan_from_trace(trace, R_MAX, **(PLAN_DEFAULTS | {"cliff": cliff}))
    return plan, plan.batch_time_ms["planned"] * plan.extra["jitter"]["planned"]


def score_run(log, trace) -> tuple[dict, object]:
    """One TimelyFreeze-family run: measured stable batch, the prediction without and with the cliff rule, the
    rule's effect on the durations it moves (:func:`stage_b_errors`), this planner's own plan without and with the
    rule (what it would plan, not what ran); and the own plan without the rule."""
    meas, n = measured_stable(log)
    off, on = predict_run(log, trace, cliff=False), predict_run(log, trace, cliff=True)
    b = stage_b_errors(log, trace)
    ours, ours_ms = own_plan(trace, cliff=False)
    _, ours_cliff_ms = own_plan(trace, cliff=True)
    return {
        "authors_ms": log.plan_batch_ms,
        "predicted_ms": round(off["predicted_ms"], 1),
        "measured_ms": round(meas, 1),
        "error_pct": _pct(off["predicted_ms"], meas),
        "authors_error_pct": _pct(log.plan_batch_ms, meas),
        "cliff_ms": round(on["predicted_ms"], 1),
        "cliff_error_pct": _pct(on["predicted_ms"], meas),
        "no_idle_ms": round(off["no_idle_ms"], 1),
        "blocks": n,
        "cliff_stages": " ".join(map(str, on["cliff"])),
        "moved_b": b["n"],
        "moved_b_err_ms": _opt(b["plan"]),
        "moved_b_err_cliff_ms": _opt(b["cliff"]),
        "our_plan_ms": round(ours_ms, 1),
        "our_plan_cliff_ms": round(ours_cliff_ms, 1),
    }, ours


def run(logs: str) -> tuple[list[dict], list[dict]]:
    """``(development rows, held-out rows)`` from the kept logs under ``logs`` (``sources.csv`` there names
    them: ``planner.analysis.authors_logs_source``)."""
    dev = []
    for s in SCHEDULES:
        upper_trace = None
        for m in METHODS:
            log = parse_log(kept_path(logs, f"{DEV_FOLDER}/{PREFIX}{s}_{m}.log"))
            trace = log_to_trace(log)
            row, ours = score_run(log, trace)
            dev.append({"schedule": s, "run": m, **row})
            if upper_trace is None:
                upper_trace = (log, trace, ours)
        log, trace, ours = upper_trace
        nf = parse_log(kept_path(logs, f"{DEV_FOLDER}/{PREFIX}{s}_nofreeze.log"))
        meas, n = measured_stable(nf)
        pred = ours.batch_time_ms["no_freeze"] * ours.extra["jitter"]["no_freeze"]
        up = log.first("upper").batch_ms
        row = dict.fromkeys(dev[-1], "")
        row.update(
            schedule=s,
            run="nofreeze",
            authors_ms=up,
            predicted_ms=round(pred, 1),
            measured_ms=round(meas, 1),
            error_pct=_pct(pred, meas),
            authors_error_pct=_pct(up, meas),
            blocks=n,
        )
        dev.append(row)
    test = []
    for src in read_sources(logs):
        if src["set"] != "test":
            continue
        log = parse_log(kept_path(logs, src["path"]))
        folder, name = posixpath.split(src["path"].removeprefix("logs/"))
        test.append({"folder": folder, "log": name, "schedule": log.schedule, **score_run(log, log_to_trace(log))[0]})
    return dev, test


def _write_csv(path: str, rows: list[dict]) -> None:
    write_csv(path, list(rows[0]), [list(r.values()) for r in rows])


def _write_text(path: str, text: str) -> None:
    def write_md(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    replace_atomically(path, write_md)


def summary(rows: list[dict], what: str) -> list[str]:
    """The lines that score ``rows`` (TimelyFreeze-family runs) without and with the cliff rule."""
    off = [abs(r["error_pct"]) for r in rows]
    on = [abs(r["cliff_error_pct"]) for r in rows]
    changed = [(a, b) for a, b in zip(off, on, strict=True) if a != b]
    moved = [r for r in rows if r["moved_b"]]
    default = {c: " (the default)" if c == PLAN_DEFAULTS["cliff"] else "" for c in (False, True)}
    line = [
        f"{what} ({len(rows)} runs), batch |error|: without the cliff rule{default[False]} median "
        f"{statistics.median(off):.2f} %, max {max(off):.2f} %, within 5 %: {sum(e <= 5 for e in off)}; "
        f"with it{default[True]} "
        f"median {statistics.median(on):.2f} %, max {max(on):.2f} %, within 5 %: {sum(e <= 5 for e in on)}. The rule "
        f"changes {len(changed)} predictions: {sum(b < a for a, b in changed)} better, "
        f"{sum(b > a for a, b in changed)} worse.",
    ]
    if moved:
        line.append(
            f"On the durations it moves ({sum(r['moved_b'] for r in moved)} cliff-stage B actions at partial ratios, "
            f"{len(moved)} runs), mean per-run error against the stable median: their plan "
            f"{statistics.fmean(r['moved_b_err_ms'] for r in moved):+.2f} ms (mean |.| "
            f"{statistics.fmean(abs(r['moved_b_err_ms']) for r in moved):.2f}), the rule "
            f"{statistics.fmean(r['moved_b_err_cliff_ms'] for r in moved):+.2f} ms (mean |.| "
            f"{statistics.fmean(abs(r['moved_b_err_cliff_ms']) for r in moved):.2f})."
        )
    return line


def own_plan_line(rows: list[dict], what: str) -> str:
    """How this planner's own plan's predicted batch compares with the measured batch of their plan, without and
    with the cliff rule (signed: above 0, the planner expects its plan to be slower than theirs ran)."""

    def span(key: str) -> str:
        xs = [100 * (r[key] / r["measured_ms"] - 1) for r in rows]
        return f"median {statistics.median(xs):+.1f} %, {min(xs):+.1f} to {max(xs):+.1f} %"

    return (
        f"{what}: this planner's own plan (r_max {R_MAX}) predicted against the measured batch of theirs: without "
        f"the cliff rule {span('our_plan_ms')}; with it {span('our_plan_cliff_ms')}."
    )


def write(dev: list[dict], test: list[dict], out: str) -> None:
    """``results.md``/``results.csv`` (development runs) and ``heldout.md``/``heldout.csv`` (held-out runs)."""
    os.makedirs(out, exist_ok=True)
    _write_csv(os.path.join(out, "results.csv"), dev)
    tf = [r for r in dev if r["run"] != "nofreeze"]
    auth = [abs(r["authors_error_pct"]) for r in tf]
    lines = [
        "| schedule | run | authors' plan (ms) | predicted (ms) | measured stable (ms) | error | authors' error | "
        "with cliff rule (ms) | its error | no idle (ms) | our own plan (ms) | with cliff rule (ms) | blocks |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in dev:
        ce = "" if r["cliff_error_pct"] == "" else f"{r['cliff_error_pct']:+.1f} %"
        lines.append(
            f"| {r['schedule']} | {r['run']} | {r['authors_ms']} | {r['predicted_ms']} | {r['measured_ms']} | "
            f"{r['error_pct']:+.1f} % | {r['authors_error_pct']:+.1f} % | {r['cliff_ms']} | {ce} | "
            f"{r['no_idle_ms']} | {r['our_plan_ms']} | {r['our_plan_cliff_ms']} | {r['blocks']} |"
        )
    lines += [
        "",
        *summary(tf, "Development runs"),
        own_plan_line(tf, "Development runs"),
        f"The authors' LP on the same runs: median |error| {statistics.median(auth):.2f} %, max {max(auth):.2f} %.",
    ]
    text = "\n".join(lines) + "\n"
    _write_text(os.path.join(out, "results.md"), text)
    print(text)
    _write_csv(os.path.join(out, "heldout.csv"), test)
    lines = [
        "| folder | log | blocks | authors' plan (ms) | predicted (ms) | measured stable (ms) | error | "
        "with cliff rule (ms) | its error | moved B | their B error (ms) | rule's B error (ms) | our own plan (ms) | "
        "with cliff rule (ms) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in test:
        lines.append(
            f"| {r['folder']} | {r['log']} | {r['blocks']} | {r['authors_ms']} | {r['predicted_ms']} | "
            f"{r['measured_ms']} | {r['error_pct']:+.1f} % | {r['cliff_ms']} | {r['cliff_error_pct']:+.1f} % | "
            f"{r['moved_b']} | {r['moved_b_err_ms']} | {r['moved_b_err_cliff_ms']} | {r['our_plan_ms']} | "
            f"{r['our_plan_cliff_ms']} |"
        )
    lines += ["", *summary(test, "Held-out runs"), own_plan_line(test, "Held-out runs"), ""]
    for sched in sorted({r["schedule"] for r in test}):
        rows = [r for r in test if r["schedule"] == sched]
        lines += [summary(rows, f"- {sched}")[0], f"  {own_plan_line(rows, sched)}"]
    text = "\n".join(lines) + "\n"
    _write_text(os.path.join(out, "heldout.md"), text)
    print(text)


if __name__ == "__main__":  # (python -m planner.analysis.authors_logs)
    sys.exit(main())
