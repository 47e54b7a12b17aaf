"""The report of a sweep folder: tables, plots and warnings under ``<out>/report/``.

- ``results.csv``: one row per job (``results.RESULT_COLUMNS``: ``val_acc``, the held-out accuracy beside the
  validation loss, where runs scored it: ``[instruct] questions``); jobs without a summary.json (failed,
  interrupted) get what their metrics.jsonl holds.
- ``configs.csv``: one row per (schedule, method, knob value), means over the ok seeds (``val_acc`` too), with the
  ``pareto`` flag (not dominated in lower loss and higher throughput within its schedule).
- ``tta.csv``: each job against the no-freezing job of the same schedule and seed: throughput ratio,
  validation-loss change, time to accuracy (``tta``).
- ``cells.csv``: per (schedule, method, knob value), the mean and 95 % interval over seeds of those paired
  quantities, and the verdicts they resolve (``stats``).
- ``trends.csv``: per (schedule, method with a knob), the slope of each paired quantity over the knob, every seed
  pooled, with its 95 % interval (``stats.knob_trends``).
- ``report.md``: the tables, the plots and every warning.
- ``pareto.png`` (kappa vs validation-loss change, with intervals), ``throughput_vs_rmax.png`` (speed-up and
  loss change over r_max beside the planner's prediction), ``tta.png``, ``timeline_<schedule>.png`` (``plots``).
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

from timelyfreeze.experiments.stats import (
    CELL_COLUMNS,
    QUANTITIES,
    TREND_COLUMNS,
    cell_stats,
    fmt_ci,
    knob_trends,
    mean_ci,
    verdict,
)
from timelyfreeze.experiments.sweep.grid import NO_FREEZING
from timelyfreeze.experiments.sweep.pareto import CONFIG_COLUMNS, aggregate_configs, loss_key
from timelyfreeze.experiments.sweep.plots import (
    plot_pareto,
    plot_rmax,
    plot_tta,
    plot_tta_curves,
    rmax_data,
    timelines,
    tta_curve_bands,
    wall_curve,
)
from timelyfreeze.experiments.sweep.predictions import Planner
from timelyfreeze.experiments.sweep.results import RESULT_COLUMNS, config_label, load_rows
from timelyfreeze.experiments.sweep.tta import (
    FLATTENED_SHARE,
    FLATTENING_COLUMNS,
    TTA_COLUMNS,
    flattening,
    tta_rows,
    tta_targets,
)


def _cell(col: str, v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else ""
    if isinstance(v, float):
        if col.startswith("tokens_per_s") or "_ms" in col:
            return f"{v:.1f}"
        if col in ("knob_value", "target_step", "steps_nf", "steps_method"):
            return format(v, "g") if col == "knob_value" else f"{v:.1f}"
        return f"{v:.4f}" if "loss" in col or col == "dval" else f"{v:.3f}"
    return str(v)


def write_csv(path: Path, rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns))
        w.writeheader()
        for r in rows:
            w.writerow({c: "" if r.get(c) is None else r.get(c) for c in columns})


def md_table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(c, r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def md_cells(cells: list[dict[str, Any]]) -> str:
    """The cells table: each quantity as ``mean [lo, hi]``."""
    cols = [
        "schedule",
        "method",
        "knob",
        "seeds",
        "kappa",
        "in-run speedup",
        "predicted",
        "dval",
        "reached",
        "steps ratio",
        "TTA ratio",
        "TTA ratio, censored at bound",
        "wall-clock difference (s)",
        "throughput",
        "accuracy",
        "time to accuracy",
    ]
    digits = {"dval": 4}
    out = []
    for c in cells:
        q = {k: fmt_ci(c[f"{k}_mean"], c[f"{k}_lo"], c[f"{k}_hi"], digits.get(k, 3)) for k in QUANTITIES}
        out.append(
            {
                "schedule": c["schedule"],
                "method": c["method"],
                "knob": "" if c["knob_name"] is None else f"{c['knob_name']}={_cell('knob_value', c['knob_value'])}",
                "seeds": str(c["seeds"]),
                "kappa": q["kappa"],
                "in-run speedup": q["speedup_in_run"],
                "predicted": q["predicted_speedup"],
                "dval": q["dval"],
                "reached": f"{c['reached']}/{c['targets']}",
                "steps ratio": q["steps_ratio"],
                "TTA ratio": q["tta_ratio"],
                "TTA ratio, censored at bound": (
                    fmt_ci(c["tta_ratio_bound_mean"], None, None) if c["reached"] < c["targets"] else ""
                ),
                "wall-clock difference (s)": fmt_ci(c["wall_s_diff_mean"], c["wall_s_diff_lo"], c["wall_s_diff_hi"], 1),
                "throughput": c["throughput"] or "",
                "accuracy": c["accuracy"] or "",
                "time to accuracy": c["time_to_accuracy"] or "",
            }
        )
    return md_table(out, cols)


def _plots(rows, cells, planner, rep: Path, warnings: list[str], tta_step: float | None) -> list[tuple[str, str]]:
    """Draw the report's plots and CSV of the planner sweep; (title, file name) of each plot drawn."""
    plots = []
    if plot_pareto(cells, rep / "pareto.png"):
        plots.append(("Validation-loss change vs throughput ratio (mean, 95 % interval)", "pareto.png"))
    rmax = rmax_data(rows, cells, planner, warnings)
    for stale in rep.glob("planner_sweep_*.csv"):  # one file per job, as reports before planner_sweep.csv wrote
        stale.unlink()
    planner_rows = [row for d in rmax.values() for row in d["planner_rows"]]
    if planner_rows:
        write_csv(rep / "planner_sweep.csv", planner_rows, list(dict.fromkeys(k for r in planner_rows for k in r)))
    if plot_rmax(rmax, rep / "throughput_vs_rmax.png"):
        plots.append(
            (
                "Speed-up and validation-loss change over r_max, beside the planner's prediction",
                "throughput_vs_rmax.png",
            )
        )
    if plot_tta(cells, rep / "tta.png"):
        plots.append(("Time to accuracy", "tta.png"))
    if plot_tta_curves(tta_curve_bands(rows), tta_targets(rows, tta_step), rep / "tta_curves.png"):
        plots.append(("Validation loss over training wall-clock (mean over seeds, 95 % band)", "tta_curves.png"))
    for png, job_id in timelines(rows, planner, rep, warnings):
        plots.append((f"Timeline of {job_id}", png.name))
    return plots


