"""The end-of-run timeline PNG: measured upper-bound batch, planned batch, measured stable batch.

The measured panels show what happened: when global rank 0 could load the whole trace and its records
carry ``start_ms`` on one host, each is the phase's representative step (the step of the phase's median
span, ``planner.timing.spans``) with every action at its measured start and the step's measured end. Otherwise
(CUDA traces have no ``start_ms``; ranks on several hosts) they fall back to medians laid on the DAG's
longest path, and their titles say so: ``phase_medians`` reads one rank's trace file (median ms per action
in the upper and stable phases, and the mean applied ratio per action in the stable phase); global rank 0
merges every rank's (with several pipeline replicas, the per-action maximum over replicas, as the plan
combines them). A plot must never fail a finished run: ``draw`` returns None and logs why instead.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Callable

from planner.gantt import NO_TIMESTAMPS, measured_panel, plot_timeline
from planner.lp.budget import format_r_max
from planner.plan import load_plan
from planner.timing.spans import step_spans
from planner.trace.load import Trace, validate_meta


def phase_medians(trace_file: Path | None) -> dict[str, dict[str, float]]:
    """``{"upper": {action: ms}, "stable": {...}, "stable_ratio": {action: mean ratio}}`` of one rank."""
    if trace_file is None or not Path(trace_file).exists():
        return {}
    ms: dict[str, dict[str, list[float]]] = {}
    ratio: dict[str, list[float]] = {}
    with open(trace_file, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r["phase"] in ("upper", "stable"):
                ms.setdefault(r["phase"], {}).setdefault(r["action"], []).append(r["ms"])
            if r["phase"] == "stable":
                ratio.setdefault(r["action"], []).append(r["freeze_ratio"])
    out = {p: {a: statistics.median(v) for a, v in d.items()} for p, d in ms.items()}
    if ratio:
        out["stable_ratio"] = {a: statistics.fmean(v) for a, v in ratio.items()}
    return out


def merge(per_rank: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Every rank's medians in one dict per phase; an action several replicas ran gets the maximum."""
    merged: dict[str, dict[str, float]] = {}
    for g in per_rank:
        for phase, d in g.items():
            m = merged.setdefault(phase, {})
            for a, v in d.items():
                m[a] = max(v, m.get(a, v))
    return merged


def draw(
    meta: dict | None,
    medians: dict[str, dict[str, float]],
    plan_path: Path,
    trace_dir: Path,
    out: Path,
    log: Callable[[str], None],
    trace: Trace | None = None,
) -> str | None:
    """Write the timeline PNG to ``out``; its path, or None when there is nothing to draw or it failed.
    ``trace``: the whole trace, when rank 0 could load it (measured panels from its timestamps)."""
    if meta is None or "upper" not in medians:
        return None
    try:
        vmeta = validate_meta(meta, str(trace_dir))
        spans = step_spans(trace) if trace is not None else {}
        measured = {p: measured_panel(trace, p, spans) for p in ("upper", "stable")} if spans else {}
        if measured.get("upper"):
            panels: list = [measured["upper"][:2]]
            ratios: list = [measured["upper"][2]]
        else:
            panels = [(f"measured, nothing frozen (upper bound), {NO_TIMESTAMPS}", medians["upper"])]
            ratios = [None]
        if plan_path.exists():
            plan = load_plan(plan_path)
            panels.append(
                (f"planned (r_max {format_r_max(plan.r_max)})", {a: ap.duration for a, ap in plan.actions.items()})
            )
            ratios.append({a: ap.freeze_ratio for a, ap in plan.actions.items()})
        if measured.get("stable"):
            panels.append(measured["stable"][:2])
            ratios.append(measured["stable"][2])
        elif "stable" in medians and len(medians["stable"]) == len(medians["upper"]):
            panels.append((f"measured, stable phase (mean applied ratios), {NO_TIMESTAMPS}", medians["stable"]))
            ratios.append(medians.get("stable_ratio"))
        plot_timeline(vmeta, panels, out, ratios=ratios)
        return str(out)
    except Exception as e:
        log(f"[freeze] timeline not drawn: {type(e).__name__}: {e}")
        return None
