"""Per-cell statistics over seeds: the mean and 95 % interval of each paired quantity, and what they resolve; the
one home of the intervals every report states (``mean_ci``: Student-t, 95 %; ``median_ci``: order statistics, with
the coverage it really has, which a report prints beside it).

A cell is one (schedule, method, knob value). Over its seeds' paired rows (``tta.tta_rows``) each quantity
gets its mean and a two-sided 95 % Student-t interval of the mean (``mean +- t(0.975, n-1) * sd / sqrt(n)``;
none with one seed). Verdicts are stated only where the interval excludes the no-change value:

- throughput: ``kappa`` and ``speedup_in_run`` vs 1 ("faster" / "slower" / "no difference resolved");
- accuracy: ``dval`` (validation loss minus the no-freezing run's, same seed and step) vs 0 ("worse" /
  "better" / "no difference resolved");
- time to accuracy: ``tta_ratio`` vs 1 ("sooner" / "later" / ...), over the seeds that reached the target;
  ``reached`` says how many did, of the ``targets`` seeds whose no-freezing run keeps its target (where it
  does not, nothing is measured); ``tta_ratio_bound`` counts every seed with a target, a censored one at its
  bound (a lower bound of the cell's mean: its interval means nothing, and no verdict is drawn from it).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any, Iterable, Sequence

from scipy.stats import binomtest, linregress
from scipy.stats import t as student_t

from timelyfreeze.experiments.sweep.grid import NO_FREEZING
from timelyfreeze.experiments.sweep.results import knob_sort_key, num

QUANTITIES = (
    "kappa",
    "speedup_in_run",
    "predicted_speedup",
    "dval",
    "steps_ratio",
    "tta_ratio",
    "tta_ratio_bound",
    "wall_s_diff",
)
CELL_COLUMNS = (
    ["schedule", "method", "knob_name", "knob_value", "seeds", "targets", "reached"]
    + [f"{q}_{s}" for q in QUANTITIES for s in ("mean", "lo", "hi")]
    + ["throughput", "accuracy", "time_to_accuracy"]
)
NO_DIFFERENCE = "no difference resolved"


def t_quantile(dof: int) -> float:
    """The 0.975 quantile of Student's t with ``dof`` degrees of freedom."""

    return float(student_t.ppf(0.975, dof))


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


def median_ci(values, level: float = 0.95) -> tuple[float, float | None, float | None, float | None]:
    """(median, low, high, coverage): the distribution-free interval of the median from order statistics (the
    sign test's): the k-th smallest and k-th largest values with the largest k whose two-sided miss probability
    2 P(Binomial(n, 1/2) < k) stays within 1 - ``level``; no interval (None) when even the extremes miss more
    often (n < 6 at 95 %)."""
    xs = sorted(values)
    n = len(xs)
    k, tail, cdf = 0, 0.0, 0.0
    for j in range(n):
        cdf += math.comb(n, j) / 2**n
        if 2 * cdf > 1 - level:
            break
        k, tail = j + 1, cdf
    if k == 0:
        return statistics.median(xs), None, None, None
    return statistics.median(xs), xs[k - 1], xs[n - k], 1 - 2 * tail


def half_width(sd: float, n: int) -> float:
    """The half-width of the 95 % Student-t interval of a mean of ``n >= 2`` values whose SD is ``sd``."""
    return t_quantile(n - 1) * sd / math.sqrt(n)


def n_for_half_width(sd: float, target: float, n_max: int = 10_000) -> int | None:
    """The fewest values (>= 2) whose 95 % interval of the mean is at most ``target`` wide on each side, at SD
    ``sd``; None beyond ``n_max``."""
    return next((n for n in range(2, n_max + 1) if half_width(sd, n) <= target), None)


def pooled_sd(groups: Iterable[Sequence[float]]) -> tuple[float | None, int]:
    """(SD pooled within groups, its degrees of freedom): each group's spread about its own mean (groups of one
    value add nothing); None without any degree of freedom."""
    ss, dof = 0.0, 0
    for g in groups:
        if len(g) > 1:
            ss += statistics.variance(g) * (len(g) - 1)
            dof += len(g) - 1
    return (math.sqrt(ss / dof) if dof else None), dof


