"""The report's matplotlib figures: loss vs throughput with the Pareto front, measured vs predicted
throughput over r_max, time to accuracy (ratios per cell, and validation loss over training wall-clock), and
one timeline per schedule.

Every ``plot_*`` returns whether it drew anything; a figure with no data is skipped, not an error.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from planner.errors import PlannerError
from timelyfreeze.config.freeze import METHODS, PLANNED_METHODS
from timelyfreeze.experiments.stats import mean_ci
from timelyfreeze.experiments.sweep.grid import NO_FREEZING
from timelyfreeze.experiments.sweep.pareto import pareto_front
from timelyfreeze.experiments.sweep.predictions import Planner
from timelyfreeze.experiments.sweep.results import cell_knob, config_label, fmt_knob
from timelyfreeze.experiments.sweep.tta import wall_to_step

PLAIN_TIMELYFREEZE = "timelyfreeze"
"""The planned method whose run a schedule's timeline prefers (then any other planned method)."""

# fixed colour/marker per method (in timelyfreeze.config.freeze.METHODS order) so every plot of a report agrees
_COLOURS = (
    "#444444",
    "#d62728",
    "#ff7f0e",
    "#e377c2",
    "#1f77b4",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#17becf",
    "#bcbd22",
    "#aec7e8",
)
_MARKERS = ("s", "o", "D", "P", "^", "v", "<", ">", "X", "h", "p")
METHOD_STYLE: dict[str, tuple[str, str]] = dict(zip(METHODS, zip(_COLOURS, _MARKERS)))


def style(method: str) -> tuple[str, str]:
    return METHOD_STYLE.get(method, ("#7f7f7f", "*"))


def _plt():
    import matplotlib  # deferred: matplotlib is heavy and only plots need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: matplotlib is heavy and only plots need it

    return plt


def _panels(n: int, width: float = 6.0, height: float = 4.6):
    plt = _plt()
    cols = min(n, 2)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return plt, fig, list(axes.flat[:n])


def _err(c: dict[str, Any], q: str) -> tuple[list[float], list[float]] | None:
    """Matplotlib's asymmetric error of quantity ``q`` of cell ``c`` (None without an interval)."""
    if c[f"{q}_lo"] is None:
        return None
    return [c[f"{q}_mean"] - c[f"{q}_lo"]], [c[f"{q}_hi"] - c[f"{q}_mean"]]


def _errorbar(ax, x: float, y: float, xerr, yerr, color: str, marker: str, label: str | None, **kw) -> None:
    ax.errorbar(
        [x],
        [y],
        xerr=None if xerr is None else [xerr[0], xerr[1]],
        yerr=None if yerr is None else [yerr[0], yerr[1]],
        fmt=marker,
        color=color,
        ms=7,
        capsize=3,
        elinewidth=1,
        mec="black",
        mew=0.5,
        label=label,
        zorder=3,
        **kw,
    )


