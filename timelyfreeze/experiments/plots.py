"""The report's matplotlib figures: loss vs throughput with the Pareto front, measured vs predicted
throughput over r_max, time to accuracy, and one timeline per schedule.

Every ``plot_*`` returns whether it drew anything; a figure with no data is skipped, not an error.
"""

from __future__ import annotations

import math
import shutil
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from planner.errors import PlannerError
from timelyfreeze.config import METHODS, PLANNED_METHODS
from timelyfreeze.experiments.grid import NO_FREEZING
from timelyfreeze.experiments.predictions import Planner
from timelyfreeze.experiments.results import config_label, fmt_knob, num

PLAIN_TIMELYFREEZE = "timelyfreeze"
"""The planned method whose run a schedule's timeline prefers (then any other planned method)."""

# fixed colour/marker per method (in timelyfreeze.config.METHODS order) so every plot of a report agrees
_COLOURS = ("#444444", "#d62728", "#ff7f0e", "#e377c2", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#17becf",
            "#bcbd22", "#aec7e8")
_MARKERS = ("s", "o", "D", "P", "^", "v", "<", ">", "X", "h", "p")
METHOD_STYLE: dict[str, tuple[str, str]] = dict(zip(METHODS, zip(_COLOURS, _MARKERS)))


def style(method: str) -> tuple[str, str]:
    return METHOD_STYLE.get(method, ("#7f7f7f", "*"))


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _panels(n: int, width: float = 6.0, height: float = 4.6):
    plt = _plt()
    cols = min(n, 2)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return plt, fig, list(axes.flat[:n])


