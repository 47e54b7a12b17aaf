"""Aggregate a sweep folder (``scripts/sweep.py``) into tables and plots.

    python scripts/sweep.py report <out> [--tta-step N] [--throughput stable|all] [--no-planner]

Reads ``<out>/jobs/<job_id>/job.json`` and ``<out>/jobs/<job_id>/dump/timelyfreeze/{summary.json,
metrics.jsonl,trace/,plan.json}`` (docs/run-outputs.md) and writes under ``<out>/report/``:

- ``results.csv``: one row per job (``RESULT_COLUMNS``); jobs without a summary.json (failed,
  interrupted) get what their metrics.jsonl holds.
- ``configs.csv``: one row per (schedule, method, knob value), means over the ok seeds, with the
  ``pareto`` flag (not dominated in lower loss and higher throughput within its schedule).
- ``tta.csv``: time-to-accuracy per job against the no-freezing job of the same schedule and seed.
- ``report.md``: the three tables, the plots and every warning.
- ``pareto.png``, ``throughput_vs_rmax.png``, ``tta.png``, ``timeline_<schedule>.png``.

Time-to-accuracy (seeds digest 1.12): ``kappa`` = the job's stable-phase throughput / the no-freezing
job's; the target is the no-freezing validation loss at ``--tta-step`` (default its last validation
point, linear interpolation between validation points); ``steps`` = the first step a run's validation
curve reaches the target (linear interpolation; the first validation point if already there; the
no-freezing run is measured the same way); ``tta_ratio = (steps_method / steps_nf) / kappa``
(< 1: the method reaches the no-freezing accuracy sooner in wall-clock time, under the stable-phase
per-step time). Only runs of the same length as the baseline are compared.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent
TIMELYFREEZE_FAMILY = ("timelyfreeze", "timelyfreeze_apf", "timelyfreeze_autofreeze")

RESULT_COLUMNS = [
    "job_id", "method", "knob_name", "knob_value", "schedule", "seed", "steps",
    "tokens_per_s_stable", "tokens_per_s_all", "mean_batch_ms_stable", "mean_batch_ms_all",
    "predicted_batch_ms", "speedup_in_run", "avg_freeze_ratio", "final_loss", "val_loss", "status",
]
CONFIG_COLUMNS = [
    "schedule", "method", "knob_name", "knob_value", "seeds", "tokens_per_s", "loss", "avg_freeze_ratio",
    "pareto",
]
TTA_COLUMNS = [
    "job_id", "schedule", "method", "knob_name", "knob_value", "seed", "kappa", "target_step",
    "target_loss", "steps_nf", "steps_method", "steps_ratio", "tta_ratio", "note",
]

# fixed colour/marker per method so every plot of a report agrees
METHOD_STYLE = {
    "none": ("#444444", "s"),
    "timelyfreeze": ("#d62728", "o"),
    "timelyfreeze_apf": ("#ff7f0e", "D"),
    "timelyfreeze_autofreeze": ("#e377c2", "P"),
    "apf": ("#1f77b4", "^"),
    "autofreeze": ("#2ca02c", "v"),
    "egeria": ("#9467bd", "<"),
    "smartpipe": ("#8c564b", ">"),
    "random": ("#17becf", "X"),
}


def style(method: str) -> tuple[str, str]:
    return METHOD_STYLE.get(method, ("#7f7f7f", "*"))


def fmt_knob(v: Any) -> str:
    return "" if v is None else format(v, "g") if isinstance(v, (int, float)) else str(v)


def config_label(method: str, knob_name: str | None, knob_value: Any) -> str:
    return method if knob_name is None else f"{method} {knob_name}={fmt_knob(knob_value)}"


# ------------------------------------------------------------------------------------- loading
def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl lines that parse (a run killed mid-write may leave a torn last line)."""
    out = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int):
            out.append(rec)
    return out


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _parse_job_id(job_id: str) -> dict[str, Any]:
    """``1F1B__timelyfreeze__r_max=0.8__seed=0`` -> its parts (for jobs that left no job.json/summary)."""
    parts = job_id.split("__")
    info: dict[str, Any] = {"schedule": parts[0] if parts else None, "method": parts[1] if len(parts) > 1 else None,
                            "knob": None, "seed": None}
    for p in parts[2:]:
        k, _, v = p.partition("=")
        if k == "seed":
            info["seed"] = int(v) if v.lstrip("-").isdigit() else v
        elif v:
            info["knob"] = {"name": k, "value": float(v)}
    return info


