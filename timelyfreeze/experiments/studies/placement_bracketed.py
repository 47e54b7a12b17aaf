"""The bracketed placement report: TimelyFreeze against matched random freezing with the machine's speed out of
the way (``scripts/placement_bracketed_grid.toml``, protocol: ``docs/results/placement-bracketed/README.md``).

Each block is three jobs of one (schedule, r_max, seed), run back to back: A (TimelyFreeze), R (random, matched
to A's realised per-stage shares) and B (A again, ``...__repeat=1``). It gives two pairs, (A, R) with
TimelyFreeze first and (B, R) with random first, and the bracketed difference ``(A + B) / 2 - R`` (the mean of
the two pairs' differences), in which a drift of the machine that is linear over the block cancels. The two
pairs of a block share R, so the block is the unit: intervals are 95 % Student-t intervals over blocks. Writes
under ``<out>/report/``:

- ``bracketed_pairs.csv``: one row per pair (``PAIR_COLUMNS``): the placement report's pair columns
  (``placement.PAIR_COLUMNS``: both in-run speed-ups and F factors, the raw and F-corrected differences, share
  gap, validation-loss difference, the planner's prediction) with the block's position in time and the order;
- ``bracketed_blocks.csv``: one row per block (``BLOCK_COLUMNS``): the three runs' speed-ups and F factors,
  each order's difference, the bracketed difference raw and with the F factors taken out, the bracketed F
  difference, A - B (the same settings twice: noise, drift and order), and whether its jobs ran back to back;
- ``bracketed_cells.csv``: per schedule and over both, the mean, 95 % interval and number of blocks with a value
  (``<q>_n``) of each block quantity (``CELL_COLUMNS``), the verdicts, and the same over the blocks whose
  bracketed F difference is within ``CLOSE_F`` (the issue's sensitivity check);
- ``bracketed.md`` (the answer, the tables) and ``bracketed.png`` (each block's bracketed difference with the
  mean, its interval and the +-``MARGIN`` band; each order's difference over the blocks' order in time).

``design`` gives the planned precision from a finished placement report's ``placement_pairs.csv``.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path
from typing import Any, Sequence

from timelyfreeze.experiments.stats import (
    NO_DIFFERENCE,
    half_width,
    mean_ci,
    n_for_half_width,
    pooled_sd,
    verdict,
)
from timelyfreeze.experiments.studies.placement import PAIR_COLUMNS as PLACEMENT_PAIR_COLUMNS
from timelyfreeze.experiments.studies.placement import (
    build_placement_report,
    cell_ci,
    mean_bar,
    pair_row,
    report_rows,
    save_figure,
    write_report_md,
)
from timelyfreeze.experiments.sweep.grid import back_to_back
from timelyfreeze.experiments.sweep.report import md_table, write_csv
from timelyfreeze.experiments.sweep.results import load_rows, num

MARGIN = 0.02
"""The precision the study is sized for: a 95 % interval of +-0.02 of in-run speed-up (issue 40, item 2)."""
CLOSE_F = 0.05
"""Sensitivity check: the blocks whose bracketed F difference ``f_bracket = (f_A + f_B) / 2 - f_R`` has
``|f_bracket| <= CLOSE_F``."""
REPEAT_TAG = "__repeat="

PAIR_COLUMNS = ["position", "order", *PLACEMENT_PAIR_COLUMNS]
BLOCK_COLUMNS = [
    "schedule",
    "r_max",
    "seed",
    "position",
    "started",
    "back_to_back",
    "idle_s",
    "tf_job",
    "random_job",
    "repeat_job",
    "speedup_a",
    "speedup_r",
    "speedup_b",
    "f_a",
    "f_r",
    "f_b",
    "d_first",
    "d_second",
    "d_bracket",
    "d_first_f",
    "d_second_f",
    "d_bracket_f",
    "f_bracket",
    "d_ab",
    "d_val_loss_bracket",
    "share_gap",
    "predicted_d_bracket",
    "close_f",
]
QUANTITIES = (
    "d_bracket",
    "d_bracket_f",
    "d_first",
    "d_second",
    "d_first_f",
    "d_second_f",
    "d_ab",
    "f_bracket",
    "d_val_loss_bracket",
    "predicted_d_bracket",
    "share_gap",
)
CELL_COLUMNS = (
    ["schedule", "blocks"]
    + [f"{q}_{s}" for q in QUANTITIES for s in ("mean", "lo", "hi", "n")]
    + ["blocks_close_f"]
    + [f"d_bracket_close_f_{s}" for s in ("mean", "lo", "hi", "n")]
    + ["speed", "size", "speed_f", "size_f", "speed_close_f", "size_close_f", "check_f", "check_close_f", "loss"]
)
WITHIN, BEYOND, UNDECIDED = f"within +-{MARGIN:g}", f"beyond +-{MARGIN:g}", f"not decided at +-{MARGIN:g}"
FASTER, SLOWER = "TimelyFreeze faster", "random faster"
READINGS = {"": "d_bracket", "_f": "d_bracket_f", "_close_f": "d_bracket_close_f"}
"""The cell's verdict columns (``speed<suffix>``, ``size<suffix>``) -> the quantity they read: the answer, then
the two checks (F factors out; the close-F subset)."""


def is_bracketed(rows: list[dict[str, Any]]) -> bool:
    """Whether a sweep folder's rows hold bracketed blocks (a job repeated after its matched job)."""
    return any(r.get("_repeat") for r in rows)


