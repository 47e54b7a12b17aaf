"""Does the gap model (``planner.timing.gaps``) predict the measured batch better?  Offline, on finished jobs'
dumps (``<job>/dump/timelyfreeze/{trace/, metrics.jsonl, summary.json}``); no torch.

Per job, everything the model uses comes from the monitoring windows (phases ``upper`` and ``lower``), as
the runtime plans: node weights, cross-rank delays (``planner.timing.comm``), gap costs.  The stable phase is
out of sample.  Per job:

* the initial plan, re-solved from the trace as the runtime solved it (``plan_matches``: its planned batch
  equals the runtime's prediction in ``metrics.jsonl``);
* **stable**: the median span (``planner.timing.spans``) of the stable steps that ran under that plan (before any
  re-plan, ``replans == 0`` in ``metrics.jsonl``) against the plan's prediction: *old* (the plan's
  ``planned``) and *new* (the same ratios' batch time with the gap costs on the rank-order edges);
* **no-freeze**: the median span of the upper-bound window against the no-freeze batch time, old and new
  (in sample: the upper window is part of the fit), and *new, lower only* (gap costs fitted on the
  lower-bound window alone: out of sample for the upper window);
* **replay**: per stable step (every stable step), the span against the DAG's longest path over that step's
  measured action times, old (cross-rank delays) and new (plus the gap costs): what each model misses
  between the actions when it knows the actions' times; the median over the steps.
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

from planner.plan import plan_from_trace
from planner.schedule.dag import build_dag, longest_path
from planner.timing.comm import estimate_edge_delays
from planner.timing.estimate import ESTIMATORS
from planner.timing.gaps import fit_gap_model, merge_delays
from planner.timing.spans import step_spans
from planner.trace.archive import TRACE_NAME, find_trace
from planner.trace.load import load_trace

__all__ = ["evaluate_job", "job_dirs", "summarize_rows", "write_outputs"]

COLUMNS = (
    "job",
    "schedule",
    "method",
    "plan_matches",
    "stable_steps",
    "stable_ms",
    "planned_old_ms",
    "planned_new_ms",
    "stable_err_old",
    "stable_err_new",
    "upper_ms",
    "no_freeze_old_ms",
    "no_freeze_new_ms",
    "upper_err_old",
    "upper_err_new",
    "upper_err_new_lower_only",
    "upper_action_drift",
    "replay_err_old",
    "replay_err_new",
    "action_drift",
    "gap_plan_gain",
    "gap_edges",
    "gap_ms_per_rank",
)


def job_dirs(root: Path, pattern: str = "*timelyfreeze*") -> list[Path]:
    """The job folders under ``root`` matching ``pattern`` that hold a trace (a folder or its trace.tar.gz)."""
    return sorted(p for p in Path(root).glob(pattern) if find_trace(p / "dump/timelyfreeze" / TRACE_NAME))


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def evaluate_job(job: Path) -> dict:
    """One row of :data:`COLUMNS` for the job folder ``job`` (module docstring)."""
    out = job / "dump/timelyfreeze"
    summary = json.loads((out / "summary.json").read_text())
    metrics = [m for m in _read_jsonl(out / "metrics.jsonl") if "phase" in m]
    trace = load_trace(out / TRACE_NAME)
    dag = build_dag(trace.meta)
    cross = estimate_edge_delays(trace, dag)
    # the estimator the run planned with (plans written before the field existed used median)
    plan_file = out / "plan.json"
    estimator = json.loads(plan_file.read_text()).get("estimator", "median") if plan_file.is_file() else "median"
    if estimator not in ESTIMATORS:  # an online re-plan writes "rescaled"; its first plan used the default then
        estimator = "median"
    plan = plan_from_trace(trace, summary["knob"]["value"], estimator=estimator, edge_ms=cross, dag=dag)
    gaps = fit_gap_model(trace, dag=dag, cross=cross).edge_delays(dag)
    gaps_lo = fit_gap_model(trace, dag=dag, cross=cross, phases=("lower",)).edge_delays(dag)
    new = merge_delays(cross, gaps)
    durations = {a: p.duration for a, p in plan.actions.items()}
    w_max = {a: p.w_max for a, p in plan.actions.items()}
    planned_old = plan.batch_time_ms["planned"]
    planned_new = longest_path(dag, durations, new)[0]
    gap_plan = plan_from_trace(trace, summary["knob"]["value"], estimator=estimator, edge_ms=cross, dag=dag, gaps=True)
    nf_old = plan.batch_time_ms["no_freeze"]
    nf_new = longest_path(dag, w_max, new)[0]
    nf_lo = longest_path(dag, w_max, merge_delays(cross, gaps_lo))[0]

    spans = step_spans(trace)
    first = [m for m in metrics if m["phase"] == "stable" and m.get("replans", 0) == 0]
    in_force = {m["step"] for m in first}
    predicted = first[0]["predicted_batch_ms"] if first else float("nan")
    stable = [spans[k] for k in sorted(in_force) if k in spans]
    upper = [ms for k, ms in spans.items() if _phase(metrics, k) == "upper"]
    stable_ms = statistics.median(stable) if stable else float("nan")
    upper_ms = statistics.median(upper) if upper else float("nan")
    replay_old, replay_new, _ = _replay(
        trace, spans, {m["step"] for m in metrics if m["phase"] == "stable"}, dag, cross, new
    )
    upper_steps = {m["step"] for m in metrics if m["phase"] == "upper"}
    upper_drift = _replay(trace, spans, upper_steps, dag, cross, new)[2] / nf_new - 1
    drift = _replay(trace, spans, in_force, dag, cross, new)[2] / planned_new - 1
    per_rank = {r: sum(x for (p, _), x in gaps.items() if p in set(o)) for r, o in trace.meta.rank_orders.items()}
    return {
        "job": job.name,
        "schedule": trace.meta.schedule,
        "method": summary["method"],
        "plan_matches": abs(predicted - planned_old) <= 1e-6 * planned_old,
        "stable_steps": len(stable),
        "stable_ms": stable_ms,
        "planned_old_ms": planned_old,
        "planned_new_ms": planned_new,
        "stable_err_old": stable_ms / planned_old - 1,
        "stable_err_new": stable_ms / planned_new - 1,
        "upper_ms": upper_ms,
        "no_freeze_old_ms": nf_old,
        "no_freeze_new_ms": nf_new,
        "upper_err_old": upper_ms / nf_old - 1,
        "upper_err_new": upper_ms / nf_new - 1,
        "upper_err_new_lower_only": upper_ms / nf_lo - 1,
        "upper_action_drift": upper_drift,
        "replay_err_old": replay_old,
        "replay_err_new": replay_new,
        "action_drift": drift,
        "gap_plan_gain": planned_new / gap_plan.batch_time_ms["planned"] - 1,
        "gap_edges": len(gaps),
        "gap_ms_per_rank": " ".join(f"{r}:{x:.2f}" for r, x in sorted(per_rank.items())),
    }


def _phase(metrics: list[dict], step: int) -> str | None:
    for m in metrics:
        if m["step"] == step:
            return m["phase"]
    return None


def _replay(trace, spans, steps, dag, cross, new) -> tuple[float, float, float]:
    """Over ``steps``: medians of span / longest path of the step's measured times - 1 with the old and the
    new delays, and the median longest path with the new ones (ms)."""
    ms: dict[int, dict[str, float]] = {}
    for rec in trace.records:
        if rec.replica == 0 and rec.step in steps:
            ms.setdefault(rec.step, {})[rec.action] = rec.ms
    old, nw, paths = [], [], []
    for k, durations in ms.items():
        if k not in spans or len(durations) != len(trace.meta.all_actions()):
            continue
        old.append(spans[k] / longest_path(dag, durations, cross)[0] - 1)
        paths.append(longest_path(dag, durations, new)[0])
        nw.append(spans[k] / paths[-1] - 1)
    if not old:
        return float("nan"), float("nan"), float("nan")
    return statistics.median(old), statistics.median(nw), statistics.median(paths)


MIN_STEPS = 10
"""Runs with fewer stable steps under the initial plan are left out of the second summary table."""

ERRORS = {
    "stable_err_old": "stable old",
    "stable_err_new": "stable new",
    "upper_err_old": "upper old",
    "upper_err_new": "upper new",
    "upper_err_new_lower_only": "upper new, lower only",
    "upper_action_drift": "upper action drift",
    "replay_err_old": "replay old",
    "replay_err_new": "replay new",
    "action_drift": "action drift",
    "gap_plan_gain": "gap plan gain",
}
"""The error columns of :data:`COLUMNS` the summary tables show, with their headers."""


def summarize_rows(rows: list[dict]) -> list[dict]:
    """Per schedule (and ``all``): per error column the median, min and max over the runs (fractions)."""
    out = []
    for schedule in sorted({r["schedule"] for r in rows}) + ["all"]:
        mine = [r for r in rows if schedule in ("all", r["schedule"])]
        row: dict = {"schedule": schedule, "runs": len(mine)}
        for c in ERRORS:
            vals = [r[c] for r in mine if r[c] == r[c]]
            row[c] = (statistics.median(vals), min(vals), max(vals)) if vals else None
        out.append(row)
    return out


def _pct(t: tuple[float, float, float] | None) -> str:
    return "-" if t is None else f"{100 * t[0]:+.1f} [{100 * t[1]:+.1f}, {100 * t[2]:+.1f}]"


def _error_table(rows: list[dict]) -> list[str]:
    """The Markdown table of :func:`summarize_rows` over ``rows``."""
    lines = [
        "| schedule | runs | " + " | ".join(ERRORS.values()) + " |",
        "|---|---|" + "---|" * len(ERRORS),
    ]
    for s in summarize_rows(rows):
        lines.append(f"| {s['schedule']} | {s['runs']} | " + " | ".join(_pct(s[c]) for c in ERRORS) + " |")
    return lines


def write_outputs(rows: list[dict], md: Path, command: str, table_md: str = "") -> None:
    """``md`` (the summary table, then ``table_md``) and ``md`` with suffix ``.csv`` (one row per job)."""
    with md.with_suffix(".csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    lines = [
        "# Gap model: measured batch vs predicted, old model vs gap model",
        "",
        "```",
        command,
        "```",
        "",
        "Median [min, max] over runs of measured / predicted - 1, in %. Fit: upper + lower windows only;",
        "`stable`: out of sample (steps under the initial plan); `upper`: in sample; `upper, lower only`:",
        "gap costs fitted on the lower window alone; `replay`: every stable step against the DAG over its own",
        "measured action times; `upper action drift`: the DAG with the gap model over each upper-window step's",
        "own action times against the no-freeze prediction (from the medians of those times), median over the",
        "steps; `action drift`: the DAG with the gap model over the measured action times of the",
        "steps under the initial plan against that plan's prediction with the gap model (the actions ran",
        "slower or faster than the monitoring windows said); `gap plan gain`: the initial plan's batch time",
        "under the gap model / that of the plan the LP makes with the gap model - 1 (a prediction: no run",
        "measured those plans). Per-job rows: the `.csv` beside this file.",
        "",
    ]
    long = [r for r in rows if r["stable_steps"] >= MIN_STEPS]
    lines += _error_table(rows)
    lines += [
        "",
        f"The same over the {len(long)} runs with at least {MIN_STEPS} stable steps under the initial plan (the",
        "others re-planned within a few steps, because their machine's speed moved: their `action drift`):",
        "",
        *_error_table(long),
    ]
    md.write_text("\n".join(lines) + "\n" + table_md)
