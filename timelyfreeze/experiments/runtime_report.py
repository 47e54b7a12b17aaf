"""The runtime benchmark's tables: ``report`` (the Markdown summary of ``results.jsonl``), ``agg`` (median
[min, max] of a column) and ``write_csv``; the compile benchmark uses the last two."""

from __future__ import annotations

import csv
import math
import os
import statistics
from pathlib import Path

WARMUP = 3
"""Warm-up steps of every job (the first steps of a process are slow: allocator, caches)."""


def load_kind(opts) -> str:
    """``load``, or ``load_core<N>`` for a co-tenant pinned to core N."""
    return "load" if opts.load_core is None else f"load_core{opts.load_core}"


def agg(vals: list[float], fmt: str) -> str:
    vals = [v for v in vals if v is not None and not math.isnan(v)]
    if not vals:
        return "n/a"
    if len(vals) == 1:
        return format(vals[0], fmt)
    return f"{format(statistics.median(vals), fmt)} [{format(min(vals), fmt)}, {format(max(vals), fmt)}]"


def report(rows: list[dict], opts) -> str:
    def of(kind: str, s: str) -> list[dict]:
        return [r for r in rows if r["kind"] == kind and r["schedule"] == s]

    # (rows: this layout's jobs only, as ``run`` returns them)

    lines = [
        f"Machine: {os.cpu_count()} CPU cores, torch CPU/gloo, {opts.nproc} ranks ({opts.layout_text}), llama3 "
        f"debug model, {opts.size_text}; r_max {opts.r_max}; per job warm-up {WARMUP}, monitoring "
        f"{opts.monitor} + {opts.monitor}, ramp {opts.ramp}, stable {opts.stable} steps. Median [min, max] over "
        "the runs (n = runs).",
        "",
    ]
    lines += [
        "| schedule | n | overhead at ratio 0 | stable: measured / predicted (ms) | stable error | of which: "
        "model gap / action drift | speed-up measured / predicted | achieved share | re-plans per run "
        "| avg freeze ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in opts.schedules:
        ph, ov = of("phases", s), of("overhead", s)
        lines.append(
            f"| {s} | {len(ph)} | {agg([r['overhead_pct'] for r in ov], '+.2f')} % | "
            f"{agg([r['stable_ms'] for r in ph], '.0f')} / {agg([r['pred_planned_ms'] for r in ph], '.0f')} | "
            f"{agg([r['error_pct'] for r in ph], '+.1f')} % | {agg([r.get('model_gap_pct') for r in ph], '+.1f')} % / "
            f"{agg([r.get('action_drift_pct') for r in ph], '+.1f')} % "
            f"| {agg([r['speedup_measured'] for r in ph], '.3f')}x / "
            f"{agg([r['speedup_predicted'] for r in ph], '.3f')}x | {agg([r['share_pct'] for r in ph], '.0f')} % | "
            f"{agg([r['replans'] for r in ph], '.0f')} | {agg([r['avg_freeze_ratio'] for r in ph], '.3f')} |"
        )
    if opts.load_change:
        where = "free to move between cores" if opts.load_core is None else f"pinned to core {opts.load_core}"
        lines += [
            "",
            f"With a CPU-bound co-tenant ({where}) started at the first stable step:",
            "",
            "| schedule | n | runs that re-planned | first re-plan after stable step | stable after the first "
            "re-plan: measured / predicted (ms) | error vs the plan in force | share vs the plan in force | "
            "share vs the monitoring plan | whole stable phase: model gap / action drift |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        ramp_end = WARMUP + 2 * opts.monitor + opts.ramp
        for s in opts.load_change:
            ld = of(load_kind(opts), s)
            rp = [r for r in ld if "replan_step" in r]
            lines.append(
                f"| {s} | {len(ld)} | {sum(1 for r in ld if r['replans'])} | "
                f"{agg([r['replan_step'] - ramp_end for r in rp], '.0f')} | "
                f"{agg([r['stable_after_ms'] for r in rp], '.0f')} / "
                f"{agg([r['pred_after_planned_ms'] for r in rp], '.0f')} | "
                f"{agg([r['error_after_pct'] for r in rp], '+.1f')} % | "
                f"{agg([r['share_after_pct'] for r in rp], '.0f')} % | "
                f"{agg([r['share_pct'] for r in ld], '.0f')} % | "
                f"{agg([r.get('model_gap_pct') for r in ld], '+.1f')} % / "
                f"{agg([r.get('action_drift_pct') for r in ld], '+.1f')} % |"
            )
    if opts.pinning_ab:
        lines += [
            "",
            "CPU pinning (`[freeze] cpu_pinning`), the same job pinned (the `phases` runs) and not:",
            "",
            "| schedule | pinning | n | upper (ms) | stable (ms) | stable error | achieved share |",
            "|---|---|---|---|---|---|---|",
        ]
        for s in opts.pinning_ab:
            for kind, label in (("phases", "on"), ("unpinned", "off")):
                rs = of(kind, s)
                lines.append(
                    f"| {s} | {label} | {len(rs)} | {agg([r['upper_ms'] for r in rs], '.0f')} | "
                    f"{agg([r['stable_ms'] for r in rs], '.0f')} | {agg([r['error_pct'] for r in rs], '+.1f')} % | "
                    f"{agg([r['share_pct'] for r in rs], '.0f')} % |"
                )
    return "\n".join(lines)


def write_csv(rows: list[dict], path: Path) -> None:
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
