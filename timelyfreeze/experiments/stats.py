"""Per-cell statistics over seeds: the mean and 95 % interval of each paired quantity, and what they resolve.

A cell is one (schedule, method, knob value). Over its seeds' paired rows (``tta.tta_rows``) each quantity
gets its mean and a two-sided 95 % Student-t interval of the mean (``mean +- t(0.975, n-1) * sd / sqrt(n)``;
none with one seed). Verdicts are stated only where the interval excludes the no-change value:

- throughput: ``kappa`` and ``speedup_in_run`` vs 1 ("faster" / "slower" / "no difference resolved");
- accuracy: ``dval`` (validation loss minus the no-freezing run's, same seed and step) vs 0 ("worse" /
  "better" / "no difference resolved");
- time to accuracy: ``tta_ratio`` vs 1 ("sooner" / "later" / ...), over the seeds that reached the target;
  ``reached`` says how many did.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any, Iterable, Sequence

QUANTITIES = ("kappa", "speedup_in_run", "predicted_speedup", "dval", "steps_ratio", "tta_ratio")
CELL_COLUMNS = (["schedule", "method", "knob_name", "knob_value", "seeds", "reached"]
                + [f"{q}_{s}" for q in QUANTITIES for s in ("mean", "lo", "hi")]
                + ["throughput", "accuracy", "time_to_accuracy"])
NO_DIFFERENCE = "no difference resolved"


def t_quantile(dof: int) -> float:
    """The 0.975 quantile of Student's t with ``dof`` degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(0.975, dof))


def mean_ci(values: Iterable[float | None]) -> tuple[float | None, float | None, float | None, int]:
    """(mean, low, high, n) of the finite values; the interval is None below two values."""
    vals = [float(v) for v in values if v is not None and math.isfinite(v)]
    n = len(vals)
    if n == 0:
        return None, None, None, 0
    m = statistics.fmean(vals)
    if n < 2:
        return m, None, None, n
    half = t_quantile(n - 1) * statistics.stdev(vals) / math.sqrt(n)
    return m, m - half, m + half, n


def verdict(lo: float | None, hi: float | None, null: float, above: str, below: str) -> str | None:
    """``above`` when the interval lies above ``null``, ``below`` when under it, else no difference; None
    without an interval."""
    if lo is None or hi is None:
        return None
    if lo > null:
        return above
    if hi < null:
        return below
    return NO_DIFFERENCE


def cell_stats(paired: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per cell (``CELL_COLUMNS``) from the paired rows of its seeds."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for t in paired:
        groups[(t["schedule"], t["method"], t["knob_name"], t["knob_value"])].append(t)
    cells = []
    for (schedule, method, kname, kval), ts in groups.items():
        c: dict[str, Any] = {"schedule": schedule, "method": method, "knob_name": kname, "knob_value": kval,
                             "seeds": len(ts), "reached": sum(t["steps_method"] is not None for t in ts)}
        for q in QUANTITIES:
            c[f"{q}_mean"], c[f"{q}_lo"], c[f"{q}_hi"], _ = mean_ci(t.get(q) for t in ts)
        c["throughput"] = verdict(c["kappa_lo"], c["kappa_hi"], 1.0, "faster", "slower")
        c["accuracy"] = verdict(c["dval_lo"], c["dval_hi"], 0.0, "worse", "better")
        c["time_to_accuracy"] = verdict(c["tta_ratio_lo"], c["tta_ratio_hi"], 1.0, "later", "sooner")
        cells.append(c)
    return sorted(cells, key=lambda c: (str(c["schedule"]), c["method"] != "none", str(c["method"]),
                                        c["knob_value"] or 0))


def fmt_ci(mean: float | None, lo: float | None, hi: float | None, digits: int = 3) -> str:
    """``1.123 [1.050, 1.196]``, or the mean alone without an interval, or empty."""
    if mean is None:
        return ""
    text = f"{mean:.{digits}f}"
    return text if lo is None else f"{text} [{lo:.{digits}f}, {hi:.{digits}f}]"