def plot_pareto(cells: list[dict[str, Any]], out_png: Path) -> bool:
    """Per schedule: validation-loss change vs throughput ratio (kappa), both vs the no-freezing run of the
    same seed, each cell at its mean with its 95 % intervals; the front of the means is dashed."""
    cs_all = [c for c in cells if c["kappa_mean"] is not None and c["dval_mean"] is not None]
    schedules = sorted({c["schedule"] for c in cs_all})
    if not schedules:
        return False
    plt, fig, axes = _panels(len(schedules))
    for ax, schedule in zip(axes, schedules):
        cs = [c for c in cs_all if c["schedule"] == schedule]
        seen: set[str] = set()
        for c in cs:
            color, marker = style(c["method"])
            _errorbar(
                ax,
                c["kappa_mean"],
                c["dval_mean"],
                _err(c, "kappa"),
                _err(c, "dval"),
                color,
                marker,
                None if c["method"] in seen else c["method"],
            )
            seen.add(c["method"])
            if c["knob_name"] is not None:
                ax.annotate(
                    fmt_knob(c["knob_value"]),
                    (c["kappa_mean"], c["dval_mean"]),
                    fontsize=7,
                    xytext=(4, 4),
                    textcoords="offset points",
                    color=color,
                )
        flags = pareto_front([(c["kappa_mean"], c["dval_mean"]) for c in cs])
        front = sorted((c for c, f in zip(cs, flags) if f), key=lambda c: c["kappa_mean"])
        ax.plot(
            [c["kappa_mean"] for c in front],
            [c["dval_mean"] for c in front],
            "--",
            color="black",
            lw=1,
            zorder=2,
            label="front of the means",
        )
        ax.axhline(0.0, color="#888888", lw=0.8)
        ax.axvline(1.0, color="#888888", lw=0.8)
        n = max(c["seeds"] for c in cs)
        ax.set_title(
            f"{schedule}: mean and 95 % interval over {n} seed{'s' if n > 1 else ''} (better: down-right)", fontsize=9
        )
        ax.set_xlabel("throughput / no-freezing throughput of the same seed (kappa)")
        ax.set_ylabel("validation loss - no-freezing (same seed, same step)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return True


def rmax_data(
    rows: list[dict[str, Any]], cells: list[dict[str, Any]], planner: Planner | None, warnings: list[str]
) -> dict[str, dict[str, Any]]:
    """Per schedule: the TimelyFreeze-family cells (each run's own plan speedup is their ``predicted_speedup``),
    the planner's predicted speedup curves (one per trace of the schedule's runs) and their rows
    (``planner_rows``: job_id, schedule, seed and ``planner.rmax_sweep.SweepRow``'s fields per r_max)."""
    fam = [r for r in rows if r["status"] == "ok" and r["method"] in PLANNED_METHODS]
    grid_r = sorted({r["knob_value"] for r in fam})
    r_values = sorted({round(i / 10, 10) for i in range(11)} | set(grid_r))
    data: dict[str, dict[str, Any]] = {}
    for schedule in sorted({r["schedule"] for r in fam}):
        d = {
            "cells": [c for c in cells if c["schedule"] == schedule and c["method"] in PLANNED_METHODS],
            "curves": [],
            "planner_rows": [],
        }
        if planner is None:
            data[schedule] = d
            continue
        for r in (r for r in fam if r["schedule"] == schedule):
            if r["_trace"] is None:
                warnings.append(f"{r['job_id']}: no trace, no planner prediction")
                continue
            try:
                curve = planner.sweep(r["_trace"], r_values)
                d["curves"].append(sorted((c["r_max"], c["speedup"]) for c in curve))
                d["planner_rows"] += [
                    {"job_id": r["job_id"], "schedule": schedule, "seed": r["seed"], **c} for c in curve
                ]
            except (PlannerError, OSError) as e:
                warnings.append(f"{r['job_id']}: planner sweep failed: {e}")
        data[schedule] = d
    return data


def plot_rmax(data: dict[str, dict[str, Any]], out_png: Path) -> bool:
    """Per schedule, two panels over r_max: the speed-up (measured kappa and in-run speedup, mean and 95 %
    interval over seeds, beside the planner's prediction from the same runs' traces) and the validation-loss
    change vs no freezing."""
    data = {k: d for k, d in data.items() if d["cells"]}
    if not data:
        return False

    plt = _plt()
    fig, axes = plt.subplots(len(data), 2, figsize=(12, 4.4 * len(data)), squeeze=False)
    for (ax, ax2), (schedule, d) in zip(axes, data.items()):
        ax.axhline(1.0, color=style(NO_FREEZING)[0], ls=":", lw=1.2, label="no freezing")
        ax2.axhline(0.0, color=style(NO_FREEZING)[0], ls=":", lw=1.2)
        if d["curves"]:
            xs = sorted({x for c in d["curves"] for x, _ in c})
            ys = np.array([[np.interp(x, [p[0] for p in c], [p[1] for p in c]) for x in xs] for c in d["curves"]])
            ax.plot(
                xs,
                np.median(ys, axis=0),
                color="black",
                lw=1.5,
                label=f"planner prediction (median of {len(d['curves'])} traces)",
            )
            if len(d["curves"]) > 1:
                ax.fill_between(
                    xs, ys.min(axis=0), ys.max(axis=0), color="black", alpha=0.12, label="prediction range over traces"
                )
        for method in [m for m in PLANNED_METHODS if any(c["method"] == m for c in d["cells"])]:
            color, marker = style(method)
            cs = sorted((c for c in d["cells"] if c["method"] == method), key=lambda c: c["knob_value"])
            for q, mk, dx, lab in (
                ("kappa", marker, -0.008, "kappa (vs no-freezing job)"),
                ("speedup_in_run", "x", 0.008, "in-run speedup"),
            ):
                pts = [c for c in cs if c[f"{q}_mean"] is not None]
                for i, c in enumerate(pts):
                    _errorbar(
                        ax,
                        c["knob_value"] + dx,
                        c[f"{q}_mean"],
                        None,
                        _err(c, q),
                        color,
                        mk,
                        f"{method}: {lab}" if i == 0 else None,
                    )
                ax.plot(
                    [c["knob_value"] + dx for c in pts],
                    [c[f"{q}_mean"] for c in pts],
                    color=color,
                    lw=0.8,
                    alpha=0.6,
                    ls="-" if q == "kappa" else "--",
                )
            pts = [c for c in cs if c["dval_mean"] is not None]
            for i, c in enumerate(pts):
                _errorbar(
                    ax2,
                    c["knob_value"],
                    c["dval_mean"],
                    None,
                    _err(c, "dval"),
                    color,
                    marker,
                    method if i == 0 else None,
                )
            ax2.plot([c["knob_value"] for c in pts], [c["dval_mean"] for c in pts], color=color, lw=0.8, alpha=0.6)
        n = max(c["seeds"] for c in d["cells"])
        ax.set_title(f"{schedule}: speed-up vs r_max (mean, 95 % interval, {n} seeds)", fontsize=9)
        ax.set_ylabel("speed-up over no freezing")
        ax2.set_title(f"{schedule}: validation-loss change vs r_max (same seed, same step)", fontsize=9)
        ax2.set_ylabel("validation loss - no-freezing")
        for a in (ax, ax2):
            a.set_xlabel("r_max (maximum freeze ratio)")
            a.set_xlim(-0.05, 1.05)
            a.grid(alpha=0.3)
            a.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return True


def plot_tta(cells: list[dict[str, Any]], out_png: Path) -> bool:
    """Per schedule: the steps ratio and the wall-clock time-to-accuracy ratio of each cell (mean and 95 %
    interval over the seeds that reached the no-freezing loss; hatched where none did)."""
    cells = [c for c in cells if c["method"] != NO_FREEZING and c["kappa_mean"] is not None]
    if not cells:
        return False
    schedules = sorted({c["schedule"] for c in cells})
    per = max(len([c for c in cells if c["schedule"] == s]) for s in schedules)
    plt, fig, axes = _panels(len(schedules), width=max(6.0, 0.9 * per + 2))
    for ax, schedule in zip(axes, schedules):
        cs = [c for c in cells if c["schedule"] == schedule]
        w, top = 0.38, 1.2
        for b, (label, q, color) in enumerate(
            (("steps ratio", "steps_ratio", "#9ecae1"), ("TTA ratio (wall clock)", "tta_ratio", "#d62728"))
        ):
            for i, c in enumerate(cs):
                x = i + (b - 0.5) * w
                m = c[f"{q}_mean"]
                if m is None:
                    ax.bar(
                        x, 0.12, w, color="white", edgecolor=color, hatch="//", lw=0.8, label=label if i == 0 else None
                    )
                    ax.text(x, 0.14, "not reached", ha="center", va="bottom", fontsize=7, rotation=90)
                    continue
                err = _err(c, q)
                ax.bar(
                    x,
                    m,
                    w,
                    color=color,
                    edgecolor="black",
                    lw=0.5,
                    label=label if i == 0 else None,
                    yerr=None if err is None else [err[0], err[1]],
                    capsize=3,
                )
                top = max(top, c[f"{q}_hi"] or m)
                if q == "tta_ratio":
                    ax.text(
                        x,
                        (c[f"{q}_hi"] or m) + 0.02,
                        f"{m:.2f}\n{c['reached']}/{c['seeds']}",
                        ha="center",
                        va="bottom",
                        fontsize=7,
                    )
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_ylim(0, top * 1.25)
        ax.set_xlim(-0.6, max(len(cs), 3) - 0.4)
        ax.set_xticks(range(len(cs)))
        ax.set_xticklabels(
            [config_label(c["method"], c["knob_name"], c["knob_value"]) for c in cs],
            rotation=25,
            ha="right",
            fontsize=8,
        )
        ax.set_ylabel("ratio to no freezing (< 1 is better)")
        ax.set_title(f"{schedule}: reaching the no-freezing validation loss (label: mean, seeds reached)", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", ncol=2)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return True


TTA_CURVE_GRID_S = 5.0
"""Spacing in seconds of the common time grid on which the seeds' validation curves are averaged."""

_ARM_COLOURS = ("#444444", "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")


def wall_curve(row: dict[str, Any]) -> list[tuple[float, float]]:
    """A run's validation curve against training wall-clock: (seconds of step time up to the validation's step,
    validation loss); points whose step times are missing are left out."""
    out = []
    for step, loss in row.get("_val_curve") or []:
        t = wall_to_step(row.get("_step_ms") or {}, step)
        if t is not None:
            out.append((t, float(loss)))
    return out


def tta_curve_bands(rows: list[dict[str, Any]], grid_s: float = TTA_CURVE_GRID_S) -> dict[str, dict[str, dict]]:
    """Per schedule and arm (``config_label`` of the cell): on a common grid every ``grid_s`` seconds up to the
    end of the schedule's longest run, the mean over seeds of each seed's validation curve, linearly interpolated
    at that time, and the 95 % Student-t interval over the seeds whose run covers that time (no interval below
    two). A seed's curve counts from its first to its last validation, never extrapolated.
    ``{schedule: {arm: {"t", "mean", "lo", "hi", "n", "seeds"}}}`` (lists of equal length, None where undefined;
    ``seeds``: the arm's number of runs). Where ``n`` is below ``seeds`` the mean is over the runs still going:
    once the runs that reached the target have stopped, only the slower ones remain."""
    runs: dict[str, dict[str, list[list[tuple[float, float]]]]] = {}
    order: dict[str, tuple] = {}
    for r in rows:
        if r.get("status") != "ok":
            continue
        curve = wall_curve(r)
        if len(curve) < 2:
            continue
        arm = config_label(r["method"], r.get("knob_name"), cell_knob(r))
        runs.setdefault(r["schedule"], {}).setdefault(arm, []).append(curve)
        order[arm] = (r["method"] != NO_FREEZING, str(r["method"]), str(cell_knob(r)))
    out: dict[str, dict[str, dict]] = {}
    for schedule, arms in sorted(runs.items()):
        end = max(c[-1][0] for curves in arms.values() for c in curves)
        grid = [grid_s * i for i in range(int(end // grid_s) + 1)]
        out[schedule] = {}
        for arm in sorted(arms, key=lambda a: order[a]):
            band: dict[str, Any] = {"t": grid, "mean": [], "lo": [], "hi": [], "n": [], "seeds": len(arms[arm])}
            for t in grid:
                vals = [
                    float(np.interp(t, [p[0] for p in c], [p[1] for p in c]))
                    for c in arms[arm]
                    if c[0][0] <= t <= c[-1][0]
                ]
                m, lo, hi, n = mean_ci(vals)
                for k, v in (("mean", m), ("lo", lo), ("hi", hi), ("n", n)):
                    band[k].append(v)
            out[schedule][arm] = band
    return out


def plot_tta_curves(
    bands: dict[str, dict[str, dict]], targets: dict[str, list[tuple[str, float]]], out_png: Path
) -> bool:
    """Per schedule, one panel: validation loss against training wall-clock, each arm's mean over seeds with
    its 95 % band (``tta_curve_bands``; dashed where some of its runs have ended), and a horizontal line at each
    target (``targets[schedule]``: label, loss)."""
    if not any(bands.values()):
        return False
    plt, fig, axes = _panels(len(bands))
    for ax, (schedule, arms) in zip(axes, bands.items()):
        for i, (arm, b) in enumerate(arms.items()):
            colour = _ARM_COLOURS[i % len(_ARM_COLOURS)]

            def line(keep):
                return [m if m is not None and keep(n) else np.nan for m, n in zip(b["mean"], b["n"])]

            ax.plot(b["t"], line(lambda n: n == b["seeds"]), color=colour, lw=1.4, label=f"{arm} ({b['seeds']} runs)")
            ax.plot(b["t"], line(lambda n: 0 < n < b["seeds"]), color=colour, lw=1.0, ls="--")
            span = [(t, lo, hi) for t, lo, hi in zip(b["t"], b["lo"], b["hi"]) if lo is not None]
            if span:
                ax.fill_between(
                    [p[0] for p in span], [p[1] for p in span], [p[2] for p in span], color=colour, alpha=0.2, lw=0
                )
        for j, (label, loss) in enumerate(targets.get(schedule, [])):
            ax.axhline(loss, color="black", lw=0.8, ls=("--", ":", "-.")[j % 3], label=f"{label} ({loss:.4f})")
        ax.set_xlabel("training wall-clock (s; step times, validation excluded)")
        ax.set_ylabel("validation loss")
        ax.set_title(f"{schedule}: mean over seeds, 95 % band; dashed: over the runs still going", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return True


def timelines(
    rows: list[dict[str, Any]], planner: Planner | None, rep: Path, warnings: list[str]
) -> list[tuple[Path, str]]:
    """One timeline per schedule: the plain-TimelyFreeze job with the largest r_max (then any planned
    method's job, lowest seed), drawn by ``planner.gantt``; the runtime's own timeline.png if that fails."""
    made = []
    cands = [r for r in rows if r["status"] == "ok" and r["method"] in PLANNED_METHODS and r["_trace"] and r["_plan"]]
    for schedule in sorted({r["schedule"] for r in cands}):
        rs = sorted(
            (r for r in cands if r["schedule"] == schedule),
            key=lambda r: (r["method"] != PLAIN_TIMELYFREEZE, -(r["knob_value"] or 0), str(r["seed"])),
        )
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
