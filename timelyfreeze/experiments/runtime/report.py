"""The runtime benchmark's tables: ``report`` (the Markdown summary of ``results.jsonl``), ``agg`` (median
[min, max] of a column) and ``write_csv``; the compile benchmark uses the last two."""

from __future__ import annotations

import csv
import math
import os
import statistics
from pathlib import Path

from timelyfreeze.experiments.stats import fmt_ci, mean_ci

WARMUP = 3
"""Warm-up steps of every job (the first steps of a process are slow: allocator, caches)."""


def load_kind(opts) -> str:
    """``load``, or ``load_core<N>`` for a co-tenant pinned to core N."""
    return "load" if opts.load_core is None else f"load_core{opts.load_core}"


def noise_text(opts) -> str:
    """The noisy co-tenant of ``--noise-core`` in words (result lines, the report)."""
    return f"busy loop pinned to core {opts.noise_core}, on {opts.noise_on:g} s / off {opts.noise_off:g} s"


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
        "| schedule | n | overhead at ratio 0: wall / direct | stable: measured / predicted (ms) | stable error "
        "| of which: model gap / action drift | speed-up measured / predicted | achieved share | re-plans per run "
        "| avg freeze ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in opts.schedules:
        ph, ov = of("phases", s), of("overhead", s)
        lines.append(
            f"| {s} | {len(ph)} | {agg([r['overhead_pct'] for r in ov], '+.2f')} % / "
            f"{agg([r.get('direct_pct') for r in ov], '.2f')} % | "
            f"{agg([r['stable_ms'] for r in ph], '.0f')} / {agg([r['pred_planned_ms'] for r in ph], '.0f')} | "
            f"{agg([r['error_pct'] for r in ph], '+.1f')} % | {agg([r.get('model_gap_pct') for r in ph], '+.1f')} % / "
            f"{agg([r.get('action_drift_pct') for r in ph], '+.1f')} % "
            f"| {agg([r['speedup_measured'] for r in ph], '.3f')}x / "
            f"{agg([r['speedup_predicted'] for r in ph], '.3f')}x | {agg([r['share_pct'] for r in ph], '.0f')} % | "
            f"{agg([r['replans'] for r in ph], '.0f')} | {agg([r['avg_freeze_ratio'] for r in ph], '.3f')} |"
        )
    if getattr(opts, "noise_core", None) is not None:
        lines += _noise_means(rows, opts)
    lines += _overhead_means(rows, opts)
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
            "CPU pinning (`[experiment] cpu_pinning`), the same job pinned (the `phases` runs) and not:",
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
    lines += _replan_ab(rows, opts)
    return "\n".join(lines)


def _noise_means(rows: list[dict], opts) -> list[str]:
    """Re-plans per run and the achieved share (against the monitoring plan), mean [95 % interval] over the
    phases runs of each schedule, for a bench with a noisy co-tenant."""
    lines = [
        "",
        f"Every job beside a co-tenant that comes and goes ({noise_text(opts)}); mean [95 % interval] over the runs:",
        "",
        "| schedule | n | re-plans per run | runs without a re-plan | achieved share (vs the monitoring plan) |",
        "|---|---|---|---|---|",
    ]
    for s in opts.schedules:
        ph = [r for r in rows if r["kind"] == "phases" and r["schedule"] == s]
        rp, sh = mean_ci(r["replans"] for r in ph), mean_ci(r["share_pct"] for r in ph)
        lines.append(
            f"| {s} | {len(ph)} | {fmt_ci(rp[0], rp[1], rp[2], 2)} | {sum(1 for r in ph if not r['replans'])} | "
            f"{fmt_ci(sh[0], sh[1], sh[2], 0)} % |"
        )
    return lines