def _markdown(
    out: Path, rows, counts, cells, trends, tta, flat, configs, labels: tuple[str, str], plots, warnings
) -> list[str]:
    """The lines of ``report.md``."""
    loss_label, thr_label = labels
    md = [
        f"# Sweep report: {out.resolve().name}",
        "",
        f"{len(rows)} jobs: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())),
        "",
        "## Cells: mean and 95 % interval over seeds",
        "",
        "Each quantity is paired with the no-freezing run of the same schedule and seed: kappa = stable "
        "throughput ratio; in-run = the job's own unfrozen / steady batch time; predicted = its plan's predicted "
        "speed-up (no-freeze / planned batch time); dval = validation loss minus "
        "the no-freezing one at the same step; TTA = wall-clock training time to the no-freezing final "
        "validation loss, over the no-freezing run's (mean over the seeds that reached it). Intervals: "
        "Student t over seeds. A verdict is given only where the interval excludes no change.",
        "",
        md_cells(cells),
        "",
        "## Trends over the knob (every seed pooled)",
        "",
        "Least-squares slope of each paired quantity over the method's knob (e.g. per +1 of r_max), with its 95 % "
        "interval; a verdict only where the interval excludes 0.",
        "",
        md_table(
            [{**t, "slope": fmt_ci(t["slope"], t["slope_lo"], t["slope_hi"], 4)} for t in trends],
            ["schedule", "method", "quantity", "runs", "slope", "verdict"],
        ),
        "",
        "## Flattening of the no-freezing curve",
        "",
        "Its fall over the last quarter of its steps against its fall over the whole run; flattened below "
        f"{FLATTENED_SHARE:.0%} ([flattening.csv](flattening.csv)).",
        "",
        md_table(flat, FLATTENING_COLUMNS),
        "",
        "## Paired runs (time to accuracy)",
        "",
        md_table(tta, TTA_COLUMNS),
        "",
        "## Jobs",
        "",
        md_table(rows, RESULT_COLUMNS),
        "",
        f"## Configurations (mean over ok seeds; loss = {loss_label}; tokens_per_s = {thr_label})",
        "",
        md_table(configs, CONFIG_COLUMNS),
        "",
    ]
    if plots:
        md += ["## Plots", ""] + [f"### {title}\n\n![{title}]({name})\n" for title, name in plots]
    if warnings:
        md += ["## Warnings", ""] + [f"- {w}" for w in warnings] + [""]
    return md


SENSITIVITY_NAME = "tta_sensitivity.md"


