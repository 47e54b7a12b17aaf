"""The SmolLM2 studies' reports (docs/results/smollm2-table1/README.md): the paper's Table 1 and Figure 6 on a
real pretrained model, as that protocol computes them, and the accuracy side of the time-to-accuracy study
(docs/results/smollm2-tta/README.md).

Reads a sweep folder (``scripts/smollm2_table1_grid.toml``, ``scripts/smollm2_rmax_grid.toml`` or
``scripts/smollm2_tta_grid.toml``; a time-to-accuracy job's accuracy and loss are read where it ends). Every ok job is
paired with the no-freezing job of its schedule and seed (``tta.tta_rows``: ``kappa``, the stable throughput
over that job's; ``speedup_in_run``; ``predicted_speedup``); ``kappa_fwd``, kappa with the machine's speed taken out
by the forward actions' times over the same steps, and ``tta_ratio_fwd``, ``tta``'s time-to-accuracy ratio with it
taken out (``yardstick``: added after Study 1, read beside kappa and ``tta_ratio``); beside those, ``dacc`` and
``dval`` (its held-out accuracy and held-out loss minus that job's, both read at the last step) and
``ratio_stable``, the mean freeze ratio of its stable-phase steps. Writes under ``<out>/report/``:

- ``smollm2_jobs.csv``: one row per job (``JOB_COLUMNS``);
- ``smollm2_cells.csv``: per (schedule, method, knob), the mean and 95 % Student-t interval over seeds of each
  paired quantity (``stats.mean_ci``), the verdicts the intervals resolve, and the pooled paired test of the
  accuracy: every seed's per-question answers against the same seed's no-freezing answers, pooled, exact McNemar
  (``stats.mcnemar``; two-sided 5 %);
- ``smollm2_actions.csv`` and ``actions.md``: per job, per rank and action kind, its time in the warm-up steps
  every arm runs unfrozen and in its steady steps (``action_rows``);
- ``smollm2.md``: the table; ``figure6.png`` where the folder has more than one r_max (kappa - 1 against the
  accuracy change per r_max, one panel per schedule, each with its intervals).

``--pilot`` reads the pilot's folder instead (``scripts/smollm2_pilot.sh``: a dump per job and ``pilot.log``) and
writes ``pilot.md``, what the sizing rule reads: per job its step time, wall-clock and ``T_fixed``, its held-out
figures and its answers against the pretrained model's (``pilot_rows``).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from timelyfreeze.experiments.stats import NO_DIFFERENCE, by_cell, fmt_ci, mcnemar, verdict
from timelyfreeze.experiments.sweep.grid import NO_FREEZING
from timelyfreeze.experiments.sweep.report import md_table, write_csv
from timelyfreeze.experiments.sweep.results import knob_sort_key, load_rows, num, read_metrics
from timelyfreeze.experiments.sweep.tta import tta_rows
from timelyfreeze.experiments.sweep.yardstick import kappa_fwd, kind_times, steady_steps, tta_ratio_fwd

ARMS = ("none", "timelyfreeze", "apf", "autofreeze", "timelyfreeze_apf", "timelyfreeze_autofreeze", "random")
"""Table 1's arms in the protocol's order (a method outside it sorts after them)."""
PAIRED = ("kappa", "kappa_fwd", "speedup_in_run", "predicted_speedup", "ratio_stable", "dacc", "dval", "tta_ratio_fwd")
JOB_COLUMNS = ["job_id", "schedule", "method", "knob_name", "knob_value", "seed", "val_acc", "val_loss", *PAIRED]
CELL_COLUMNS = (
    ["schedule", "method", "knob_name", "knob_value", "seeds"]
    + [f"{q}_{s}" for q in PAIRED for s in ("mean", "lo", "hi")]
    + ["throughput", "accuracy", "loss", "questions", "only_arm_right", "only_none_right", "mcnemar_p", "paired"]
)
WARMUP_WINDOW = (2, 3, 4)
"""Steps that every arm of the SmolLM2 studies runs with nothing frozen (their warm-up is 4 steps; step 1 carries the
start-up): the window where any two jobs' action times differ only by the machine and the process, not freezing."""
ACTION_COLUMNS = ["job_id", "schedule", "method", "knob_value", "seed", "window", "rank", "kind", "ms"]
ALPHA = 0.05
"""The pooled McNemar test's two-sided level (the protocol's)."""