def _overhead_means(rows: list[dict], opts) -> list[str]:
    """The overhead at ratio 0 per schedule as mean and 95 % interval over its jobs, wall and direct."""

    out = []
    for s in opts.schedules:
        for kind, label in (("overhead", ""), ("overhead_probe", " (with the no-op probe steps)")):
            ov = [r for r in rows if r["kind"] == kind and r["schedule"] == s]
            if len(ov) < 2:
                continue
            wall, direct, probe = (mean_ci(r.get(k) for r in ov) for k in ("overhead_pct", "direct_pct", "probe_pct"))
            out.append(
                f"Overhead at ratio 0{label}, {s}, mean [95 % interval] over {wall[3]} jobs: wall "
                f"{fmt_ci(*wall[:3], 2)} %"
                + (f", direct {fmt_ci(*direct[:3], 2)} %" if direct[3] else "")
                + (f", hooks with no-op listeners {fmt_ci(*probe[:3], 2)} %" if probe[3] else "")
            )
    for s in opts.schedules:
        ov = [r for r in rows if r["kind"] == "overhead_masked" and r["schedule"] == s]
        if len(ov) < 2:
            continue
        wall, direct, draw, switch, hook, own = (
            mean_ci(r.get(k) for r in ov)
            for k in ("overhead_pct", "direct_pct", "draw_pct", "switch_pct", "hook_pct", "own_pct")
        )
        ratios = [mean_ci(r.get(k) for r in ov)[0] for k in ("ratio_hooks", "ratio_masked")]
        out.append(
            f"Overhead at r_max {opts.r_max} (attached vs masked: the same plan's masks, no runtime), {s}, mean [95 % "
            f"interval] over {wall[3]} jobs: wall {fmt_ci(*wall[:3], 2)} %, direct {fmt_ci(*direct[:3], 2)} %"
            + (f" (without the gather's wait: {fmt_ci(*own[:3], 2)} %)" if own[3] else "")
            + "; "
            f"the masks on their own per step: draw {fmt_ci(*draw[:3], 3)} %, switches {fmt_ci(*switch[:3], 3)} %"
            # (the hook's own share: rows of the older bench, which timed its listener calls apart)
            + (f" (the freezing hook inside the runtime: {fmt_ci(*hook[:3], 3)} %)" if hook[3] else "")
            + f"; mean applied ratio attached {ratios[0]:.3f}, masked {ratios[1]:.3f}"
        )
    return ["", *out] if out else []


def _replan_ab(rows: list[dict], opts) -> list[str]:
    """Re-planning on against off: per schedule and condition, the stable batch of each and the paired ratio
    on / off of the same repeat (mean and 95 % interval; below 1: re-planning made the stable phase faster),
    raw and with the machine factor taken out (divided by the pair's ratio of ``upper_f_ms``: the two jobs of
    a pair can run on a machine of different speed before anything differs between them), and the average
    freeze ratio of each (at the same speed, less freezing is the better plan)."""

    if not getattr(opts, "replan_ab", []):
        return []
    lines = [
        "",
        "Re-planning on against off (`[freeze] replan`), each pair the same schedule and repeat, run back to back;",
        "on / off of the stable batch, mean [95 % interval], raw and with the machine factor (the pair's ratio of",
        "forward times in the upper-bound window, before any plan or load) taken out:",
        "",
        "| schedule | condition | pairs | stable (ms), on | stable (ms), off | on / off | on / off, machine factor "
        "out | avg freeze ratio, on / off | re-plans per run, on |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in opts.replan_ab:
        conds = [("quiet", "phases", "noreplan")]
        if s in opts.load_change:
            conds.append(("co-tenant from the stable phase", load_kind(opts), load_kind(opts) + "_noreplan"))
        for label, on_kind, off_kind in conds:
            on = {r["repeat"]: r for r in rows if r["kind"] == on_kind and r["schedule"] == s}
            off = {r["repeat"]: r for r in rows if r["kind"] == off_kind and r["schedule"] == s}
            keys = sorted(set(on) & set(off))
            raw = {k: on[k]["stable_ms"] / off[k]["stable_ms"] for k in keys}
            m, lo, hi, n = mean_ci(raw.values())
            machine = mean_ci(
                raw[k] * off[k]["upper_f_ms"] / on[k]["upper_f_ms"]
                for k in keys
                if on[k].get("upper_f_ms") and off[k].get("upper_f_ms")
            )
            lines.append(
                f"| {s} | {label} | {n} | {agg([on[k]['stable_ms'] for k in keys], '.0f')} | "
                f"{agg([off[k]['stable_ms'] for k in keys], '.0f')} | {fmt_ci(m, lo, hi) or 'n/a'} | "
                f"{fmt_ci(*machine[:3]) or 'n/a'} | {agg([on[k]['avg_freeze_ratio'] for k in keys], '.3f')} / "
                f"{agg([off[k]['avg_freeze_ratio'] for k in keys], '.3f')} | "
                f"{agg([on[k]['replans'] for k in keys], '.0f')} |"
            )
    return lines


def write_csv(rows: list[dict], path: Path) -> None:
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