def _mean2(x: Any, y: Any) -> float | None:
    return None if num(x) is None or num(y) is None else (x + y) / 2


def _sub(x: Any, y: Any) -> float | None:
    return None if num(x) is None or num(y) is None else x - y


def block_row(a: dict[str, Any], r: dict[str, Any], b: dict[str, Any], first: dict, second: dict) -> dict[str, Any]:
    """One block's row (``BLOCK_COLUMNS`` but ``position``) from its three jobs and its two pairs' rows."""
    in_order, idle = back_to_back([(j.get("_started"), j.get("_ended")) for j in (a, r, b)])
    f_bracket = _sub(_mean2(first["f_tf"], second["f_tf"]), first["f_random"])
    return {
        "schedule": a["schedule"],
        "r_max": a["knob_value"],
        "seed": a["seed"],
        "started": a.get("_started"),
        "back_to_back": in_order,
        "idle_s": idle,
        "tf_job": a["job_id"],
        "random_job": r["job_id"],
        "repeat_job": b["job_id"],
        "speedup_a": a["speedup_in_run"],
        "speedup_r": r["speedup_in_run"],
        "speedup_b": b["speedup_in_run"],
        "f_a": first["f_tf"],
        "f_r": first["f_random"],
        "f_b": second["f_tf"],
        "d_first": first["d_speedup"],
        "d_second": second["d_speedup"],
        "d_bracket": _mean2(first["d_speedup"], second["d_speedup"]),
        "d_first_f": first["d_speedup_f"],
        "d_second_f": second["d_speedup_f"],
        "d_bracket_f": _mean2(first["d_speedup_f"], second["d_speedup_f"]),
        "f_bracket": f_bracket,
        "d_ab": _sub(a["speedup_in_run"], b["speedup_in_run"]),
        "d_val_loss_bracket": _mean2(first["d_val_loss"], second["d_val_loss"]),
        "share_gap": _mean2(first["share_gap"], second["share_gap"]),
        "predicted_d_bracket": _mean2(first["predicted_d_speedup"], second["predicted_d_speedup"]),
        "close_f": None if f_bracket is None else abs(f_bracket) <= CLOSE_F,
    }


def block_starts(rows: list[dict[str, Any]]) -> list[str]:
    """The A job id of every block a bracketed sweep folder's rows show, sorted: the first run of each repeat,
    the target of each matched job, and every first run of a method that has repeats (a block interrupted after
    its A has only that), so that a block with any of its jobs missing is still found."""
    repeated = {r["method"] for r in rows if r.get("_repeat")}
    starts = {r["job_id"].rpartition(REPEAT_TAG)[0] for r in rows if r.get("_repeat")}
    starts |= {r["matched_to"] for r in rows if r.get("matched_to")}
    starts |= {
        r["job_id"] for r in rows if r["method"] in repeated and not r.get("_repeat") and not r.get("matched_to")
    }
    return sorted(starts)