def sensitivity_md(tta: list[dict[str, Any]]) -> str:
    """Per freezing cell, the time-to-accuracy ratio by the protocol's rule beside the same runs with the no-freezing
    run timed to the target step itself (``tta.tta_ratio_nf_end``): mean [95 % Student-t interval] over the seeds
    that reached the target, and the verdict of each reading."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for t in tta:
        if t["method"] != NO_FREEZING and t.get("tta_ratio") is not None:
            groups[(t["schedule"], t["method"], t["knob_name"], _cell("knob_value", t["knob_value"]))].append(t)
    rows = []
    for (schedule, method, kname, kval), ts in sorted(groups.items(), key=lambda kv: [str(k) for k in kv[0]]):
        row = {"schedule": schedule, "method": method, "knob": "" if kname is None else f"{kname}={kval}"}
        row["runs"] = str(len(ts))
        row["target step"] = ", ".join(sorted({f"{t['target_step']:g}" for t in ts}))
        for key, col in (
            ("tta_ratio", "protocol's rule"),
            ("tta_ratio_nf_end", "no freezing timed to the target step"),
        ):
            m, lo, hi, _ = mean_ci(t.get(key) for t in ts)
            row[col] = fmt_ci(m, lo, hi)
            row[col + ": verdict"] = verdict(lo, hi, 1.0, "later", "sooner") or ""
        rows.append(row)
    cols = ["schedule", "method", "knob", "runs", "target step"]
    cols += [c + s for c in ("protocol's rule", "no freezing timed to the target step") for s in ("", ": verdict")]
    return "\n".join(
        [
            "Time-to-accuracy ratio, two readings: by the protocol's rule (the no-freezing run timed to the step from",
            "which its curve stays at or below its target) and with the no-freezing run timed to the target step",
            "itself. Mean [95 % Student-t interval] over the runs that reached the target.",
            "",
            md_table(rows, cols),
            "",
        ]
    )


def build_report(
    out: str | Path,
    tta_step: float | None = None,
    which: str = "stable",
    planner: Planner | None = None,
    print_fn=print,
) -> dict[str, Any]:
    out = Path(out)
    rep = out / "report"
    rep.mkdir(parents=True, exist_ok=True)
    rows = load_rows(out)
    warnings: list[str] = []
    lkey = loss_key(rows)
    loss_label = "validation loss" if lkey == "val_loss" else "final training loss (no validation)"
    thr_label = f"throughput, {'stable phase' if which == 'stable' else 'whole run'} (tokens/s)"
    configs = aggregate_configs(rows, which, lkey)
    tta = tta_rows(rows, tta_step)
    cells = cell_stats(tta)
    trends = knob_trends(tta)
    for c in configs:
        if c["pareto"] is None:
            warnings.append(
                f"{c['schedule']} {config_label(c['method'], c['knob_name'], c['knob_value'])}: "
                f"no {which} throughput or loss, left out of the Pareto front"
            )
    for t in tta:
        if t["note"] and t["method"] != NO_FREEZING:
            warnings.append(f"{t['job_id']}: {t['note']}")
    write_csv(rep / "results.csv", rows, RESULT_COLUMNS)
    write_csv(rep / "configs.csv", configs, CONFIG_COLUMNS)
    write_csv(rep / "tta.csv", tta, TTA_COLUMNS)
    (rep / SENSITIVITY_NAME).write_text(sensitivity_md(tta))
    flat = flattening(rows)
    write_csv(rep / "flattening.csv", flat, FLATTENING_COLUMNS)
    for r in rows:
        dropped = len(r.get("_val_curve") or []) - len(wall_curve(r))
        if r["status"] == "ok" and dropped:
            warnings.append(f"{r['job_id']}: {dropped} validation point(s) without step times, left out of tta_curves")
    write_csv(rep / "cells.csv", cells, CELL_COLUMNS)
    write_csv(rep / "trends.csv", trends, TREND_COLUMNS)
    plots = _plots(rows, cells, planner, rep, warnings, tta_step)
    counts = defaultdict(int)
    for r in rows:
        counts[r["status"]] += 1
    md = _markdown(out, rows, counts, cells, trends, tta, flat, configs, (loss_label, thr_label), plots, warnings)
    (rep / "report.md").write_text("\n".join(md))
    for w in warnings:
        print_fn(f"report: warning: {w}")
    print_fn(f"report: {len(rows)} jobs -> {rep / 'report.md'} ({len(plots)} plots)")
    return {
        "rows": rows,
        "configs": configs,
        "tta": tta,
        "cells": cells,
        "trends": trends,
        "plots": plots,
        "warnings": warnings,
        "dir": rep,
    }
