"""A sweep folder's job outputs -> one results row per job (``RESULT_COLUMNS`` plus private keys).

Reads ``<out>/jobs/<job_id>/job.json`` and ``<out>/jobs/<job_id>/dump/timelyfreeze/{summary.json,
metrics.jsonl,trace/ or trace.tar.gz,plan.json,timeline.png}`` (docs/run-outputs.md). Jobs without a summary.json
(failed, interrupted) get what their metrics.jsonl holds.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from planner.trace.archive import TRACE_NAME, find_trace

RESULT_COLUMNS = [
    "job_id",
    "method",
    "knob_name",
    "knob_value",
    "matched_to",
    "schedule",
    "seed",
    "steps",
    "tokens_per_s_stable",
    "tokens_per_s_all",
    "mean_batch_ms_stable",
    "mean_batch_ms_all",
    "predicted_batch_ms",
    "speedup_in_run",
    "avg_freeze_ratio",
    "final_loss",
    "val_loss",
    "val_acc",
    "status",
]


def fmt_knob(v: Any) -> str:
    return "" if v is None else format(v, "g") if isinstance(v, (int, float)) else str(v)


def config_label(method: str, knob_name: str | None, knob_value: Any) -> str:
    return method if knob_name is None else f"{method} {knob_name}={fmt_knob(knob_value)}"


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


def num(x: Any) -> float | None:
    """``x`` as a float when it is a finite number (not a bool), else None."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _parse_job_id(job_id: str) -> dict[str, Any]:
    """``1F1B__timelyfreeze__r_max=0.8__seed=0`` -> its parts (for jobs that left no job.json/summary)."""
    parts = job_id.split("__")
    info: dict[str, Any] = {
        "schedule": parts[0] if parts else None,
        "method": parts[1] if len(parts) > 1 else None,
        "knob": None,
        "seed": None,
    }
    for p in parts[2:]:
        k, _, v = p.partition("=")
        if k == "seed":
            info["seed"] = int(v) if v.lstrip("-").isdigit() else v
        elif k == "repeat":  # a bracketed block's second run of its first job
            info["repeat"] = int(v) if v.isdigit() else v
        elif v:
            try:
                info["knob"] = {"name": k, "value": float(v)}
            except ValueError:  # a matched job: ratio=matched-timelyfreeze-r_max0.6
                info["knob"] = {"name": k, "value": v.split("-")[0]}
    return info


def cell_knob(row: dict[str, Any]) -> Any:
    """The knob value that tells a row's cell apart: its ``knob_value``, or for a matched job
    ``matched(<the matched cell>)``, e.g. ``matched(timelyfreeze r_max=0.6)`` (each matched cell is its own)."""
    target = row.get("matched_to")
    if not target:
        return row.get("knob_value")
    parts = str(target).split("__")[1:-1]  # drop schedule and seed
    return f"matched({' '.join(parts)})"


def knob_sort_key(v: Any) -> tuple[int, float, str]:
    """Orders knob values that may mix numbers, None and text (``matched``): numbers first."""
    return (0, v, "") if num(v) is not None else (1, 0.0, "" if v is None else str(v))