def mcnemar(right_a: str, right_b: str) -> tuple[int, int, float]:
    """The exact McNemar test of two runs' answers to the same questions, paired per question: ``(b, c, p)``,
    ``b`` the questions only ``a`` got right, ``c`` those only ``b`` got right, ``p`` the two-sided exact p-value
    (under no difference each discordant question is ``a``'s with probability 1/2: a binomial test of ``b`` in
    ``b + c``; 1.0 without discordant questions). ``right_*``: one ``"1"`` (right) or ``"0"`` per question
    (``choice_task.Accuracy.right``)."""
    if len(right_a) != len(right_b) or set(right_a + right_b) - {"0", "1"}:
        raise ValueError(
            f"per-question answers must be equally long strings of 0 and 1 ({len(right_a)}, {len(right_b)})"
        )
    b = sum(x == "1" and y == "0" for x, y in zip(right_a, right_b))
    c = sum(x == "0" and y == "1" for x, y in zip(right_a, right_b))
    return b, c, (float(binomtest(b, b + c, 0.5).pvalue) if b + c else 1.0)


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


def by_cell(
    rows: Sequence[dict[str, Any]], quantities: Sequence[str]
) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """The rows grouped by cell (schedule, method, knob name and value), in first-seen order: per cell its head
    (those four, ``seeds``, and ``<q>_mean``, ``<q>_lo``, ``<q>_hi`` of each of ``quantities`` over its rows:
    ``mean_ci``) and its rows. The one grouping every per-cell report uses."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["schedule"], r["method"], r["knob_name"], r["knob_value"])].append(r)
    out = []
    for (schedule, method, kname, kval), rs in groups.items():
        c: dict[str, Any] = {"schedule": schedule, "method": method, "knob_name": kname, "knob_value": kval}
        c["seeds"] = len(rs)
        for q in quantities:
            c[f"{q}_mean"], c[f"{q}_lo"], c[f"{q}_hi"], _ = mean_ci(r.get(q) for r in rs)
        out.append((c, rs))
    return out


def cell_stats(paired: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per cell (``CELL_COLUMNS``) from the paired rows of its seeds."""
    cells = []
    for c, ts in by_cell(paired, QUANTITIES):
        method = c["method"]
        c["targets"] = sum(t.get("steps_nf") is not None for t in ts)
        c["reached"] = sum(t["steps_method"] is not None for t in ts)
        reference = method == NO_FREEZING  # its paired values are 1 and 0 by definition: no verdicts
        c["throughput"] = None if reference else verdict(c["kappa_lo"], c["kappa_hi"], 1.0, "faster", "slower")
        c["accuracy"] = None if reference else verdict(c["dval_lo"], c["dval_hi"], 0.0, "worse", "better")
        c["time_to_accuracy"] = (
            None if reference else verdict(c["tta_ratio_lo"], c["tta_ratio_hi"], 1.0, "later", "sooner")
        )
        cells.append(c)
    return sorted(
        cells,
        key=lambda c: (
            str(c["schedule"]),
            c["method"] != NO_FREEZING,
            str(c["method"]),
            knob_sort_key(c["knob_value"]),
        ),
    )


def fmt_ci(mean: float | None, lo: float | None, hi: float | None, digits: int = 3) -> str:
    """``1.123 [1.050, 1.196]``, or the mean alone without an interval, or empty."""
    if mean is None:
        return ""
    text = f"{mean:.{digits}f}"
    return text if lo is None else f"{text} [{lo:.{digits}f}, {hi:.{digits}f}]"


TREND_COLUMNS = ["schedule", "method", "quantity", "runs", "slope", "slope_lo", "slope_hi", "intercept", "verdict"]


def knob_trends(
    paired: Sequence[dict[str, Any]],
    quantities: Sequence[str] = ("dval", "speedup_in_run", "kappa"),
) -> list[dict[str, Any]]:
    """Per (schedule, knob-carrying method) with at least three runs over two or more knob values: the least-squares
    slope of each quantity over the knob, pooling every seed (e.g. how much validation loss each +1 of r_max costs),
    with its 95 % interval (``slope +- t(0.975, n-2) * standard error``). Pooling the seeds of all values resolves
    a steady trend that per-value intervals over three seeds leave open."""

    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for t in paired:
        if num(t["knob_value"]) is not None:  # numbers only (not a matched cell)
            groups[(t["schedule"], t["method"])].append(t)
    out = []
    for (schedule, method), ts in sorted(groups.items()):
        for q in quantities:
            pts = [(float(t["knob_value"]), float(t[q])) for t in ts if t.get(q) is not None and math.isfinite(t[q])]
            if len(pts) < 3 or len({x for x, _ in pts}) < 2:
                continue
            fit = linregress([x for x, _ in pts], [y for _, y in pts])
            half = t_quantile(len(pts) - 2) * fit.stderr
            lo, hi = fit.slope - half, fit.slope + half
            out.append(
                {
                    "schedule": schedule,
                    "method": method,
                    "quantity": q,
                    "runs": len(pts),
                    "slope": fit.slope,
                    "slope_lo": lo,
                    "slope_hi": hi,
                    "intercept": fit.intercept,
                    "verdict": verdict(lo, hi, 0.0, "rises", "falls"),
                }
            )
    return out
