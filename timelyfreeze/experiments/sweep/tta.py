"""Each run against the no-freezing run of the same schedule and seed (the paired comparison), with its
time to accuracy. Both must have started from the same pre-trained checkpoint (the sweep records it as
``start_sha256`` in each job's spec; jobs without one pair with each other).

- ``kappa`` = the run's stable-phase throughput / the no-freezing run's (across jobs: machine drift between
  the two jobs is in it); ``speedup_in_run`` (``results.in_run_speedup``) is the same job's unfrozen over
  steady batch time, which drift between jobs does not touch; ``predicted_speedup`` is what the run's own plan
  predicted (no-freeze over planned batch time; planned methods only).
- ``target_loss``: the no-freezing validation loss at ``target_step`` (default its last validation point;
  linear interpolation between points). ``val_loss_same_step`` is the run's validation loss at that step and
  ``dval`` = it minus the target (> 0: worse than no freezing at the same number of steps).
- ``steps_method``: the step from which the run's validation curve stays at or below the target to its end
  (``steps_to_reach``; linear interpolation between points); the no-freezing run is measured the same way
  (``steps_nf``). A run extended by the sweep (``extend_to_target``) trains on past ``target_step`` until a
  validation gets there, and stops.
- ``wall_s_method`` / ``wall_s_nf``: training time to that step, the sum of the run's own step times
  (``metrics.jsonl`` ``step_ms``: forward, backward and optimizer; start-up, validation and checkpoints
  excluded), the last step counted by the fraction reached. ``tta_ratio = wall_s_method / wall_s_nf``
  (< 1: the run reaches the no-freezing accuracy sooner in wall-clock time).
- ``tta_ratio_nf_end`` (not in ``TTA_COLUMNS``; ``report.sensitivity_md``): the same run's wall-clock over the
  no-freezing run's to ``target_step`` itself rather than to the step from which it stays at or below its target:
  the reading that does not rest on the "stays at or below" rule where the no-freezing curve rose at its end.
- ``tta_ratio_bound``: the same, with a run that never reached the target (censored) at its bound, its
  wall-clock to its last step over the no-freezing run's: a lower bound of the ratio it would have had.
- ``wall_s_diff``: the paired difference of the two wall-clocks to the target, in seconds (< 0: sooner).
- ``flattening``: whether the no-freezing curve had flattened (its last quarter's fall against its whole fall).
- A no-freezing run whose curve ends above its own loss at ``target_step`` (it rose after that step) does not
  keep that target, so nothing is measured against it; the row says so.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from timelyfreeze.experiments.sweep.grid import NO_FREEZING
from timelyfreeze.experiments.sweep.results import cell_knob, num, throughput

TTA_COLUMNS = [
    "job_id",
    "schedule",
    "method",
    "knob_name",
    "knob_value",
    "seed",
    "steps",
    "kappa",
    "speedup_in_run",
    "predicted_speedup",
    "target_step",
    "target_loss",
    "val_loss_same_step",
    "dval",
    "steps_nf",
    "steps_method",
    "steps_ratio",
    "wall_s_nf",
    "wall_s_method",
    "tta_ratio",
    "tta_ratio_bound",
    "wall_s_diff",
    "note",
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
    """The step from which the (linearly interpolated) validation curve stays at or below ``target`` to its
    end: the crossing into its last run of points at or below it (its first point if every point is); None
    when its last point is above. A validation curve fluctuates by more than a short fine-tune moves it, so
    the first touch of the target would date accuracy by noise; reaching it for good is what a run keeps."""
    if not curve or curve[-1][1] > target:
        return None
    above = [i for i, (_, loss) in enumerate(curve) if loss > target]
    if not above:
        return float(curve[0][0])
    (s0, l0), (s1, l1) = curve[above[-1]], curve[above[-1] + 1]
    return s0 + (l0 - target) / (l0 - l1) * (s1 - s0)  # l0 > target >= l1, so l0 > l1


def wall_to_step(step_ms: Mapping[int, float], step: float) -> float | None:
    """Seconds of training up to (fractional) ``step``: steps 1..floor(step) whole, then the fraction of the
    next; None when a needed step's time is missing."""
    whole = int(math.floor(step))
    need = range(1, whole + 1)
    if any(s not in step_ms for s in need):
        return None
    total = sum(step_ms[s] for s in need)
    frac = step - whole
    if frac > 0:
        if whole + 1 not in step_ms:
            return None
        total += frac * step_ms[whole + 1]
    return total / 1e3


