"""Issue 27's figures of finished runs, from their ``summary.json`` and ``metrics.jsonl`` alone (spans from
``start_ms``, like with like):

- **stable span vs the plan in force**: per stable step, its pipeline span (``step_span_ms``) over the
  ``predicted_batch_ms`` of its metrics row (the plan in force then, times the machine factor of the last
  rescale); the run's median over its stable steps;
- **upper span vs the no-freeze prediction**: the upper-bound window's median span over the first plan's
  ``no_freeze`` batch time;
- **share of the predicted speed-up**, from spans, raw and with the F factor taken out (``summary.speedup``);
- re-plans, kept re-plans (due but buying less than ``replan_min_gain``), rescales, the lower window's F
  factor and monitoring warnings.

Per schedule, the median [min, max] over runs; with ``--intervals`` also the shares and re-plans as mean
[95 % interval] (``python scripts/span_figures.py [--intervals] FOLDER...``).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from timelyfreeze.experiments.stats import fmt_ci, mean_ci

COLUMNS = ["stable_vs_plan", "upper_vs_no_freeze", "share_f", "share", "replans", "kept", "rescales", "lower_f"]


def run_figures(folder: Path) -> dict[str, Any] | None:
    """One run's figures (``COLUMNS`` plus ``schedule`` and ``run``); None without a stable phase."""
    s = json.loads((folder / "summary.json").read_text())
    span = {int(k): v for k, v in s.get("step_span_ms") or []}
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    errs = [
        span[r["step"]] / r["predicted_batch_ms"] - 1
        for r in rows
        if r.get("phase") == "stable" and r.get("step") in span and r.get("predicted_batch_ms")
    ]
    upper, no_freeze = (s.get("span_ms") or {}).get("upper"), (s.get("predicted_batch_ms") or {}).get("no_freeze")
    if not errs or not upper or not no_freeze:
        return None
    monitoring, speedup = s.get("monitoring") or {}, s.get("speedup") or {}
    return {
        "odd_even": odd_even(rows),
        "run": folder.parent.name,
        "schedule": s["schedule"],
        "stable_vs_plan": statistics.median(errs),
        "upper_vs_no_freeze": upper / no_freeze - 1,
        "share_f": speedup.get("share_span_f_corrected"),
        "share": speedup.get("share_span"),
        "replans": len(s.get("replans") or []),
        "kept": sum(1 for e in monitoring.get("rescales") or [] if e.get("kept_replan")),
        "rescales": sum(1 for e in monitoring.get("rescales") or [] if not e.get("kept_replan")),
        "lower_f": ((monitoring.get("factors") or {}).get("lower") or [None])[0],
    }


def odd_even(rows: list[dict]) -> float | None:
    """The stable phase's odd steps against its even ones: the mean over odd steps of (the step's ``step_ms``
    over the mean of its two neighbours' - 1), minus the same over even steps (a linear drift cancels);
    about 4x the relative difference of odd and even steps' own times. None with too few steps."""
    ms = {r["step"]: r["step_ms"] for r in rows if r.get("phase") == "stable" and "step_ms" in r}
    rel: dict[int, list[float]] = {0: [], 1: []}
    for k, v in ms.items():
        if k - 1 in ms and k + 1 in ms:
            rel[k % 2].append(v / ((ms[k - 1] + ms[k + 1]) / 2) - 1)
    return statistics.fmean(rel[1]) - statistics.fmean(rel[0]) if rel[0] and rel[1] else None


def table(folders: list[Path], intervals: bool = False) -> str:
    """The median [min, max] table of the runs under ``folders`` (and, with ``intervals``, the shares and
    re-plans as mean [95 % interval]), then the odd/even line."""
    runs = [r for f in folders for d in sorted(Path(f).glob("**/summary.json")) if (r := run_figures(d.parent))]
    lines = [
        "| schedule | runs | stable span vs plan in force | upper span vs no-freeze | share (F factor out) | share "
        "(raw) | re-plans | kept re-plans | rescales |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for schedule in sorted({r["schedule"] for r in runs}):
        rs = [r for r in runs if r["schedule"] == schedule]

        def cell(key: str, pct: bool) -> str:
            vals = [r[key] for r in rs if r[key] is not None]
            if not vals:
                return "n/a"
            med, lo, hi = statistics.median(vals), min(vals), max(vals)
            if pct:
                return f"{100 * med:+.1f} % [{100 * lo:+.1f}, {100 * hi:+.1f}]"
            return f"{med:.2f} [{lo:.2f}, {hi:.2f}]" if key.startswith("share") else f"{med:g} [{lo:g}, {hi:g}]"

        lines.append(
            f"| {schedule} | {len(rs)} | {cell('stable_vs_plan', True)} | {cell('upper_vs_no_freeze', True)} | "
            f"{cell('share_f', False)} | {cell('share', False)} | {cell('replans', False)} | "
            f"{cell('kept', False)} | {cell('rescales', False)} |"
        )

    if intervals:
        lines += interval_lines(runs)
    m, lo, hi, n = mean_ci(r["odd_even"] for r in runs)
    if n > 1:
        lines += [
            "",
            f"Odd against even stable steps (each against its two neighbours, odd minus even), mean [95 % interval] "
            f"over {n} runs: {fmt_ci(100 * m, 100 * lo, 100 * hi, 2)} %",
        ]
    return "\n".join(lines) + "\n"


def interval_lines(runs: list[dict[str, Any]]) -> list[str]:
    """Per schedule, the shares and re-plans per run as mean [95 % interval] (``--intervals``)."""
    lines: list[str] = []
    lines += [
        "",
        "Mean [95 % interval] over the runs:",
        "",
        "| schedule | runs | share (F factor out) | share (raw) | re-plans per run | runs without a re-plan |",
        "|---|---|---|---|---|---|",
    ]
    for schedule in sorted({r["schedule"] for r in runs}):
        rs = [r for r in runs if r["schedule"] == schedule]
        cells = [fmt_ci(*mean_ci(r[k] for r in rs)[:3], 2) or "n/a" for k in ("share_f", "share", "replans")]
        lines.append(f"| {schedule} | {len(rs)} | {' | '.join(cells)} | {sum(1 for r in rs if not r['replans'])} |")

    return lines


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    intervals = "--intervals" in args
    folders = [Path(a) for a in args if a != "--intervals"]
    if not folders or not all(f.is_dir() for f in folders):
        print("error: give one or more folders holding runs' summary.json and metrics.jsonl", file=sys.stderr)
        return 2
    print(table(folders, intervals), end="")
    return 0
