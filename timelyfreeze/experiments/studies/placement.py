"""The placement report: TimelyFreeze against random freezing matched to its realised per-stage shares.

Reads a sweep folder of ``scripts/placement_grid.toml`` (``random = {matched = "timelyfreeze"}``): every random
job names the TimelyFreeze job it was matched to (``matched_to``); that pair shares seed, schedule, phases and
per-stage share, so their differences are what the plan's placement buys. Writes under ``<out>/report/``:

- ``placement_pairs.csv``: one row per pair (``PAIR_COLUMNS``): both in-run speed-ups, their difference, the
  validation-loss difference, the stable tokens/s ratio, both runs' realised shares, and the planner's prediction
  of the speed-up difference (``planner.analysis.placement``: the plan against the same shares spread uniformly, on the
  TimelyFreeze run's DAG and bounds).
- ``placement_cells.csv``: per schedule and r_max, and per schedule over every r_max, the mean and 95 % interval
  (Student's t over pairs) of each paired quantity, with what the interval resolves.
- ``placement.md`` (the tables and the statement) and ``placement.png`` (measured against predicted differences).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from planner.analysis.placement import predict_placement
from planner.errors import PlannerError
from planner.plan import load_plan
from planner.timing.comm import estimate_edge_delays
from planner.timing.spans import f_factor
from planner.trace.load import Trace, load_trace, phase_stage_ratios
from timelyfreeze.experiments.stats import NO_DIFFERENCE, mean_ci, verdict
from timelyfreeze.experiments.sweep.report import md_table, write_csv
from timelyfreeze.experiments.sweep.results import load_rows, num

PAIR_COLUMNS = [
    "schedule",
    "r_max",
    "seed",
    "timelyfreeze_job",
    "random_job",
    "speedup_tf",
    "speedup_random",
    "d_speedup",
    "f_tf",
    "f_random",
    "d_speedup_f",
    "d_val_loss",
    "throughput_ratio",
    "shares_tf",
    "shares_random",
    "share_gap",
    "predicted_speedup_tf",
    "predicted_speedup_uniform",
    "predicted_d_speedup",
]
QUANTITIES = ("d_speedup", "d_speedup_f", "predicted_d_speedup", "d_val_loss", "throughput_ratio", "share_gap")
CELL_COLUMNS = (
    ["schedule", "r_max", "pairs"]
    + [f"{q}_{s}" for q in QUANTITIES for s in ("mean", "lo", "hi")]
    + ["speed", "speed_f", "loss"]
)


def _load(row: dict[str, Any]) -> Trace | None:
    """The row's trace, or None where it has none or it does not load."""
    try:
        return load_trace(row["_trace"]) if row.get("_trace") else None
    except (PlannerError, OSError, ValueError):
        return None


def _trace_figures(trace: Trace | None) -> tuple[list[float] | None, float | None]:
    """(realised stable-phase shares per stage, F factor stable over upper) of a run's trace."""
    return (None, None) if trace is None else (phase_stage_ratios(trace), f_factor(trace, "stable", "upper"))


def _f_corrected(speedup: Any, f: float | None) -> float | None:
    """The in-run speed-up with the machine's speed change taken out: ``speedup * f`` (``f``: stable F over
    upper F; a machine that sped up by ``f < 1`` shortened the stable batches by ``f`` on its own)."""
    return None if num(speedup) is None or f is None else speedup * f


def _prediction(row: dict[str, Any], trace: Trace | None, shares: list[float] | None) -> dict[str, float | None]:
    none = {"predicted_speedup_tf": None, "predicted_speedup_uniform": None, "predicted_d_speedup": None}
    if shares is None or trace is None or not row.get("_plan"):
        return none
    try:
        p = predict_placement(trace.meta, load_plan(row["_plan"]), shares, estimate_edge_delays(trace))
    except (PlannerError, OSError, ValueError):
        return none
    return {
        "predicted_speedup_tf": p.plan_speedup,
        "predicted_speedup_uniform": p.uniform_speedup,
        "predicted_d_speedup": p.speedup_difference,
    }


def _diff(a: Any, b: Any) -> float | None:
    return None if num(a) is None or num(b) is None else a - b


def _trace_of(row: dict[str, Any], traces: dict[str, Trace | None]) -> Trace | None:
    """The row's trace, loaded once per job (``traces``: job id -> trace)."""
    if row["job_id"] not in traces:
        traces[row["job_id"]] = _load(row)
    return traces[row["job_id"]]


