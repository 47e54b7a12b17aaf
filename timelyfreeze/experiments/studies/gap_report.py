"""The gap study of ``docs/results/runtime/gap_model.md``: where a measured batch's time goes
(``planner.analysis.gap_analysis``) and how well the gap model predicts it (``gap_eval``), over finished jobs' dumps.

    python scripts/gap_eval.py [--jobs docs/results/comparison/jobs] [--pattern '*timelyfreeze*']
                               [--out docs/results/runtime/gap_model.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from planner.analysis.gap_analysis import decompose_trace, gap_table
from planner.schedule.dag import build_dag
from planner.timing.comm import estimate_edge_delays
from planner.timing.gaps import fit_gap_model, merge_delays
from planner.trace.archive import TRACE_NAME
from planner.trace.load import load_trace
from timelyfreeze.experiments.studies.gap_eval import evaluate_job, job_dirs, write_outputs

__all__ = ["analyse_jobs", "main"]

GROUP = {"upper": "monitoring", "lower": "monitoring", "stable": "stable"}
"""The phases analysed, and the group each is pooled in."""


def analyse_jobs(jobs: list[Path]) -> tuple[list[dict], list[dict]]:
    """``(split rows, gap rows)``: one split row per analysed batch (schedule, group, the decomposition's
    parts in % of the span, the critical rank's offset/free/late ms, the residual under the gap model)
    and the pooled gap classes (:func:`planner.analysis.gap_analysis.gap_table`, phases pooled by :data:`GROUP`)."""
    splits, samples = [], []
    for job in jobs:
        trace = load_trace(job / "dump/timelyfreeze" / TRACE_NAME)  # the folder, or its trace.tar.gz once packed
        dag = build_dag(trace.meta)
        cross = estimate_edge_delays(trace, dag)
        new = merge_delays(cross, fit_gap_model(trace, dag=dag, cross=cross).edge_delays(dag))
        phases = tuple(GROUP)
        old_splits = decompose_trace(trace, phases=phases, dag=dag, cross=cross)
        new_splits = decompose_trace(trace, phases=phases, dag=dag, cross=cross, edge_ms=new)
        for (step, phase, b), (_, _, nb) in zip(old_splits, new_splits):
            c = b.ranks[b.critical_rank]
            splits.append(
                {
                    "schedule": trace.meta.schedule,
                    "group": phase,
                    "span_ms": b.span_ms,
                    "action_pct": 100 * b.action_ms / b.span_ms,
                    "dag_idle_pct": 100 * b.dag_idle_ms / b.span_ms,
                    "residual_pct": 100 * b.residual_ms / b.span_ms,
                    "offset_late_ms": c.offset_late_ms,
                    "free_ms": c.free_ms,
                    "wait_late_ms": c.wait_late_ms,
                    "residual_new_pct": 100 * nb.residual_ms / nb.span_ms,
                }
            )
            for s in b.gaps:
                samples.append((trace.meta.schedule, job.name, s))
    pooled = [(sch, job, _regroup(s)) for sch, job, s in samples]
    return splits, gap_table(pooled)


def _regroup(s):
    """The sample with its phase replaced by its :data:`GROUP`."""

    return replace(s, phase=GROUP[s.phase])


SPLIT_COLUMNS = (
    "span_ms",
    "action_pct",
    "dag_idle_pct",
    "residual_pct",
    "offset_late_ms",
    "free_ms",
    "wait_late_ms",
    "residual_new_pct",
)


def split_markdown(splits: list[dict]) -> str:
    """Per schedule and group, the median over batches of every :data:`SPLIT_COLUMNS` column."""
    lines = [
        "",
        "## Where a batch's span goes (median over batches)",
        "",
        "`action` + `DAG idle` + `residual` = span, on the critical rank (the rank that ends last), in % of the",
        "span; `DAG idle`: the DAG's longest path over the batch's measured action times with the cross-rank",
        "delays, minus that rank's action time. On the critical rank: `late start` (first action after its",
        "input was due), `free gaps` (gaps before actions whose cross-rank input was due by the previous",
        "action's end: the runtime's own time), `late waits` (starts after a due input), ms per batch.",
        "`residual, gap model`: the residual with the gap costs on the rank-order edges (fitted on this",
        "run's monitoring windows).",
        "",
        "| schedule | phases | batches | span ms | action % | DAG idle % | residual % | late start ms "
        "| free gaps ms | late waits ms | residual, gap model % |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = list(GROUP)
    keys = sorted({(r["schedule"], r["group"]) for r in splits}, key=lambda k: (k[0], order.index(k[1])))
    for sch, grp in keys:
        mine = [r for r in splits if r["schedule"] == sch and r["group"] == grp]
        cells = " | ".join(f"{statistics.median(r[c] for r in mine):.2f}" for c in SPLIT_COLUMNS)
        lines.append(f"| {sch} | {grp} | {len(mine)} | {cells} |")
    return "\n".join(lines) + "\n"


def gaps_markdown(rows: list[dict]) -> str:
    """The pooled gap classes: per schedule, rank, transition and input, monitoring next to stable."""
    lines = [
        "",
        "## Gaps between consecutive actions of a rank, by class",
        "",
        "`free`: the next action's cross-rank input was due by the previous action's end (what the gap model",
        "fits); `wait`: it was not (the gap is the DAG's waiting). ms, pooled over runs: median, mean,",
        "[q25, q75], share over 2 ms; `n` samples.",
        "",
        "| schedule | rank | transition | input | monitoring n | median | mean | [q25, q75] | >2 ms "
        "| stable n | median | mean | [q25, q75] | >2 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by = {(r["schedule"], r["rank"], r["transition"], r["input"], r["phase"]): r for r in rows}
    for key in sorted({k[:4] for k in by}):
        cells = []
        for grp in ("monitoring", "stable"):
            r = by.get((*key, grp))
            if r is None:
                cells.append("0 | - | - | - | -")
            else:
                cells.append(
                    f"{r['n']} | {r['median_ms']:.2f} | {r['mean_ms']:.2f} | [{r['q25_ms']:.2f}, {r['q75_ms']:.2f}]"
                    f" | {100 * r['over_2ms']:.0f} %"
                )
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=Path, default=Path("docs/results/comparison/jobs"))
    ap.add_argument("--pattern", default="*timelyfreeze*")
    ap.add_argument("--out", type=Path, default=Path("docs/results/runtime/gap_model.md"))
    args = ap.parse_args(argv)
    jobs = job_dirs(args.jobs, args.pattern)
    if not jobs:
        print(f"error: no job with a trace under {args.jobs} matching {args.pattern!r}", file=sys.stderr)
        return 2
    rows = [evaluate_job(j) for j in jobs]
    splits, gap_rows = analyse_jobs(jobs)
    command = "python scripts/gap_eval.py " + " ".join(
        ["--jobs", str(args.jobs), "--pattern", repr(args.pattern), "--out", str(args.out)]
    )
    write_outputs(rows, args.out, command, split_markdown(splits) + gaps_markdown(gap_rows))
    print(f"wrote {args.out} and {args.out.with_suffix('.csv')} ({len(rows)} runs)")
    return 0