def reference_runs(rows: list[dict[str, Any]], min_points: int) -> dict[str, dict[str, Any]]:
    """Per schedule, its first ok no-freezing run with at least ``min_points`` validation points: the curve the
    plot's targets and the flattening check read (in a sweep whose start, data and validation are the same in
    every seed, every seed's no-freezing run has the same curve)."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["method"] == NO_FREEZING and r["status"] == "ok" and len(r.get("_val_curve") or []) >= min_points:
            out.setdefault(r["schedule"], r)
    return out


def tta_targets(rows: list[dict[str, Any]], tta_step: float | None = None) -> dict[str, list[tuple[str, float]]]:
    """Per schedule, the targets of the time-to-accuracy plot: the no-freezing run's final validation loss and,
    with ``tta_step``, its loss at that step (``reference_runs``)."""
    out: dict[str, list[tuple[str, float]]] = {}
    for schedule, r in reference_runs(rows, 1).items():
        curve = r["_val_curve"]
        out[schedule] = [(f"no freezing, final (step {curve[-1][0]:g})", float(curve[-1][1]))]
        at = None if tta_step is None else interp_at(curve, float(tta_step))
        if at is not None:
            out[schedule].append((f"no freezing, step {float(tta_step):g}", at))
    return out


def tta_rows(rows: list[dict[str, Any]], tta_step: float | None = None) -> list[dict[str, Any]]:
    """The paired comparison and time to accuracy of every ok job against the no-freezing job of its
    schedule and seed that started from the same pre-trained checkpoint (``_start``; the no-freezing job gets
    its own row: kappa 1, dval 0)."""
    base = {
        (r["schedule"], r["seed"], r.get("_start")): r
        for r in rows
        if r["method"] == NO_FREEZING and r["status"] == "ok"
    }
    out = []
    for r in rows:
        if r["status"] != "ok":
            continue
        t = {c: None for c in TTA_COLUMNS}
        t.update(
            {k: r.get(k) for k in ("job_id", "schedule", "method", "knob_name", "seed", "steps", "speedup_in_run")}
            | {"knob_value": cell_knob(r)}
        )
        pred = r.get("_predicted") or {}
        if num(pred.get("no_freeze")) and num(pred.get("planned")):
            t["predicted_speedup"] = pred["no_freeze"] / pred["planned"]
        out.append(t)
        nf = base.get((r["schedule"], r["seed"], r.get("_start")))
        if nf is None:
            t["note"] = "no no-freezing run of this schedule and seed (from the same pre-trained checkpoint)"
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
        same = interp_at(r["_val_curve"], step)
        if same is not None:
            t["val_loss_same_step"], t["dval"] = same, same - target
        t["steps_nf"] = steps_to_reach(nf_curve, target)
        if t["steps_nf"] is None:
            t["note"] = (
                f"the no-freezing run does not keep its own loss at step {step:g} ({target:.4f}): "
                f"its curve ends at {nf_curve[-1][1]:.4f}"
            )
            continue
        t["wall_s_nf"] = wall_to_step(nf.get("_step_ms") or {}, t["steps_nf"])
        t["steps_method"] = steps_to_reach(r["_val_curve"], target)
        if t["steps_method"] is None:
            last = r["_val_curve"][-1][0] if r["_val_curve"] else None
            t["note"] = f"not reached within {last:g} steps" if last is not None else "no validation curve"
            bound = None if last is None else wall_to_step(r.get("_step_ms") or {}, last)
            if bound is not None and t["wall_s_nf"]:
                t["tta_ratio_bound"] = bound / t["wall_s_nf"]
            continue
        t["steps_ratio"] = t["steps_method"] / t["steps_nf"]
        t["wall_s_method"] = wall_to_step(r.get("_step_ms") or {}, t["steps_method"])
        if t["wall_s_method"] is None or not t["wall_s_nf"]:
            t["note"] = "step times missing from metrics.jsonl"
            continue
        t["tta_ratio"] = t["tta_ratio_bound"] = t["wall_s_method"] / t["wall_s_nf"]
        nf_end = wall_to_step(nf.get("_step_ms") or {}, step)
        t["tta_ratio_nf_end"] = t["wall_s_method"] / nf_end if nf_end else None
        t["wall_s_diff"] = t["wall_s_method"] - t["wall_s_nf"]
    return out


FLATTENING_COLUMNS = [
    "schedule",
    "job_id",
    "first_step",
    "quarter_step",
    "last_step",
    "fall_total",
    "fall_last_quarter",
    "share",
    "flattened",
]
FLATTENED_SHARE = 0.10
"""A no-freezing curve has flattened when its last quarter fell by less than this share of its whole fall."""


def flattening(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per schedule, the flattening check of its no-freezing run's validation curve (``reference_runs``): the fall from
    its first validation to its last (``fall_total``), the fall over the last quarter of its steps
    (``fall_last_quarter``, from the loss interpolated at 75 % of its last step), their ratio, and whether that
    is below ``FLATTENED_SHARE``."""
    out: dict[str, dict[str, Any]] = {}
    for schedule, r in reference_runs(rows, 2).items():
        curve = r["_val_curve"]
        first, last = curve[0], curve[-1]
        quarter = 0.75 * last[0]
        at = interp_at(curve, quarter)
        total = first[1] - last[1]
        tail = None if at is None else at - last[1]
        share = tail / total if tail is not None and total > 0 else None
        out[schedule] = {
            "schedule": schedule,
            "job_id": r["job_id"],
            "first_step": first[0],
            "quarter_step": quarter,
            "last_step": last[0],
            "fall_total": total,
            "fall_last_quarter": tail,
            "share": share,
            "flattened": None if share is None else share < FLATTENED_SHARE,
        }
    return [out[k] for k in sorted(out)]
