"""Time-to-accuracy of each run against the no-freezing run of the same schedule and seed.

``kappa`` = the job's stable-phase throughput / the no-freezing job's; the target is the no-freezing
validation loss at ``tta_step`` (default its last validation point, linear interpolation between
validation points); ``steps`` = the first step a run's validation curve reaches the target (linear
interpolation; the first validation point if already there; the no-freezing run is measured the same
way); ``tta_ratio = (steps_method / steps_nf) / kappa`` (< 1: the method reaches the no-freezing
accuracy sooner in wall-clock time, under the stable-phase per-step time). Only runs of the same
length as the baseline are compared (seeds digest 1.12).
"""

from __future__ import annotations

from typing import Any, Sequence

from timelyfreeze.experiments.grid import NO_FREEZING
from timelyfreeze.experiments.results import throughput

TTA_COLUMNS = [
    "job_id", "schedule", "method", "knob_name", "knob_value", "seed", "kappa", "target_step",
    "target_loss", "steps_nf", "steps_method", "steps_ratio", "tta_ratio", "note",
]


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
    base = {(r["schedule"], r["seed"]): r for r in rows if r["method"] == NO_FREEZING and r["status"] == "ok"}
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