def pair_row(tf: dict[str, Any], rnd: dict[str, Any], traces: dict[str, Trace | None]) -> dict[str, Any]:
    """One pair's row (``PAIR_COLUMNS``): the TimelyFreeze run ``tf`` against the random run ``rnd`` that
    froze the same per-stage shares (``traces``: a cache, job id -> trace)."""
    tf_trace = _trace_of(tf, traces)
    (s_tf, f_tf), (s_rnd, f_rnd) = _trace_figures(tf_trace), _trace_figures(_trace_of(rnd, traces))
    tps_tf, tps_rnd = num(tf.get("tokens_per_s_stable")), num(rnd.get("tokens_per_s_stable"))
    return {
        "schedule": tf["schedule"],
        "r_max": tf["knob_value"],
        "seed": tf["seed"],
        "timelyfreeze_job": tf["job_id"],
        "random_job": rnd["job_id"],
        "speedup_tf": tf["speedup_in_run"],
        "speedup_random": rnd["speedup_in_run"],
        "d_speedup": _diff(tf["speedup_in_run"], rnd["speedup_in_run"]),
        "f_tf": f_tf,
        "f_random": f_rnd,
        "d_speedup_f": _diff(_f_corrected(tf["speedup_in_run"], f_tf), _f_corrected(rnd["speedup_in_run"], f_rnd)),
        "d_val_loss": _diff(tf["val_loss"], rnd["val_loss"]),
        "throughput_ratio": tps_tf / tps_rnd if tps_tf and tps_rnd else None,
        "shares_tf": None if s_tf is None else " ".join(f"{x:.3f}" for x in s_tf),
        "shares_random": None if s_rnd is None else " ".join(f"{x:.3f}" for x in s_rnd),
        "share_gap": None if s_tf is None or s_rnd is None else max(abs(a - b) for a, b in zip(s_tf, s_rnd)),
        **_prediction(tf, tf_trace, s_tf),
    }


def placement_pairs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per ok (TimelyFreeze, matched random) pair of the sweep (``PAIR_COLUMNS``)."""
    by_id = {r["job_id"]: r for r in rows}
    traces: dict[str, Trace | None] = {}
    out = []
    for rnd in rows:
        tf = by_id.get(rnd.get("matched_to") or "")
        if tf is None or rnd["status"] != "ok" or tf["status"] != "ok":
            continue
        out.append(pair_row(tf, rnd, traces))
    return sorted(out, key=lambda p: (str(p["schedule"]), str(p["r_max"]), str(p["seed"])))


def placement_cells(pairs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and 95 % interval of each paired quantity per (schedule, r_max) and per schedule (r_max ``all``)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for p in pairs:
        groups.setdefault((p["schedule"], str(p["r_max"])), []).append(p)
        groups.setdefault((p["schedule"], "all"), []).append(p)
        groups.setdefault(("all", "all"), []).append(p)
    cells = []
    for (schedule, r_max), ps in sorted(groups.items()):
        c: dict[str, Any] = {"schedule": schedule, "r_max": r_max, "pairs": len(ps)}
        for q in QUANTITIES:
            c[f"{q}_mean"], c[f"{q}_lo"], c[f"{q}_hi"], _ = mean_ci(p.get(q) for p in ps)
        c["speed"] = verdict(c["d_speedup_lo"], c["d_speedup_hi"], 0.0, "TimelyFreeze faster", "random faster")
        c["speed_f"] = verdict(c["d_speedup_f_lo"], c["d_speedup_f_hi"], 0.0, "TimelyFreeze faster", "random faster")
        c["loss"] = verdict(c["d_val_loss_lo"], c["d_val_loss_hi"], 0.0, "TimelyFreeze worse", "TimelyFreeze better")
        cells.append(c)
    return cells


def cell_ci(c: dict[str, Any], q: str, digits: int = 3, unit: str = "pair") -> str:
    """A cell's ``q`` as ``+0.038 [+0.006, +0.071]``: its mean and 95 % interval, signed (``unit``: what one
    value is, when there is no interval)."""
    m, lo, hi = c[f"{q}_mean"], c[f"{q}_lo"], c[f"{q}_hi"]
    if m is None:
        return "n/a"
    if lo is None:
        return f"{m:+.{digits}f} (one {unit})"
    return f"{m:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


def statement(cells: list[dict[str, Any]]) -> list[str]:
    """One sentence per schedule (all r_max pooled): what the intervals support."""
    lines = []
    for c in (c for c in cells if c["r_max"] == "all"):
        speed, speed_f = c["speed"] or NO_DIFFERENCE, c["speed_f"] or NO_DIFFERENCE
        loss = c["loss"] or NO_DIFFERENCE
        name = "all schedules" if c["schedule"] == "all" else c["schedule"]
        lines.append(
            f"{name} ({c['pairs']} pairs): in-run speed-up, TimelyFreeze minus matched random "
            f"{cell_ci(c, 'd_speedup')} ({speed}); with the F factor taken out "
            f"{cell_ci(c, 'd_speedup_f')} ({speed_f}); "
            f"the planner predicted {cell_ci(c, 'predicted_d_speedup')}; validation loss difference "
            f"{cell_ci(c, 'd_val_loss', 4)} ({loss})."
        )
    return lines


def mean_bar(ax, x: float, c: dict[str, Any], q: str, **style: Any) -> None:
    """A cell's mean of ``q`` at ``x`` with its 95 % interval as error bars (nothing without an interval)."""
    m, lo, hi = c[f"{q}_mean"], c[f"{q}_lo"], c[f"{q}_hi"]
    if lo is not None:
        ax.errorbar(x, m, yerr=[[m - lo], [hi - m]], fmt="o", capsize=4, **style)