def bracketed_blocks(rows: list[dict[str, Any]]) -> tuple[list[dict], list[dict], list[str]]:
    """(blocks, pairs, left out) of a sweep folder's rows: one ``BLOCK_COLUMNS`` row per block whose three jobs
    finished ok, in time order (``position`` 1, 2, ... over every schedule); its two ``PAIR_COLUMNS`` rows; and
    one line per block that is left out of the statistics (a job not ok or missing, or not back to back:
    ``grid.back_to_back``)."""
    by_id = {r["job_id"]: r for r in rows}
    traces: dict[str, Any] = {}
    blocks, pairs, left_out = [], [], []
    for a_id in block_starts(rows):
        a, b = by_id.get(a_id), by_id.get(f"{a_id}{REPEAT_TAG}1")
        r = next((x for x in rows if x.get("matched_to") == a_id), None)
        jobs = {"A": a, "R": r, "B": b}
        bad = [
            f"{k} {'missing' if j is None else j['status']}"
            for k, j in jobs.items()
            if j is None or j["status"] != "ok"
        ]
        if bad:
            left_out.append(f"{a_id}: {', '.join(bad)}")
            continue
        assert a is not None and r is not None and b is not None  # for the type checker: bad lists them otherwise
        first, second = pair_row(a, r, traces), pair_row(b, r, traces)
        block = block_row(a, r, b, first, second)
        if block["back_to_back"] is not True:
            left_out.append(f"{a_id}: its jobs did not run back to back in the order A, R, B")
            continue
        blocks.append(block)
        pairs += [{**first, "order": "TF first", "_block": a_id}, {**second, "order": "random first", "_block": a_id}]
    blocks.sort(key=lambda x: (str(x["started"]), x["tf_job"]))
    position = {x["tf_job"]: k for k, x in enumerate(blocks, 1)}
    for x in blocks:
        x["position"] = position[x["tf_job"]]
    for p in pairs:
        p["position"] = position[p["_block"]]
    pairs.sort(key=lambda p: (p["position"], p["order"] != "TF first"))
    return blocks, pairs, left_out


def size_verdict(lo: float | None, hi: float | None, margin: float = MARGIN) -> str | None:
    """Where the interval lies against +-``margin``: wholly inside it (``WITHIN``: the difference is smaller
    than the margin), wholly beyond it on one side (``BEYOND``), or across an edge (``UNDECIDED``)."""
    if lo is None or hi is None:
        return None
    if -margin <= lo and hi <= margin:
        return WITHIN
    if lo > margin or hi < -margin:
        return BEYOND
    return UNDECIDED


def speed_verdict(lo: float | None, hi: float | None) -> str | None:
    """The direction: ``FASTER`` when the interval lies above 0, ``SLOWER`` below it, else ``NO_DIFFERENCE``."""
    return verdict(lo, hi, 0.0, FASTER, SLOWER)


def checks(c: dict[str, Any]) -> tuple[str | None, str | None]:
    """The protocol's two flags beside the answer (None where there is nothing to flag): the F-out direction
    differs from the primary's; the close-F subset does not reach a verdict the primary reached (its direction
    when resolved, its size when within or beyond +-``MARGIN``; a subset without an interval reaches none)."""
    check_f = None
    if c["speed"] is not None and c["speed_f"] is not None and c["speed_f"] != c["speed"]:
        check_f = f"with the F factors out the direction is {c['speed_f']!r}, not {c['speed']!r}"
    lost = [
        f"its {what} is {sub or 'not read (no interval)'!r}, not {prim!r}"
        for what, prim, sub, resolved in (
            ("direction", c["speed"], c["speed_close_f"], (FASTER, SLOWER)),
            ("size", c["size"], c["size_close_f"], (WITHIN, BEYOND)),
        )
        if prim in resolved and sub != prim
    ]
    return check_f, ("over the close-F blocks " + " and ".join(lost)) if lost else None