def plot_pareto(configs: list[dict[str, Any]], out_png: Path, loss_label: str, thr_label: str) -> bool:
    schedules = sorted({c["schedule"] for c in configs if c["pareto"] is not None})
    if not schedules:
        return False
    plt, fig, axes = _panels(len(schedules))
    for ax, schedule in zip(axes, schedules):
        cs = [c for c in configs if c["schedule"] == schedule and c["pareto"] is not None]
        for method in sorted({c["method"] for c in cs}):
            color, marker = style(method)
            mc = [c for c in cs if c["method"] == method]
            ax.scatter([c["tokens_per_s"] for c in mc], [c["loss"] for c in mc], color=color, marker=marker,
                       s=60, label=method, zorder=3, edgecolors="black", linewidths=0.5)
            for c in mc:
                if c["knob_name"] is not None:
                    ax.annotate(fmt_knob(c["knob_value"]), (c["tokens_per_s"], c["loss"]), fontsize=7,
                                xytext=(4, 4), textcoords="offset points", color=color)
        front = sorted((c for c in cs if c["pareto"]), key=lambda c: c["tokens_per_s"])
        ax.plot([c["tokens_per_s"] for c in front], [c["loss"] for c in front], "--", color="black",
                lw=1, zorder=2, label="Pareto frontier")
        ax.scatter([c["tokens_per_s"] for c in front], [c["loss"] for c in front], s=180, facecolors="none",
                   edgecolors="black", linewidths=1.2, zorder=4)
        ax.set_title(f"{schedule}: {loss_label} vs throughput (better: down-right)")
        ax.set_xlabel(thr_label)
        ax.set_ylabel(loss_label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return True


def rmax_data(rows: list[dict[str, Any]], planner: Planner | None, work: Path,
              warnings: list[str]) -> dict[str, dict[str, Any]]:
    """Per schedule: measured TimelyFreeze-family points, the no-freezing throughput, the planner's
    predicted speedup curves (one per trace) and each job's own plan speedup."""
    fam = [r for r in rows if r["status"] == "ok" and r["method"] in PLANNED_METHODS
           and r["tokens_per_s_stable"] is not None]
    grid_r = sorted({r["knob_value"] for r in fam})
    r_values = sorted({round(i / 10, 10) for i in range(11)} | set(grid_r))
    data: dict[str, dict[str, Any]] = {}
    for schedule in sorted({r["schedule"] for r in fam}):
        nf = [r["tokens_per_s_stable"] for r in rows if r["schedule"] == schedule and r["method"] == NO_FREEZING
              and r["status"] == "ok" and r["tokens_per_s_stable"] is not None]
        d = {"points": [r for r in fam if r["schedule"] == schedule],
             "nf_tps": statistics.fmean(nf) if nf else None, "curves": [], "plan_points": []}
        if d["nf_tps"] is None:
            warnings.append(f"{schedule}: no ok no-freezing run, so no predicted throughput is drawn")
        for r in d["points"]:
            p = r["_predicted"]
            if num(p.get("no_freeze")) and num(p.get("planned")):
                d["plan_points"].append((r["knob_value"], p["no_freeze"] / p["planned"], r["method"]))
            if planner is None or d["nf_tps"] is None:
                continue
            if r["_trace"] is None:
                warnings.append(f"{r['job_id']}: no trace, no planner prediction")
                continue
            try:
                curve = planner.sweep(r["_trace"], r_values, work / f"planner_sweep_{r['job_id']}.csv")
                d["curves"].append(sorted((c["r_max"], c["speedup"]) for c in curve))
            except (PlannerError, OSError) as e:
                warnings.append(f"{r['job_id']}: planner sweep failed: {e}")
        data[schedule] = d
    return data


def plot_rmax(data: dict[str, dict[str, Any]], out_png: Path, thr_label: str) -> bool:
    if not data:
        return False
    import numpy as np

    plt, fig, axes = _panels(len(data))
    for ax, (schedule, d) in zip(axes, data.items()):
        nf = d["nf_tps"]
        if nf is not None:
            ax.axhline(nf, color=style(NO_FREEZING)[0], ls=":", lw=1.2, label="no freezing (measured)")
        if nf is not None and d["curves"]:
            xs = sorted({x for c in d["curves"] for x, _ in c})
            ys = np.array([[np.interp(x, [p[0] for p in c], [p[1] for p in c]) for x in xs] for c in d["curves"]]) * nf
            ax.plot(xs, ys.mean(axis=0), color="black", lw=1.5,
                    label=f"planner prediction (mean of {len(d['curves'])} trace{'s' if len(d['curves']) > 1 else ''})")
            if len(d["curves"]) > 1:
                ax.fill_between(xs, ys.min(axis=0), ys.max(axis=0), color="black", alpha=0.12,
                                label="prediction range over traces")
        for method in [m for m in PLANNED_METHODS if any(r["method"] == m for r in d["points"])]:
            color, marker = style(method)
            pts = [r for r in d["points"] if r["method"] == method]
            ax.scatter([r["knob_value"] for r in pts], [r["tokens_per_s_stable"] for r in pts], color=color,
                       marker=marker, s=55, zorder=3, edgecolors="black", linewidths=0.5,
                       label=f"{method} (measured)")
            by_r: dict[float, list[float]] = defaultdict(list)
            for r in pts:
                by_r[r["knob_value"]].append(r["tokens_per_s_stable"])
            xs = sorted(by_r)
            ax.plot(xs, [statistics.fmean(by_r[x]) for x in xs], color=color, lw=1, alpha=0.7)
            plan = [(x, s) for x, s, m in d["plan_points"] if m == method]
            if nf is not None and plan:
                ax.scatter([x for x, _ in plan], [s * nf for _, s in plan], facecolors="none", edgecolors=color,
                           marker=marker, s=90, zorder=3, label=f"{method} (its plan's prediction)")
        ax.set_title(f"{schedule}: throughput vs r_max")
        ax.set_xlabel("r_max (maximum freeze ratio)")
        ax.set_ylabel(thr_label)
        ax.set_xlim(-0.03, 1.03)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.text(0.5, 0.005, "predicted throughput = measured no-freezing throughput x predicted batch-time speedup "
             "(no-freeze batch / planned batch)", ha="center", fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.025, 1, 1))
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return True