def metrics_figures(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """What a run's metrics.jsonl alone gives (for runs without summary.json)."""
    if not metrics:
        return {}
    tokens = secs = 0.0
    for m in metrics:
        tps, ms = _num(m.get("tokens_per_s")), _num(m.get("step_ms"))
        if tps is not None and ms is not None:
            tokens += tps * ms / 1000.0
            secs += ms / 1000.0
    losses = [(m["step"], _num(m.get("loss"))) for m in metrics if _num(m.get("loss")) is not None]
    batch = [_num(m.get("batch_ms")) for m in metrics if _num(m.get("batch_ms")) is not None]
    ratios = [_num(m.get("freeze_ratio")) for m in metrics if _num(m.get("freeze_ratio")) is not None]
    return {
        "steps": max(m["step"] for m in metrics),
        "tokens_per_s_all": tokens / secs if secs > 0 else None,
        "mean_batch_ms_all": statistics.fmean(batch) if batch else None,
        "avg_freeze_ratio": statistics.fmean(ratios) if ratios else None,
        "final_loss": losses[-1][1] if losses else None,
        "val_curve": val_curve_from_metrics(metrics),
    }


def val_curve_from_metrics(metrics: list[dict[str, Any]]) -> list[list[float]]:
    return [[m["step"], float(m["val_loss"])] for m in metrics if _num(m.get("val_loss")) is not None]


UNFROZEN_PHASES = ("warmup", "upper")
TRANSIENT_PHASES = ("warmup", "upper", "lower", "progressive", "bootstrap")


def in_run_speedup(metrics: list[dict[str, Any]]) -> float | None:
    """Median batch time of the run's own unfrozen steps (warm-up after step 1, upper-bound monitoring)
    over the median of its steady steps (``stable``, or for step-level methods every step after the
    transient phases). Both sides come from the same job, so machine drift between jobs cancels."""
    rows = [m for m in metrics if "phase" in m and _num(m.get("batch_ms")) is not None]
    base = [m["batch_ms"] for m in rows if m["phase"] in UNFROZEN_PHASES and m["step"] > 1]
    stable = [m["batch_ms"] for m in rows if m["phase"] == "stable"]
    if not stable:
        stable = [m["batch_ms"] for m in rows if m["phase"] not in TRANSIENT_PHASES]
    if not base or not stable:
        return None
    return statistics.median(base) / statistics.median(stable)


def load_job(job_dir: Path) -> dict[str, Any]:
    """One results row (RESULT_COLUMNS) plus private keys (leading ``_``) the plots use."""
    job = _read_json(job_dir / "job.json") or {}
    tf = job_dir / "dump" / "timelyfreeze"
    summary = _read_json(tf / "summary.json")
    summary = summary if isinstance(summary, dict) else None
    metrics = read_metrics(tf / "metrics.jsonl")
    spec = job.get("spec") or _parse_job_id(job_dir.name)
    src = summary or spec
    knob = src.get("knob") or spec.get("knob") or None
    status = job.get("status") or ("ok" if summary else "missing")
    row: dict[str, Any] = {
        "job_id": job_dir.name,
        "method": src.get("method") or spec.get("method"),
        "knob_name": knob["name"] if knob else None,
        "knob_value": knob["value"] if knob else None,
        "schedule": src.get("schedule") or spec.get("schedule"),
        "seed": src.get("seed", spec.get("seed")),
        "status": status,
    }
    if summary is not None:
        tps = summary.get("tokens_per_s") or {}
        mb = summary.get("mean_batch_ms") or {}
        pred = summary.get("predicted_batch_ms") or {}
        row.update(
            steps=summary.get("steps"),
            tokens_per_s_stable=_num(tps.get("stable")), tokens_per_s_all=_num(tps.get("all")),
            mean_batch_ms_stable=_num(mb.get("stable")), mean_batch_ms_all=_num(mb.get("all")),
            predicted_batch_ms=_num(pred.get("planned")),
            speedup_in_run=in_run_speedup(metrics),
            avg_freeze_ratio=_num(summary.get("avg_freeze_ratio")),
            final_loss=_num(summary.get("final_loss")), val_loss=_num(summary.get("val_loss")),
        )
        curve = summary.get("val_curve") or val_curve_from_metrics(metrics)
        row["_predicted"] = pred
        row["_tokens_per_step"] = _num(summary.get("tokens_per_step"))
    else:
        fig = metrics_figures(metrics)
        curve = fig.pop("val_curve", [])
        row.update(fig)
        row["val_loss"] = curve[-1][1] if curve else None
        row["_predicted"] = {}
        row["_tokens_per_step"] = None
    for c in RESULT_COLUMNS:
        row.setdefault(c, None)
    row["_val_curve"] = sorted(([float(s), float(v)] for s, v in curve if _num(v) is not None), key=lambda p: p[0])
    row["_dir"] = job_dir
    row["_trace"] = tf / "trace" if (tf / "trace" / "meta.json").is_file() else None
    row["_plan"] = tf / "plan.json" if (tf / "plan.json").is_file() else None
    row["_timeline"] = tf / "timeline.png" if (tf / "timeline.png").is_file() else None
    return row


def load_rows(out: str | Path) -> list[dict[str, Any]]:
    jobs = Path(out) / "jobs"
    if not jobs.is_dir():
        return []
    rows = [load_job(d) for d in sorted(jobs.iterdir()) if d.is_dir()]
    return sorted(rows, key=lambda r: (str(r["schedule"]), str(r["method"]), r["knob_value"] or 0,
                                       str(r["seed"])))


def public(row: dict[str, Any], columns: Sequence[str]) -> dict[str, Any]:
    return {c: row.get(c) for c in columns}


# ------------------------------------------------------------------------------------ analysis
def throughput(row: dict[str, Any], which: str = "stable") -> float | None:
    return row.get(f"tokens_per_s_{which}")


def loss_key(rows: Iterable[dict[str, Any]]) -> str:
    """``val_loss`` when any ok job validated, else ``final_loss`` (training loss)."""
    return "val_loss" if any(r.get("val_loss") is not None for r in rows if r["status"] == "ok") else "final_loss"


def pareto_front(points: Sequence[tuple[float, float]]) -> list[bool]:
    """For (throughput, loss) points: True where no other point has throughput >= and loss <= with
    one of them strictly better (ties are all on the front)."""
    flags = []
    for i, (t, l) in enumerate(points):
        dominated = any(
            t2 >= t and l2 <= l and (t2 > t or l2 < l) for j, (t2, l2) in enumerate(points) if j != i
        )
        flags.append(not dominated)
    return flags


def aggregate_configs(rows: list[dict[str, Any]], which: str = "stable",
                      lkey: str | None = None) -> list[dict[str, Any]]:
    """Means over the ok seeds of each (schedule, method, knob value), with the Pareto flag per schedule."""
    lkey = lkey or loss_key(rows)
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["status"] == "ok":
            groups[(r["schedule"], r["method"], r["knob_name"], r["knob_value"])].append(r)
    configs = []
    for (schedule, method, kname, kval), rs in groups.items():
        def mean(key_fn):
            vals = [v for v in map(key_fn, rs) if v is not None]
            return statistics.fmean(vals) if vals else None

        configs.append({
            "schedule": schedule, "method": method, "knob_name": kname, "knob_value": kval,
            "seeds": len(rs), "tokens_per_s": mean(lambda r: throughput(r, which)),
            "loss": mean(lambda r: r.get(lkey)), "avg_freeze_ratio": mean(lambda r: r.get("avg_freeze_ratio")),
            "pareto": None,
        })
    for schedule in {c["schedule"] for c in configs}:
        cs = [c for c in configs if c["schedule"] == schedule and c["tokens_per_s"] is not None
              and c["loss"] is not None]
        for c, flag in zip(cs, pareto_front([(c["tokens_per_s"], c["loss"]) for c in cs])):
            c["pareto"] = flag
    return sorted(configs, key=lambda c: (str(c["schedule"]), str(c["method"]), c["knob_value"] or 0))


def interp_at(curve: Sequence[Sequence[float]], step: float) -> float | None:
    """Loss at ``step`` by linear interpolation between validation points; None outside the curve."""
    for (s0, l0), (s1, l1) in zip(curve, curve[1:]):
        if s0 <= step <= s1:
            return l0 if s1 == s0 else l0 + (l1 - l0) * (step - s0) / (s1 - s0)
    if curve and curve[-1][0] == step:
        return curve[-1][1]
    return None


def steps_to_reach(curve: Sequence[Sequence[float]], target: float) -> float | None:
    """First step at which the (linearly interpolated) validation curve is <= target; None if never."""
    if not curve:
        return None
    if curve[0][1] <= target:
        return float(curve[0][0])
    for (s0, l0), (s1, l1) in zip(curve, curve[1:]):
        if l1 <= target:
            return s0 + (l0 - target) / (l0 - l1) * (s1 - s0)  # l0 > target >= l1, so l0 > l1
    return None


def tta_rows(rows: list[dict[str, Any]], tta_step: float | None = None) -> list[dict[str, Any]]:
    """Time-to-accuracy of every ok job against the no-freezing job of its schedule and seed."""
    base = {(r["schedule"], r["seed"]): r for r in rows if r["method"] == "none" and r["status"] == "ok"}
    out = []
    for r in rows:
        if r["status"] != "ok":
            continue
        t = {c: None for c in TTA_COLUMNS}
        t.update({k: r[k] for k in ("job_id", "schedule", "method", "knob_name", "knob_value", "seed")})
        out.append(t)
        nf = base.get((r["schedule"], r["seed"]))
        if nf is None:
            t["note"] = "no no-freezing run of this schedule and seed"
            continue
        if r["steps"] != nf["steps"]:
            t["note"] = f"different length ({r['steps']} vs {nf['steps']} steps)"
            continue
        tm, tn = throughput(r), throughput(nf)
        if tm is not None and tn:
            t["kappa"] = tm / tn
        nf_curve = nf["_val_curve"]
        if not nf_curve:
            t["note"] = "no-freezing run has no validation curve"
            continue
        step = nf_curve[-1][0] if tta_step is None else float(tta_step)
        target = interp_at(nf_curve, step)
        if target is None:
            t["note"] = f"--tta-step {step:g} outside the no-freezing validation curve"
            continue
        t["target_step"], t["target_loss"] = step, target
        t["steps_nf"] = steps_to_reach(nf_curve, target)
        t["steps_method"] = steps_to_reach(r["_val_curve"], target)
        if t["steps_method"] is None:
            t["note"] = "not reached" if r["_val_curve"] else "no validation curve"
            continue
        t["steps_ratio"] = t["steps_method"] / t["steps_nf"]
        if t["kappa"] is None:
            t["note"] = "no stable-phase throughput"
            continue
        t["tta_ratio"] = t["steps_ratio"] / t["kappa"]
    return out


# ------------------------------------------------------------------------------------- planner
class PlannerError(RuntimeError):
    pass


class PlannerCLI:
    """``python -m planner sweep|gantt`` (planner/, another helper's CLI); tests substitute a fake."""

    def __init__(self, python: str = sys.executable, timeout_s: float = 300.0):
        self.python, self.timeout_s = python, timeout_s

    def _run(self, args: list[str]) -> subprocess.CompletedProcess:
        try:
            return subprocess.run([self.python, "-m", "planner", *args], cwd=REPO_ROOT, capture_output=True,
                                  text=True, timeout=self.timeout_s)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise PlannerError(f"planner {args[0]}: {e}") from e

    def _check(self, p: subprocess.CompletedProcess, what: str) -> None:
        if p.returncode != 0:
            tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
            raise PlannerError(f"planner {what} exit {p.returncode}: {' | '.join(tail)}")

    def sweep(self, trace: Path, r_values: Sequence[float], csv_path: Path) -> list[dict[str, float]]:
        """Rows with ``r_max``, ``batch_ms``, ``speedup`` (floats) for each r_max value."""
        vals = ",".join(format(v, "g") for v in r_values)
        self._check(self._run(["sweep", str(trace), "--r-max", vals, "--csv", str(csv_path)]), "sweep")
        with open(csv_path, newline="") as f:
            rows = list(csv.DictReader(f))
        try:
            return [{k: float(row[k]) for k in ("r_max", "batch_ms", "speedup")} for row in rows]
        except (KeyError, ValueError) as e:
            raise PlannerError(f"{csv_path}: expected columns r_max, batch_ms, speedup ({e!r})") from e

    def gantt(self, trace: Path, plan: Path, out_png: Path) -> None:
        self._check(self._run(["gantt", str(trace), "--plan", str(plan), "--out", str(out_png)]), "gantt")


# --------------------------------------------------------------------------------------- plots
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


def rmax_data(rows: list[dict[str, Any]], planner: PlannerCLI | None, work: Path,
              warnings: list[str]) -> dict[str, dict[str, Any]]:
    """Per schedule: measured TimelyFreeze-family points, the no-freezing throughput, the planner's
    predicted speedup curves (one per trace) and each job's own plan speedup."""
    fam = [r for r in rows if r["status"] == "ok" and r["method"] in TIMELYFREEZE_FAMILY
           and r["tokens_per_s_stable"] is not None]
    grid_r = sorted({r["knob_value"] for r in fam})
    r_values = sorted({round(i / 10, 10) for i in range(11)} | set(grid_r))
    data: dict[str, dict[str, Any]] = {}
    for schedule in sorted({r["schedule"] for r in fam}):
        nf = [r["tokens_per_s_stable"] for r in rows if r["schedule"] == schedule and r["method"] == "none"
              and r["status"] == "ok" and r["tokens_per_s_stable"] is not None]
        d = {"points": [r for r in fam if r["schedule"] == schedule],
             "nf_tps": statistics.fmean(nf) if nf else None, "curves": [], "plan_points": []}
        if d["nf_tps"] is None:
            warnings.append(f"{schedule}: no ok no-freezing run, so no predicted throughput is drawn")
        for r in d["points"]:
            p = r["_predicted"]
            if _num(p.get("no_freeze")) and _num(p.get("planned")):
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
            ax.axhline(nf, color=style("none")[0], ls=":", lw=1.2, label="no freezing (measured)")
        if nf is not None and d["curves"]:
            xs = sorted({x for c in d["curves"] for x, _ in c})
            ys = np.array([[np.interp(x, [p[0] for p in c], [p[1] for p in c]) for x in xs] for c in d["curves"]]) * nf
            ax.plot(xs, ys.mean(axis=0), color="black", lw=1.5,
                    label=f"planner prediction (mean of {len(d['curves'])} trace{'s' if len(d['curves']) > 1 else ''})")
            if len(d["curves"]) > 1:
                ax.fill_between(xs, ys.min(axis=0), ys.max(axis=0), color="black", alpha=0.12,
                                label="prediction range over traces")
        for method in [m for m in TIMELYFREEZE_FAMILY if any(r["method"] == m for r in d["points"])]:
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
        keys = sorted(groups, key=lambda k: (k[0] != "none", k[0], k[2] or 0))
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


def timelines(rows: list[dict[str, Any]], planner: PlannerCLI | None, rep: Path,
              warnings: list[str]) -> list[tuple[Path, str]]:
    """One timeline per schedule: the plain-TimelyFreeze job with the largest r_max (then any family
    member, lowest seed), drawn by ``planner gantt``; the runtime's own timeline.png if that fails."""
    made = []
    cands = [r for r in rows if r["status"] == "ok" and r["method"] in TIMELYFREEZE_FAMILY and r["_trace"]
             and r["_plan"]]
    for schedule in sorted({r["schedule"] for r in cands}):
        rs = sorted((r for r in cands if r["schedule"] == schedule),
                    key=lambda r: (r["method"] != "timelyfreeze", -(r["knob_value"] or 0), str(r["seed"])))
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


# -------------------------------------------------------------------------------------- output
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
        return f"{v:.4f}" if "loss" in col else f"{v:.3f}"
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


def build_report(out: str | Path, tta_step: float | None = None, which: str = "stable",
                 planner: PlannerCLI | None = None, print_fn=print) -> dict[str, Any]:
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
    for c in configs:
        if c["pareto"] is None:
            warnings.append(f"{c['schedule']} {config_label(c['method'], c['knob_name'], c['knob_value'])}: "
                            f"no {which} throughput or loss, left out of the Pareto plot")
    write_csv(rep / "results.csv", rows, RESULT_COLUMNS)
    write_csv(rep / "configs.csv", configs, CONFIG_COLUMNS)
    write_csv(rep / "tta.csv", tta, TTA_COLUMNS)
    plots = []
    if plot_pareto(configs, rep / "pareto.png", loss_label, thr_label):
        plots.append(("Loss vs throughput, Pareto frontier circled", "pareto.png"))
    if plot_rmax(rmax_data(rows, planner, rep, warnings), rep / "throughput_vs_rmax.png",
                 "throughput, stable phase (tokens/s)"):
        plots.append(("Measured vs predicted throughput over r_max", "throughput_vs_rmax.png"))
    if plot_tta(tta, rep / "tta.png"):
        plots.append(("Time to accuracy", "tta.png"))
    for png, job_id in timelines(rows, planner, rep, warnings):
        plots.append((f"Timeline of {job_id}", png.name))
    counts = defaultdict(int)
    for r in rows:
        counts[r["status"]] += 1
    md = [f"# Sweep report: {out.resolve().name}", "",
          f"{len(rows)} jobs: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())), "",
          "## Jobs", "", md_table(rows, RESULT_COLUMNS), "",
          f"## Configurations (mean over ok seeds; loss = {loss_label}; tokens_per_s = {thr_label})", "",
          md_table(configs, CONFIG_COLUMNS), "",
          "## Time to accuracy", "",
          "kappa = stable throughput / no-freezing stable throughput (same schedule and seed); steps = first "
          "step the validation curve reaches the no-freezing loss at target_step; "
          "tta_ratio = (steps_method / steps_nf) / kappa (< 1: sooner than no freezing).", "",
          md_table(tta, TTA_COLUMNS), ""]
    if plots:
        md += ["## Plots", ""] + [f"### {title}\n\n![{title}]({name})\n" for title, name in plots]
    if warnings:
        md += ["## Warnings", ""] + [f"- {w}" for w in warnings] + [""]
    (rep / "report.md").write_text("\n".join(md))
    for w in warnings:
        print_fn(f"report: warning: {w}")
    print_fn(f"report: {len(rows)} jobs -> {rep / 'report.md'} ({len(plots)} plots)")
    return {"rows": rows, "configs": configs, "tta": tta, "plots": plots, "warnings": warnings, "dir": rep}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sweep.py report", description="Tables and plots of a sweep folder.")
    p.add_argument("out", help="the sweep folder (with jobs/)")
    p.add_argument("--tta-step", type=float, default=None,
                   help="no-freezing validation step whose loss is the TTA target (default: its last)")
    p.add_argument("--throughput", choices=("stable", "all"), default="stable",
                   help="throughput of the Pareto plot and configs table (default: stable phase)")
    p.add_argument("--no-planner", action="store_true", help="do not call python -m planner")
    p.add_argument("--python", default=sys.executable, help="python that runs the planner")
    args = p.parse_args(argv)
    if not (Path(args.out) / "jobs").is_dir():
        print(f"report: {args.out} has no jobs/ folder", file=sys.stderr)
        return 2
    build_report(args.out, args.tta_step, args.throughput, None if args.no_planner else PlannerCLI(args.python))
    return 0


if __name__ == "__main__":
    sys.exit(main())