def bracketed_cells(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per schedule, and over every block (``all``): mean and 95 % interval over blocks of each quantity."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for x in blocks:
        groups.setdefault(str(x["schedule"]), []).append(x)
    if len(groups) > 1:
        groups["all"] = list(blocks)
    cells = []
    for schedule, xs in groups.items():
        c: dict[str, Any] = {"schedule": schedule, "blocks": len(xs)}
        for q in QUANTITIES:
            c[f"{q}_mean"], c[f"{q}_lo"], c[f"{q}_hi"], c[f"{q}_n"] = mean_ci(x.get(q) for x in xs)
        within = [x for x in xs if x["close_f"]]
        c["blocks_close_f"] = len(within)
        q = "d_bracket_close_f"
        c[f"{q}_mean"], c[f"{q}_lo"], c[f"{q}_hi"], c[f"{q}_n"] = mean_ci(x["d_bracket"] for x in within)
        for suffix, q in READINGS.items():
            c[f"speed{suffix}"] = speed_verdict(c[f"{q}_lo"], c[f"{q}_hi"])
            c[f"size{suffix}"] = size_verdict(c[f"{q}_lo"], c[f"{q}_hi"])
        c["check_f"], c["check_close_f"] = checks(c)
        c["loss"] = verdict(
            c["d_val_loss_bracket_lo"], c["d_val_loss_bracket_hi"], 0.0, "TimelyFreeze worse", "TimelyFreeze better"
        )
        cells.append(c)
    return cells


def _ci(c: dict[str, Any], q: str, digits: int = 3) -> str:
    """The cell's ``q`` with its interval, and the number of blocks behind it where some of the cell's blocks
    (of the close-F subset, for ``d_bracket_close_f``) have no value of it."""
    text = cell_ci(c, q, digits, unit="block")
    n, of = c[f"{q}_n"], c["blocks_close_f" if q == "d_bracket_close_f" else "blocks"]
    return text if n == of else f"{text} (over {n} of {of} blocks)"


def answer(c: dict[str, Any], q: str = "d_bracket") -> str:
    """The cell's reading of ``q``'s interval, as the protocol's Reading words it: the direction (against 0) and
    the size (against +-``MARGIN``) in one sentence. ``d_bracket`` is the answer; ``d_bracket_f`` and
    ``d_bracket_close_f`` are read the same way as checks."""
    lo, hi = c[f"{q}_lo"], c[f"{q}_hi"]
    if lo is None or hi is None:
        return "no interval (fewer than two blocks)"
    speed, size = speed_verdict(lo, hi), size_verdict(lo, hi)
    if size == WITHIN:
        return f"{speed}; the difference is smaller than {MARGIN:g} either way (the interval lies within +-{MARGIN:g})"
    if size == BEYOND:
        return f"{speed}, by more than {MARGIN:g} (the interval lies beyond {MARGIN if lo > 0 else -MARGIN:+g})"
    crossed = [f"{e:+g}" for e, out in ((-MARGIN, lo < -MARGIN), (MARGIN, hi > MARGIN)) if out]
    lead = speed if speed == NO_DIFFERENCE else f"{speed}, by at least {min(abs(lo), abs(hi)):.3f}"
    bound = f"random's gain is below {-lo:.3f}" if speed == SLOWER else f"TimelyFreeze's gain is below {hi:.3f}"
    return (
        f"{lead}; {UNDECIDED} (the interval crosses {' and '.join(crossed)}): the difference lies between "
        f"{lo:+.3f} and {hi:+.3f}, so {bound}"
    )


def statement(cells: list[dict[str, Any]]) -> list[str]:
    """One paragraph per cell: the answer, the two checks read the same way (and their flags), then every
    quantity with its interval."""
    lines = []
    for c in cells:
        name = "both schedules" if c["schedule"] == "all" else c["schedule"]
        flags = [f for f in (c["check_f"], c["check_close_f"]) if f]
        lines.append(
            f"**{name}** ({c['blocks']} blocks): in-run speed-up, TimelyFreeze minus matched random, bracketed "
            f"{_ci(c, 'd_bracket')}: **{answer(c)}**. Checks, not the answer: with the F factors taken out "
            f"{_ci(c, 'd_bracket_f')}: {answer(c, 'd_bracket_f')}; over the {c['blocks_close_f']} blocks with "
            f"|f_bracket| <= {CLOSE_F:g}, {_ci(c, 'd_bracket_close_f')}: {answer(c, 'd_bracket_close_f')}. "
            + (f"Flagged: {'; '.join(flags)}. " if flags else "Neither check flags the answer. ")
            + f"TimelyFreeze first {_ci(c, 'd_first')}, random first {_ci(c, 'd_second')}; A - B (the same "
            f"settings twice) {_ci(c, 'd_ab')}; bracketed F difference {_ci(c, 'f_bracket')}. The planner predicted "
            f"{_ci(c, 'predicted_d_bracket')}; validation loss {_ci(c, 'd_val_loss_bracket', 4)} "
            f"({c['loss'] or NO_DIFFERENCE}); share gap {_ci(c, 'share_gap')}."
        )
    return lines


def plot_bracketed(blocks: list[dict[str, Any]], cells: list[dict[str, Any]], out_png: Path) -> bool:
    """Left: per schedule, each block's bracketed difference raw (filled) and with the F factors taken out
    (hollow), their means with 95 % intervals, the planner's prediction (x) and the +-``MARGIN`` band. Right:
    each order's difference over the blocks' order in time (drift or an order effect shows here)."""
    cs = [c for c in cells if c["schedule"] != "all" and c["d_bracket_mean"] is not None]
    if not cs:
        return False
    import matplotlib  # deferred: matplotlib is heavy and only plots need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: matplotlib is heavy and only plots need it

    fig, (ax, ax_t) = plt.subplots(1, 2, figsize=(4.0 + 1.6 * len(cs) + 5.0, 4.4))
    ax.axhspan(-MARGIN, MARGIN, color="0.92", zorder=0)
    for i, c in enumerate(cs):
        xs = [x for x in blocks if x["schedule"] == c["schedule"]]
        for dx, q, face in ((-0.12, "d_bracket", "tab:blue"), (0.12, "d_bracket_f", "none")):
            vals = [x[q] for x in xs if x[q] is not None]
            ax.scatter([i + dx] * len(vals), vals, s=14, facecolors=face, edgecolors="tab:blue", alpha=0.6)
            mean_bar(ax, i + dx, c, q, color="tab:blue", mfc=face)
        if c["predicted_d_bracket_mean"] is not None:
            ax.scatter([i], [c["predicted_d_bracket_mean"]], color="black", marker="x", s=30)
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(cs)), [c["schedule"] for c in cs])
    ax.set_ylabel("in-run speed-up: TimelyFreeze - matched random")
    ax.set_title(f"bracketed, per block (filled raw, hollow F out); x predicted; band +-{MARGIN:g}", fontsize=8)
    colors = dict(zip([c["schedule"] for c in cs], ("tab:blue", "tab:orange", "tab:green", "tab:red")))
    for c in cs:
        xs = [x for x in blocks if x["schedule"] == c["schedule"]]
        for q, marker, label in (("d_first", "^", "TF first"), ("d_second", "v", "random first")):
            pts = [(x["position"], x[q]) for x in xs if x[q] is not None]
            ax_t.scatter(
                [p for p, _ in pts],
                [v for _, v in pts],
                marker=marker,
                color=colors[c["schedule"]],
                s=18,
                label=f"{c['schedule']}, {label}",
            )
    ax_t.axhline(0.0, color="grey", lw=0.8)
    ax_t.set_xlabel("block, in the order it ran")
    ax_t.set_ylabel("pair difference")
    ax_t.legend(fontsize=7)
    return save_figure(plt, fig, out_png)