def plot_tta(tta: list[dict[str, Any]], out_png: Path) -> bool:
    rows = [t for t in tta if t["kappa"] is not None and t["steps_nf"] is not None]
    if not rows:
        return False
    schedules = sorted({t["schedule"] for t in rows})
    plt, fig, axes = _panels(len(schedules), width=max(6.0, 0.9 * len({(t['method'], t['knob_value']) for t in rows}) + 2))
    for ax, schedule in zip(axes, schedules):
        groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
        for t in rows:
            if t["schedule"] == schedule:
                groups[(t["method"], t["knob_name"], t["knob_value"])].append(t)
        keys = sorted(groups, key=lambda k: (k[0] != NO_FREEZING, k[0], k[2] or 0))
        bars = (("steps ratio", "steps_ratio", "#9ecae1"), ("time/step ratio (1/kappa)", "inv_kappa", "#fdae6b"),
                ("TTA ratio", "tta_ratio", "#d62728"))
        w, top = 0.26, 1.0
        for b, (label, key, color) in enumerate(bars):
            for i, k in enumerate(keys):
                ts = groups[k]
                vals = [1 / t["kappa"] if key == "inv_kappa" else t[key] for t in ts]
                n_all, vals = len(vals), [v for v in vals if v is not None]
                x = i + (b - 1) * w
                if vals:
                    v = statistics.fmean(vals)
                    top = max(top, v)
                    ax.bar(x, v, w, color=color, edgecolor="black", lw=0.5, label=label if i == 0 else None)
                    if key == "tta_ratio":
                        seeds = "" if len(vals) == n_all else f"\n{len(vals)}/{n_all} seeds"
                        ax.text(x, v, f"{v:.2f}{seeds}", ha="center", va="bottom", fontsize=7)
                else:
                    ax.bar(x, 0.12, w, color="white", edgecolor=color, hatch="//", lw=0.8,
                           label=label if i == 0 else None)
                    ax.text(x, 0.14, "not reached", ha="center", va="bottom", fontsize=7, color="#333333",
                            rotation=90)
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_ylim(0, top * 1.22)
        ax.set_xlim(-0.6, max(len(keys), 3) - 0.4)
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels([config_label(*k) for k in keys], rotation=25, ha="right", fontsize=8)
        ax.set_ylabel("ratio to no freezing (< 1 is better)")
        ax.set_title(f"{schedule}: time to the no-freezing validation loss")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", ncol=3)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return True


def timelines(rows: list[dict[str, Any]], planner: Planner | None, rep: Path,
              warnings: list[str]) -> list[tuple[Path, str]]:
    """One timeline per schedule: the plain-TimelyFreeze job with the largest r_max (then any planned
    method's job, lowest seed), drawn by ``planner.gantt``; the runtime's own timeline.png if that fails."""
    made = []
    cands = [r for r in rows if r["status"] == "ok" and r["method"] in PLANNED_METHODS and r["_trace"]
             and r["_plan"]]
    for schedule in sorted({r["schedule"] for r in cands}):
        rs = sorted((r for r in cands if r["schedule"] == schedule),
                    key=lambda r: (r["method"] != PLAIN_TIMELYFREEZE, -(r["knob_value"] or 0), str(r["seed"])))
        r = rs[0]
        png = rep / f"timeline_{schedule}.png"
        try:
            if planner is None:
                raise PlannerError("planner disabled")
            planner.gantt(r["_trace"], r["_plan"], png)
            if not png.is_file():
                raise PlannerError(f"planner gantt wrote no {png.name}")
        except (PlannerError, OSError) as e:
            if r["_timeline"] is None:
                warnings.append(f"{schedule}: no timeline ({e})")
                continue
            shutil.copyfile(r["_timeline"], png)
            warnings.append(f"{schedule}: planner gantt unavailable ({e}); copied the runtime's timeline.png")
        made.append((png, r["job_id"]))
    return made