def save_figure(plt, fig, out_png: Path) -> bool:
    """Lay out, write and close ``fig``; True (what a ``plot_*`` that drew returns)."""
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return True


def report_rows(out: str | Path) -> tuple[Path, Path, list[dict[str, Any]]]:
    """(sweep folder, its ``report/`` folder, created, and its results rows)."""
    out = Path(out)
    rep = out / "report"
    rep.mkdir(parents=True, exist_ok=True)
    return out, rep, load_rows(out)


def write_report_md(
    md: Path, title: str, intro: list[str], lines: list[str], sections: list[tuple[str, str]], plot: str | None
) -> Path:
    """Write ``md``: the title, the intro's paragraphs, "What the intervals support" (a bullet per line), one
    section per (heading, table) and the plot's image line; returns ``md``."""
    text = [f"# {title}", ""]
    for paragraph in intro:
        text += [paragraph, ""]
    text += ["## What the intervals support", "", *[f"- {line}" for line in lines], ""]
    for heading, table in sections:
        text += [f"## {heading}", "", table, ""]
    if plot:
        text += [plot, ""]
    md.write_text("\n".join(text))
    return md


def plot_placement(pairs: list[dict[str, Any]], cells: list[dict[str, Any]], out_png: Path) -> bool:
    """Per schedule: each pair's measured difference of in-run speed-up (dots), the mean with its 95 % interval,
    and the planner's predicted difference (crosses)."""
    pooled = [c for c in cells if c["r_max"] == "all" and c["schedule"] != "all" and c["d_speedup_mean"] is not None]
    if not pooled:
        return False
    import matplotlib  # deferred: matplotlib is heavy and only plots need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: matplotlib is heavy and only plots need it

    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(pooled), 4.2))
    for i, c in enumerate(pooled):
        ps = [p for p in pairs if p["schedule"] == c["schedule"]]
        ax.scatter([i - 0.1] * len(ps), [p["d_speedup"] for p in ps], color="tab:blue", s=14, alpha=0.6)
        mean_bar(ax, i - 0.1, c, "d_speedup", color="tab:blue")
        pred = [p["predicted_d_speedup"] for p in ps if p["predicted_d_speedup"] is not None]
        ax.scatter([i + 0.1] * len(pred), pred, color="black", marker="x", s=20)
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(pooled)), [c["schedule"] for c in pooled])
    ax.set_ylabel("in-run speed-up: TimelyFreeze - matched random")
    ax.set_title("measured (blue: pairs, mean, 95 % CI) vs predicted (x)", fontsize=9)
    return save_figure(plt, fig, out_png)


def build_placement_report(out: str | Path) -> Path:
    """Write the placement report of the sweep folder ``out``; returns ``placement.md``'s path."""
    out, rep, rows = report_rows(out)
    pairs = placement_pairs(rows)
    cells = placement_cells(pairs)
    write_csv(rep / "placement_pairs.csv", pairs, PAIR_COLUMNS)
    write_csv(rep / "placement_cells.csv", cells, CELL_COLUMNS)
    has_plot = plot_placement(pairs, cells, rep / "placement.png")
    missing = [r["job_id"] for r in rows if r["status"] != "ok"]
    intro = (
        f"{len(rows)} jobs, {len(pairs)} complete pairs"
        + (f"; not ok: {', '.join(missing)}" if missing else "")
        + ". Each difference is TimelyFreeze minus the random run matched to it (same seed, schedule, phases "
        "and per-stage share); intervals are 95 % Student-t intervals over pairs."
    )
    cells_table = md_table(
        [
            {
                "schedule": c["schedule"],
                "r_max": c["r_max"],
                "pairs": c["pairs"],
                **{q: cell_ci(c, q, 4 if q == "d_val_loss" else 3) for q in QUANTITIES},
                "speed": c["speed"],
                "speed_f": c["speed_f"],
                "loss": c["loss"],
            }
            for c in cells
        ],
        ["schedule", "r_max", "pairs", *QUANTITIES, "speed", "speed_f", "loss"],
    )
    return write_report_md(
        rep / "placement.md",
        f"Placement: TimelyFreeze against matched random freezing ({out.name})",
        [intro],
        statement(cells),
        [
            ("Cells", cells_table),
            ("Pairs", md_table(pairs, [c for c in PAIR_COLUMNS if c not in ("timelyfreeze_job", "random_job")])),
        ],
        "![measured and predicted differences](placement.png)" if has_plot else None,
    )