def build_bracketed_report(out: str | Path) -> Path:
    """Write the bracketed placement report of the sweep folder ``out``; returns ``bracketed.md``'s path."""
    out, rep, rows = report_rows(out)
    blocks, pairs, left_out = bracketed_blocks(rows)
    cells = bracketed_cells(blocks)
    write_csv(rep / "bracketed_pairs.csv", pairs, PAIR_COLUMNS)
    write_csv(rep / "bracketed_blocks.csv", blocks, BLOCK_COLUMNS)
    write_csv(rep / "bracketed_cells.csv", cells, CELL_COLUMNS)
    has_plot = plot_bracketed(blocks, cells, rep / "bracketed.png")
    cell_cols = ["d_bracket", "d_bracket_f", "d_first", "d_second", "d_ab", "f_bracket", "d_bracket_close_f"]
    cells_table = md_table(
        [
            {
                "schedule": c["schedule"],
                "blocks": c["blocks"],
                **{q: _ci(c, q) for q in cell_cols},
                "predicted": _ci(c, "predicted_d_bracket"),
                "val loss": _ci(c, "d_val_loss_bracket", 4),
                "share gap": _ci(c, "share_gap"),
                "speed": c["speed"],
                "size": c["size"],
                "loss": c["loss"],
            }
            for c in cells
        ],
        ["schedule", "blocks", *cell_cols, "predicted", "val loss", "share gap", "speed", "size", "loss"],
    )
    intro = (
        f"{len(rows)} jobs, {len(blocks)} complete blocks of three (A TimelyFreeze, R random matched to A, B = A "
        "again, back to back). Differences are TimelyFreeze minus random in in-run speed-up; the bracketed one is "
        "(A + B) / 2 - R. Intervals: 95 % Student-t over blocks (a block's two pairs share R)."
    )
    return write_report_md(
        rep / "bracketed.md",
        f"Placement, bracketed: TimelyFreeze against matched random freezing ({out.name})",
        [intro, *([f"Left out: {'; '.join(left_out)}."] if left_out else [])],
        statement(cells),
        [
            ("Cells", cells_table),
            (
                "Blocks, in the order they ran",
                md_table(blocks, [c for c in BLOCK_COLUMNS if not c.endswith("_job") and c != "started"]),
            ),
            ("Pairs", md_table(pairs, [c for c in PAIR_COLUMNS if c not in ("timelyfreeze_job", "random_job")])),
        ],
        "![bracketed differences, and each order's over time](bracketed.png)" if has_plot else None,
    )