def metrics_figures(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """What a run's metrics.jsonl alone gives (for runs without summary.json)."""
    if not metrics:
        return {}
    tokens = secs = 0.0
    for m in metrics:
        tps, ms = num(m.get("tokens_per_s")), num(m.get("step_ms"))
        if tps is not None and ms is not None:
            tokens += tps * ms / 1000.0
            secs += ms / 1000.0
    losses = [(m["step"], num(m.get("loss"))) for m in metrics if num(m.get("loss")) is not None]
    batch = [num(m.get("batch_ms")) for m in metrics if num(m.get("batch_ms")) is not None]
    ratios = [num(m.get("freeze_ratio")) for m in metrics if num(m.get("freeze_ratio")) is not None]
    return {
        "steps": max(m["step"] for m in metrics),
        "tokens_per_s_all": tokens / secs if secs > 0 else None,
        "mean_batch_ms_all": statistics.fmean(batch) if batch else None,
        "avg_freeze_ratio": statistics.fmean(ratios) if ratios else None,
        "final_loss": losses[-1][1] if losses else None,
        "val_curve": val_curve_from_metrics(metrics),
        "val_acc": next((num(m.get("val_acc")) for m in reversed(metrics) if num(m.get("val_acc")) is not None), None),
    }


def val_curve_from_metrics(metrics: list[dict[str, Any]]) -> list[list[float]]:
    return [[m["step"], float(m["val_loss"])] for m in metrics if num(m.get("val_loss")) is not None]


UNFROZEN_PHASES = ("warmup", "upper")
TRANSIENT_PHASES = ("warmup", "upper", "lower", "progressive", "bootstrap")


def steady_rows(metrics: list[dict[str, Any]], field: str) -> list[dict[str, Any]]:
    """The step rows with a number in ``field`` of the run's steady phase: ``stable``, or for a run without one
    (step-level methods, no freezing) every step outside the transient phases."""
    rows = [m for m in metrics if "phase" in m and num(m.get(field)) is not None]
    return [m for m in rows if m["phase"] == "stable"] or [m for m in rows if m["phase"] not in TRANSIENT_PHASES]


def in_run_speedup(metrics: list[dict[str, Any]]) -> float | None:
    """Median batch time of the run's own unfrozen steps (warm-up after step 1, upper-bound monitoring)
    over the median of its steady steps (:func:`steady_rows`). Both sides come from the same job, so machine
    drift between jobs cancels."""
    rows = [m for m in metrics if "phase" in m and num(m.get("batch_ms")) is not None]
    base = [m["batch_ms"] for m in rows if m["phase"] in UNFROZEN_PHASES and m["step"] > 1]
    stable = [m["batch_ms"] for m in steady_rows(metrics, "batch_ms")]
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
        "matched_to": (job.get("spec") or {}).get("matched_to"),
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
            tokens_per_s_stable=num(tps.get("stable")),
            tokens_per_s_all=num(tps.get("all")),
            mean_batch_ms_stable=num(mb.get("stable")),
            mean_batch_ms_all=num(mb.get("all")),
            predicted_batch_ms=num(pred.get("planned")),
            speedup_in_run=in_run_speedup(metrics),
            avg_freeze_ratio=num(summary.get("avg_freeze_ratio")),
            final_loss=num(summary.get("final_loss")),
            val_loss=num(summary.get("val_loss")),
            val_acc=num(summary.get("val_acc")),
        )
        curve = summary.get("val_curve") or val_curve_from_metrics(metrics)
        row["_predicted"] = pred
        row["_tokens_per_step"] = num(summary.get("tokens_per_step"))
    else:
        fig = metrics_figures(metrics)
        curve = fig.pop("val_curve", [])
        row.update(fig)
        row["val_loss"] = curve[-1][1] if curve else None
        row["_predicted"] = {}
        row["_tokens_per_step"] = None
    for c in RESULT_COLUMNS:
        row.setdefault(c, None)
    row["_val_curve"] = sorted(([float(s), float(v)] for s, v in curve if num(v) is not None), key=lambda p: p[0])
    row["_step_ms"] = {m["step"]: float(m["step_ms"]) for m in metrics if num(m.get("step_ms")) is not None}
    row["_dir"] = job_dir
    row["_start"] = (job.get("spec") or {}).get("start_sha256")  # the pre-trained checkpoint it started from
    row["_repeat"] = spec.get("repeat") or 0  # 1: a bracketed block's second run of its first job
    row["_started"], row["_ended"] = job.get("start_time"), job.get("end_time")  # ISO times (job.json)
    row["_trace"] = find_trace(tf / TRACE_NAME)  # the folder, or its trace.tar.gz once packed
    row["_plan"] = tf / "plan.json" if (tf / "plan.json").is_file() else None
    row["_timeline"] = tf / "timeline.png" if (tf / "timeline.png").is_file() else None
    return row


def load_rows(out: str | Path) -> list[dict[str, Any]]:
    jobs = Path(out) / "jobs"
    if not jobs.is_dir():
        return []
    rows = [load_job(d) for d in sorted(jobs.iterdir()) if d.is_dir()]
    return sorted(
        rows,
        key=lambda r: (
            str(r["schedule"]),
            str(r["method"]),
            knob_sort_key(r["knob_value"]),
            str(r["matched_to"]),
            str(r["seed"]),
        ),
    )


def throughput(row: dict[str, Any], which: str = "stable") -> float | None:
    return row.get(f"tokens_per_s_{which}")