def _answers(job_dir: Path) -> str | None:
    try:
        s = json.loads((job_dir / "dump" / "timelyfreeze" / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    right = s.get("val_acc_right") if isinstance(s, dict) else None
    return right if isinstance(right, str) and right else None


def stable_ratio(job_dir: Path) -> float | None:
    """The mean applied freeze ratio of the job's stable-phase steps (metrics.jsonl), None without any."""
    ratios = [
        float(m["freeze_ratio"])
        for m in read_metrics(job_dir / "dump" / "timelyfreeze" / "metrics.jsonl")
        if m.get("phase") == "stable" and num(m.get("freeze_ratio")) is not None
    ]
    return sum(ratios) / len(ratios) if ratios else None


def job_rows(out: str | Path) -> list[dict[str, Any]]:
    """One row per ok job of the sweep folder ``out`` (``JOB_COLUMNS`` plus ``_right``, its per-question answers,
    and ``_none_right``, those of the no-freezing job it is paired with)."""
    rows = {r["job_id"]: r for r in load_rows(out) if r["status"] == "ok"}
    base = {(r["schedule"], r["seed"]): r for r in rows.values() if r["method"] == NO_FREEZING}
    jobs = []
    for t in tta_rows(list(rows.values())):
        r = rows[t["job_id"]]
        nf = base.get((r["schedule"], r["seed"]))
        row = {c: t.get(c) for c in JOB_COLUMNS} | {"val_acc": r["val_acc"], "val_loss": r["val_loss"]}
        row["ratio_stable"] = stable_ratio(r["_dir"])
        row["kappa_fwd"] = kappa_fwd(r, nf) if nf is not None else None
        row["tta_ratio_fwd"] = tta_ratio_fwd(r, nf, num(t.get("tta_ratio"))) if nf is not None else None
        row["_right"] = _answers(r["_dir"])
        row["_none_right"] = _answers(nf["_dir"]) if nf is not None else None
        if nf is not None and num(r["val_acc"]) is not None and num(nf["val_acc"]) is not None:
            row["dacc"] = r["val_acc"] - nf["val_acc"]
        if nf is not None and num(r["val_loss"]) is not None and num(nf["val_loss"]) is not None:
            row["dval"] = r["val_loss"] - nf["val_loss"]
        jobs.append(row)
    return sorted(jobs, key=_order)


def _order(r: dict[str, Any]) -> tuple:
    m = r["method"]
    return (str(r["schedule"]), ARMS.index(m) if m in ARMS else len(ARMS), str(m), knob_sort_key(r["knob_value"]))


def cells(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (schedule, method, knob value) (``CELL_COLUMNS``) from its seeds' job rows."""
    out = []
    for c, js in by_cell(jobs, PAIRED):
        if c["method"] != NO_FREEZING:
            c["throughput"] = verdict(c["kappa_lo"], c["kappa_hi"], 1.0, "faster", "slower")
            c["accuracy"] = verdict(c["dacc_lo"], c["dacc_hi"], 0.0, "better", "worse")
            c["loss"] = verdict(c["dval_lo"], c["dval_hi"], 0.0, "worse", "better")
            pairs = [(j["_right"], j["_none_right"]) for j in js if j["_right"] and j["_none_right"]]
            if pairs and all(len(a) == len(b) for a, b in pairs):
                arm, none = "".join(a for a, _ in pairs), "".join(b for _, b in pairs)
                b, cc, p = mcnemar(arm, none)
                c.update(questions=len(arm), only_arm_right=b, only_none_right=cc, mcnemar_p=p)
                c["paired"] = NO_DIFFERENCE if p >= ALPHA else ("better" if b > cc else "worse")
        out.append(c)
    return sorted(out, key=_order)


def md(cs: list[dict[str, Any]]) -> str:
    """The cells as the page's table: each quantity ``mean [lo, hi]``, accuracy changes in points."""
    rows = []
    for c in cs:
        knob = "" if c["knob_name"] is None else f"{c['knob_name']}={c['knob_value']}"
        rows.append(
            {
                "schedule": c["schedule"],
                "arm": f"{c['method']} {knob}".strip(),
                "seeds": c["seeds"],
                "kappa": fmt_ci(c["kappa_mean"], c["kappa_lo"], c["kappa_hi"]),
                "κ, machine speed out": fmt_ci(c["kappa_fwd_mean"], c["kappa_fwd_lo"], c["kappa_fwd_hi"]),
                "in-run speed-up": fmt_ci(c["speedup_in_run_mean"], c["speedup_in_run_lo"], c["speedup_in_run_hi"]),
                "predicted": fmt_ci(c["predicted_speedup_mean"], c["predicted_speedup_lo"], c["predicted_speedup_hi"]),
                "stable freeze ratio": fmt_ci(c["ratio_stable_mean"], c["ratio_stable_lo"], c["ratio_stable_hi"]),
                "Δ accuracy (points)": fmt_ci(*(_points(c[f"dacc_{s}"]) for s in ("mean", "lo", "hi")), digits=1),
                "Δ held-out loss": fmt_ci(c["dval_mean"], c["dval_lo"], c["dval_hi"]),
                "paired (McNemar)": (
                    ""
                    if c.get("mcnemar_p") is None
                    else f"{c['only_arm_right']} vs {c['only_none_right']} of {c['questions']}, "
                    f"p = {c['mcnemar_p']:.3f}: {c['paired']}"
                ),
                "verdicts": ", ".join(
                    f"{what} {c[what]}" for what in ("throughput", "accuracy", "loss") if c.get(what) is not None
                ),
            }
        )
    return md_table(rows, list(rows[0]) if rows else ["schedule"])


def _points(v: float | None) -> float | None:
    return None if v is None else 100.0 * v


def plot_figure6(cs: list[dict[str, Any]], path: Path) -> bool:
    """Figure 6 (kappa - 1 against the accuracy change, one point per r_max, one panel per schedule); False, and
    nothing written, where no schedule has two r_max values."""
    tf = [c for c in cs if c["method"] == "timelyfreeze" and c["kappa_mean"] is not None and c["dacc_mean"] is not None]
    schedules = sorted({c["schedule"] for c in tf})
    if not any(len({c["knob_value"] for c in tf if c["schedule"] == s}) > 1 for s in schedules):
        return False
    import matplotlib  # deferred: only the figure needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(schedules), figsize=(5 * len(schedules), 4), squeeze=False)
    for ax, s in zip(axes[0], schedules):
        for c in (c for c in tf if c["schedule"] == s):
            x, y = 100 * c["dacc_mean"], c["kappa_mean"] - 1
            xerr = None if c["dacc_lo"] is None else [[x - 100 * c["dacc_lo"]], [100 * c["dacc_hi"] - x]]
            yerr = (
                None
                if c["kappa_lo"] is None
                else [[c["kappa_mean"] - c["kappa_lo"]], [c["kappa_hi"] - c["kappa_mean"]]]
            )
            ax.errorbar([x], [y], xerr=xerr, yerr=yerr, fmt="o", capsize=3)
            ax.annotate(f"r_max {c['knob_value']:g}", (x, y), textcoords="offset points", xytext=(5, 5))
        ax.axhline(0, color="grey", lw=0.5)
        ax.axvline(0, color="grey", lw=0.5)
        ax.set_title(s)
        ax.set_xlabel("Δ held-out accuracy vs no freezing (points)")
        ax.set_ylabel("throughput gain κ − 1")
    fig.suptitle("SmolLM2-135M-Instruct, PP=2 CPU: mean and 95 % t interval over seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def action_rows(out: str | Path) -> list[dict[str, Any]]:
    """Per ok job with a trace, per window (``WARMUP_WINDOW``, and its steady steps), per (rank, action kind): the
    median over the window's steps of the summed time of that rank's actions of that kind (``ACTION_COLUMNS``)."""
    rows = []
    for r in sorted((r for r in load_rows(out) if r["status"] == "ok" and r["_trace"] is not None), key=_order):
        steady = steady_steps(read_metrics(r["_dir"] / "dump" / "timelyfreeze" / "metrics.jsonl"))
        for window, steps in (("warm-up 2-4", WARMUP_WINDOW), ("steady", steady)):
            for (rank, kind), ms in kind_times(r["_trace"], steps).items():
                rows.append({c: r.get(c) for c in ACTION_COLUMNS[:5]} | {"window": window, "rank": rank, "kind": kind})
                rows[-1]["ms"] = round(ms, 1)
    return rows


def actions_md(rows: list[dict[str, Any]]) -> str:
    """``action_rows`` as one table per schedule: a row per job and window, a column per (rank, kind), in seconds."""
    out = []
    for schedule in dict.fromkeys(r["schedule"] for r in rows):
        mine = [r for r in rows if r["schedule"] == schedule]
        cols = sorted({(r["rank"], r["kind"]) for r in mine})
        table: dict[tuple, dict[str, Any]] = {}
        for r in mine:
            knob = r["knob_value"]
            arm = r["method"] + ("" if knob is None else f" {knob:g}" if isinstance(knob, float) else f" {knob}")
            row = table.setdefault((r["job_id"], r["window"]), {"arm": arm, "seed": r["seed"], "window": r["window"]})
            row[f"rank {r['rank']} {r['kind']}"] = f"{r['ms'] / 1e3:.2f}"
        out += [
            f"## {schedule}",
            "",
            md_table(list(table.values()), ["arm", "seed", "window"] + [f"rank {k} {kind}" for k, kind in cols]),
            "",
        ]
    return "\n".join(out)


def write_report(out: str | Path) -> Path:
    """Write ``<out>/report/smollm2_{jobs,cells}.csv``, ``smollm2.md`` and (where it applies) ``figure6.png``;
    returns the Markdown file's path."""
    report = Path(out) / "report"
    report.mkdir(parents=True, exist_ok=True)
    jobs = job_rows(out)
    cs = cells(jobs)
    write_csv(report / "smollm2_jobs.csv", jobs, JOB_COLUMNS)
    write_csv(report / "smollm2_cells.csv", cs, CELL_COLUMNS)
    text = [
        f"# {Path(out).name}: the SmolLM2 study's table",
        "",
        f"{len(jobs)} ok jobs. Each quantity: mean [95 % Student-t interval] over seeds, paired with the same "
        "seed's no-freezing job ([the study's protocol](../../README.md)). Paired (McNemar): questions "
        "only the arm got right vs only no freezing got right, every seed pooled, exact two-sided test at 5 %. "
        "κ, machine speed out: the step-time ratio over the arm's stable steps with each job's forward-action time "
        "over those steps as the yardstick of machine speed (`timelyfreeze/experiments/sweep/yardstick.py`; added "
        "after Study 1's runs, read beside κ, not in its place).",
        "",
        md(cs),
        "",
    ]
    if plot_figure6(cs, report / "figure6.png"):
        text += ["![Figure 6](figure6.png)", ""]
    actions = action_rows(out)
    write_csv(report / "smollm2_actions.csv", actions, ACTION_COLUMNS)
    (report / "actions.md").write_text(
        f"# {Path(out).name}: where each job's time went\n\nPer job, per window, per rank and action kind: the median "
        "over the window's steps of the step's summed action time, in seconds (replica 0's trace; "
        f"`smollm2_actions.csv` has the ms). Warm-up 2-4: steps {list(WARMUP_WINDOW)}, nothing frozen in any arm; "
        "steady: the arm's stable phase (every step for no freezing).\n\n" + actions_md(actions)
    )
    text += ["Where each job's time went, per rank and action kind: [actions.md](actions.md).", ""]
    path = report / "smollm2.md"
    path.write_text("\n".join(text))
    return path


PILOT_LOG = "pilot.log"
"""The pilot script's own lines (``pilot: <job> started|ended <ISO time>, load ...``) in the pilot folder."""
PILOT_COLUMNS = [
    "job",
    "steps",
    "median step (s)",
    "wall-clock (s)",
    "T_fixed (s)",
    "accuracy",
    "acc_norm",
    "held-out loss",
    "vs pretrained (McNemar)",
]


def _pilot_times(pilot: Path) -> dict[str, dict[str, datetime]]:
    times: dict[str, dict[str, datetime]] = {}
    for line in (pilot / PILOT_LOG).read_text().splitlines():
        m = re.match(r"pilot: (\S+) (started|ended) (\S+?Z),", line)
        if m:
            times.setdefault(m.group(1), {})[m.group(2)] = datetime.fromisoformat(m.group(3).replace("Z", "+00:00"))
    return times


def pilot_rows(pilot: str | Path, first_stable: int = 11) -> list[dict[str, Any]]:
    """One row per finished job of the pilot folder (``PILOT_COLUMNS``): the median step time over its steps from
    ``first_stable`` on (the config's stable phase; all steps of a shorter job), its wall-clock from
    ``pilot.log``, ``T_fixed`` (the wall-clock less its steps' times), its held-out figures, and its answers
    against the pretrained job's (exact McNemar: questions only it got right vs only the pretrained model did)."""
    pilot = Path(pilot)
    times = _pilot_times(pilot)
    summaries = {}
    for d in sorted(p for p in pilot.iterdir() if (p / "timelyfreeze" / "summary.json").is_file()):
        summaries[d.name] = json.loads((d / "timelyfreeze" / "summary.json").read_text())
    base = (summaries.get("pretrained") or {}).get("val_acc_right")
    rows = []
    for name, s in summaries.items():
        if name not in times or set(times[name]) != {"started", "ended"}:
            continue
        steps = {
            m["step"]: float(m["step_ms"]) / 1000
            for m in read_metrics(pilot / name / "timelyfreeze" / "metrics.jsonl")
            if num(m.get("step_ms")) is not None
        }
        late = [t for k, t in steps.items() if k >= first_stable] or list(steps.values())
        wall = (times[name]["ended"] - times[name]["started"]).total_seconds()
        right = s.get("val_acc_right")
        versus = ""
        if base and right and name != "pretrained":
            b, c, p = mcnemar(right, base)
            versus = f"{b} vs {c}, p = {p:.3f}"
        rows.append(
            {
                "job": name,
                "steps": len(steps),
                "median step (s)": f"{statistics.median(late):.2f}",
                "wall-clock (s)": f"{wall:.0f}",
                "T_fixed (s)": f"{wall - sum(steps.values()):.0f}",
                "accuracy": f"{s['val_acc']:.3f}",
                "acc_norm": f"{s['val_acc_norm']:.3f}",
                "held-out loss": f"{s['val_loss']:.3f}",
                "vs pretrained (McNemar)": versus,
            }
        )
    return rows


def pilot_md(pilot: str | Path) -> str:
    """``pilot.md``: the pilot's table (``pilot_rows``)."""
    return md_table(pilot_rows(pilot), PILOT_COLUMNS) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="smollm2_report.py", description="The SmolLM2 study's table and Figure 6.")
    ap.add_argument("out", help="a sweep folder of a SmolLM2 study, or with --pilot the pilot's folder")
    ap.add_argument("--pilot", action="store_true", help="write the pilot's table (pilot.md) into the folder")
    args = ap.parse_args(argv)
    if args.pilot:
        if not (Path(args.out) / PILOT_LOG).is_file():
            print(f"error: {args.out}: no {PILOT_LOG} (not the pilot's folder)", file=sys.stderr)
            return 2
        (Path(args.out) / "pilot.md").write_text(pilot_md(args.out))
        print(Path(args.out) / "pilot.md")
        return 0
    if not (Path(args.out) / "jobs").is_dir():
        print(f"error: {args.out}: not a sweep folder (no jobs/)", file=sys.stderr)
        return 2
    print(write_report(args.out))
    return 0