# ------------------------------------------------------------------------------------------ design
DESIGN_COLUMNS = ["schedule", "quantity", "pairs", "sd_pair", "dof", "sd_block", "half_width", "blocks_needed"]


def design(pairs: Sequence[dict[str, Any]], blocks: int, margin: float = MARGIN) -> list[dict[str, Any]]:
    """The planned precision, per schedule and quantity (``d_speedup``, ``d_speedup_f``), from a finished placement
    study's pairs (``placement_pairs.csv`` rows): the SD of a pair difference pooled within r_max; the SD of a
    bracketed block, ``sqrt(3/4)`` of it when the runs' own noise is independent (``var((A + B)/2 - R) = 1.5
    var(run)``, ``var(A - R) = 2 var(run)``); the half-width of the 95 % interval over ``blocks`` blocks; and the
    blocks that +-``margin`` needs at that SD."""
    out = []
    for schedule in dict.fromkeys(str(p["schedule"]) for p in pairs):
        for q in ("d_speedup", "d_speedup_f"):
            groups: dict[str, list[float]] = {}
            for p in pairs:
                v = num(float(p[q])) if p["schedule"] == schedule and p.get(q) not in (None, "") else None
                if v is not None:
                    groups.setdefault(str(p["r_max"]), []).append(v)
            sd, dof = pooled_sd(groups.values())
            sd_block = None if sd is None else sd * math.sqrt(0.75)
            out.append(
                {
                    "schedule": schedule,
                    "quantity": q,
                    "pairs": sum(len(g) for g in groups.values()),
                    "sd_pair": sd,
                    "dof": dof,
                    "sd_block": sd_block,
                    "half_width": None if sd_block is None else half_width(sd_block, blocks),
                    "blocks_needed": None if sd_block is None else n_for_half_width(sd_block, margin),
                }
            )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``placement_report.py SWEEP_FOLDER`` (the bracketed report where the folder holds bracketed blocks, else
    the placement report) or ``placement_report.py --design PAIRS_CSV [--blocks N]`` (the planned precision)."""
    p = argparse.ArgumentParser(prog="placement_report.py", description="The placement study's report.")
    p.add_argument("folder", nargs="?", help="a sweep folder of placement_grid.toml or placement_bracketed_grid.toml")
    p.add_argument("--design", metavar="PAIRS_CSV", help="print the planned precision from a placement_pairs.csv")
    p.add_argument("--blocks", type=int, default=15, help="blocks per schedule for --design (default 15)")
    args = p.parse_args(argv)
    if args.design:
        with open(args.design, newline="") as f:
            rows = design(list(csv.DictReader(f)), args.blocks)
        print(md_table(rows, DESIGN_COLUMNS))
        return 0
    if not args.folder:
        p.print_usage(sys.stderr)
        return 2
    build = build_bracketed_report if is_bracketed(load_rows(args.folder)) else build_placement_report
    print(build(args.folder))
    return 0
