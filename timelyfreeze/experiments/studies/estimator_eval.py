"""Which node-weight estimator predicts better (``median`` or ``pooled``, ``planner.timing.estimate``), out of sample.

For every recorded run with a plan, each estimator turns the run's monitoring windows (``upper``, ``lower``)
into bounds, exactly as the runtime did before its plan; the stable phase, which came later and ran with the
realised freeze ratios, is what they must predict:

- **action error**: per stable record of a freezable action (B, W, a DualPipeV pair), measured ms against the
  linear model ``w_max - r * (w_max - w_min)`` at the record's realised ratio ``r``, with the machine's speed
  taken out (the F factor of ``planner.timing.spans.f_factor``: stable F over upper F); the run's figure is the median
  of ``|measured / (f * predicted) - 1|``;
- **path error**: per stable step, the DAG's longest path over the predicted durations (times ``f``) against
  the longest path over the step's measured durations (like with like: both ignore the time between actions);
  the run's figure is the median of ``|predicted / measured - 1|`` over its stable steps.

Per estimator the median and range over runs, and the paired difference pooled minus median per run with its
95 % interval (negative: pooled predicts better). Both estimators see the same records; the stable phase ran
the plan of one of them (the run's ``estimator``), which does not favour either's predictions of its times.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

from planner.errors import PlannerError
from planner.schedule.actions import FREEZABLE_KINDS, parse_action
from planner.schedule.dag import build_dag, longest_path
from planner.timing.estimate import ESTIMATORS, estimate_weights
from planner.timing.spans import f_factor
from planner.trace.archive import TRACE_NAME, find_trace
from planner.trace.load import NodeWeights, Trace, load_trace
from timelyfreeze.experiments.stats import mean_ci
from timelyfreeze.experiments.sweep.report import write_csv

RUN_COLUMNS = ["run", "schedule", "f_factor", "stable_steps"] + [
    f"{q}_{e}" for q in ("action_err", "path_err") for e in ESTIMATORS
]


def _predicted(w: NodeWeights, action: str, ratio: float) -> float:
    hi = w.w_max[action]
    return hi - ratio * (hi - w.w_min.get(action, hi))


def _stable_steps(trace: Trace) -> dict[int, list]:
    steps: dict[int, list] = {}
    for rec in trace.records:
        if rec.replica == 0 and rec.phase == "stable":
            steps.setdefault(rec.step, []).append(rec)
    n = len(trace.meta.all_actions())
    return {k: v for k, v in steps.items() if len(v) == n}  # whole steps only


def evaluate_trace(trace: Trace) -> dict[str, Any] | None:
    """The run's figures (``RUN_COLUMNS`` less run/schedule), or None without stable steps or F records."""
    f = f_factor(trace, "stable", "upper")
    steps = _stable_steps(trace)
    if f is None or not steps:
        return None
    dag = build_dag(trace.meta)
    row: dict[str, Any] = {"f_factor": f, "stable_steps": len(steps)}
    measured_paths = {k: longest_path(dag, {r.action: r.ms for r in recs})[0] for k, recs in steps.items()}
    for est in ESTIMATORS:
        w = estimate_weights(trace, est)
        action_errs, path_errs = [], []
        for k, recs in steps.items():
            predicted = {r.action: f * _predicted(w, r.action, r.freeze_ratio) for r in recs}
            action_errs += [
                abs(r.ms / predicted[r.action] - 1) for r in recs if parse_action(r.action).kind in FREEZABLE_KINDS
            ]
            path_errs.append(abs(longest_path(dag, predicted)[0] / measured_paths[k] - 1))
        row[f"action_err_{est}"] = statistics.median(action_errs) if action_errs else None
        row[f"path_err_{est}"] = statistics.median(path_errs)
    return row


def evaluate_runs(folders: list[Path]) -> list[dict[str, Any]]:
    """One row per ``<job>/dump/timelyfreeze/trace`` (or its ``trace.tar.gz``) under the folders that has a plan and
    a stable phase."""
    rows = []
    for folder in folders:
        for out in sorted(Path(folder).glob("jobs/*/dump/timelyfreeze")):
            trace_path = find_trace(out / TRACE_NAME)
            if trace_path is None or not (out / "plan.json").is_file():
                continue
            try:
                trace = load_trace(trace_path)
            except PlannerError:
                continue
            row = evaluate_trace(trace)
            if row is not None:
                run = out.parents[1].name
                rows.append({"run": f"{Path(folder).name}/{run}", "schedule": trace.meta.schedule, **row})
    return rows


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per schedule and over all runs: each estimator's median [min, max] error and the paired difference."""
    out = []
    for schedule in sorted({r["schedule"] for r in rows}) + ["all"]:
        rs = [r for r in rows if schedule in ("all", r["schedule"])]
        s: dict[str, Any] = {"schedule": schedule, "runs": len(rs)}
        for q in ("action_err", "path_err"):
            for e in ESTIMATORS:
                vals = [r[f"{q}_{e}"] for r in rs if r[f"{q}_{e}"] is not None]
                s[f"{q}_{e}"] = (statistics.median(vals), min(vals), max(vals)) if vals else None
            diffs = [
                r[f"{q}_pooled"] - r[f"{q}_median"] for r in rs if None not in (r[f"{q}_pooled"], r[f"{q}_median"])
            ]
            s[f"{q}_diff"] = mean_ci(diffs)[:3]
            s[f"{q}_pooled_better"] = sum(d < 0 for d in diffs)
        out.append(s)
    return out


def _pct(t: tuple | None) -> str:
    if t is None or t[0] is None:
        return "n/a"
    if len(t) == 3 and t[1] is not None:
        return f"{100 * t[0]:.2f} % [{100 * t[1]:.2f}, {100 * t[2]:.2f}]"
    return f"{100 * t[0]:.2f} %"


def markdown(summary: list[dict[str, Any]], command: str) -> str:
    lines = [
        "# Estimators: median against pooled, out of sample",
        "",
        f"Made by `{command}` from committed traces (no new runs). What is measured: "
        "`timelyfreeze/experiments/studies/estimator_eval.py`'s docstring. Errors are medians [min, max] over runs; "
        "the difference pooled - median is a mean over runs with its 95 % interval (negative: pooled better).",
        "",
        "| schedule | runs | action error, median | action error, pooled | pooled - median | pooled better in "
        "| path error, median | path error, pooled | pooled - median | pooled better in |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        lines.append(
            f"| {s['schedule']} | {s['runs']} | {_pct(s['action_err_median'])} | {_pct(s['action_err_pooled'])} | "
            f"{_pct(s['action_err_diff'])} | {s['action_err_pooled_better']}/{s['runs']} | "
            f"{_pct(s['path_err_median'])} | {_pct(s['path_err_pooled'])} | {_pct(s['path_err_diff'])} | "
            f"{s['path_err_pooled_better']}/{s['runs']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:

    ap = argparse.ArgumentParser(prog="bench_estimators.py", description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="*", default=["docs/results/comparison", "docs/results/rmax"])
    ap.add_argument("--out", default="docs/results/runtime")
    args = ap.parse_args(argv)
    rows = evaluate_runs([Path(f) for f in args.folders])
    if not rows:
        print("error: no run with a plan and a stable phase under " + ", ".join(args.folders), file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "estimators.csv", rows, RUN_COLUMNS)
    command = "python scripts/bench_estimators.py " + shlex.join(args.folders)
    (out / "estimators.md").write_text(markdown(summarize(rows), command))
    print(f"{len(rows)} runs -> {out / 'estimators.md'}")
    return 0
