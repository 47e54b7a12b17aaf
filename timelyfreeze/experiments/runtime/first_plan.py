"""The stable phase against the *first* plan (issue 39): figures of finished runs recomputed from their committed
traces, with the re-anchored figures and the F-factor correction beside them, never instead.

A run's runtime keeps its monitoring plan (``plan.json``) and, in the stable phase, may re-anchor its prediction
on the stable steps themselves: a *rescale* (a uniform change of every group's speed multiplies the prediction)
or a *kept re-plan* (the plan stays and takes the new weights as its reference). The metrics' ``predicted_batch_ms``
is the re-anchored prediction. Per run, from its packed job folder (:func:`pack`):

- ``vs_first``: median over the stable steps of span / the first plan's planned batch time - 1 (its jitter factor
  included, as the runtime predicts; spans from the trace's ``start_ms``, ``planner.timing.spans``);
- ``vs_first_f``: the same with the stable phase's F factor out, span / (planned x F) - 1 (F: each rank's median
  forward time stable / upper laid on the monitoring plan's DAG, ``planner.timing.spans.plan_f_factor``);
- ``vs_first_fk``: the same with each stable step's own F factor out (:func:`step_f_factors`: the machine's speed
  in that step, which a co-tenant can change from one step to the next);
- ``vs_in_force``: the same against each stable step's ``predicted_batch_ms`` (the plan in force, re-anchored);
- ``share`` and ``share_f``: the achieved share of the first plan's predicted speed-up from the phases' median
  spans, raw and with the F factor out;
- ``rescales``, ``kept``, ``replans`` (from ``summary.json``) and ``anchored_steps``: the stable steps whose
  prediction was not the first plan's.

Per schedule: the median with its distribution-free interval (``stats.median_ci``; its real coverage, at least 95 %,
heads the column) and the mean with its Student-t interval. ``python scripts/first_plan_figures.py pack DUMPS JOBS``
packs finished bench jobs losslessly (``trace.tar.gz`` holds the whole trace folder, ``planner.trace.archive``);
``... table JOBS`` prints the tables.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from planner.fileio import replace_atomically
from planner.plan import load_plan
from planner.schedule.actions import action_kind
from planner.timing.spans import (
    achieved_share,
    dag_scale,
    forward_medians,
    phase_spans,
    plan_dag,
    plan_f_factor,
    step_spans,
)
from planner.trace.archive import SUFFIX, TRACE_NAME, find_trace, is_archive_path, write_archive
from planner.trace.load import load_trace
from timelyfreeze.experiments.stats import mean_ci, median_ci

FILES = ("summary.json", "metrics.jsonl", "plan.json")
TRACE = TRACE_NAME + SUFFIX
PCT = ("vs_first", "vs_first_f", "vs_first_fk", "vs_in_force", "upper_vs_no_freeze")
RATIO = ("share", "share_f", "f_factor")
COUNTS = ("rescales", "kept", "replans", "anchored_steps")


# -- packing ---------------------------------------------------------------------------------------
def _write_bytes(path: Path, data: bytes) -> None:
    replace_atomically(path, lambda tmp: Path(tmp).write_bytes(data))


def pack(dumps: Path, dest: Path) -> list[str]:
    """Every finished job under ``dumps`` (``<job>/timelyfreeze/summary.json``) into ``dest/<job>/``: ``FILES``,
    ``replans/``, ``TRACE`` and an overhead job's step times (``bench_overhead.json``); the names packed."""
    done = []
    for d in sorted(Path(dumps).iterdir()):
        src = d / "timelyfreeze"
        trace = find_trace(src / TRACE_NAME)
        if not (src / "summary.json").exists() or trace is None:
            continue
        out = Path(dest) / d.name
        out.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            if (src / name).exists():
                _write_bytes(out / name, (src / name).read_bytes())
        for f in sorted((src / "replans").glob("*.json")) if (src / "replans").is_dir() else []:
            (out / "replans").mkdir(exist_ok=True)
            _write_bytes(out / "replans" / f.name, f.read_bytes())
        if is_archive_path(trace):  # packed in its dump folder already
            _write_bytes(out / TRACE, trace.read_bytes())
        else:
            write_archive(trace, out / TRACE)
        if (d / "bench_overhead.json").exists():
            _write_bytes(out / "bench_overhead.json", (d / "bench_overhead.json").read_bytes())
        done.append(d.name)
    return done


# -- figures ---------------------------------------------------------------------------------------
def run_figures(job: Path) -> dict[str, Any] | None:
    """One packed run's figures (module docstring); None without a stable step with a span."""

    job = Path(job)
    s = json.loads((job / "summary.json").read_text())
    rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines() if line.strip()]
    plan = load_plan(job / "plan.json")
    trace = load_trace(job / TRACE)
    jitter = plan.extra.get("jitter") or {}
    first = {k: plan.batch_time_ms[k] * jitter.get(k, 1.0) for k in ("no_freeze", "planned")}
    spans = step_spans(trace)
    stable = [r for r in rows if r.get("phase") == "stable" and r["step"] in spans and r.get("predicted_batch_ms")]
    if not stable:
        return None
    f = plan_f_factor(trace, plan)
    fk = step_f_factors(trace, plan)
    with_fk = [r for r in stable if r["step"] in fk]
    med = phase_spans(trace, spans)
    predicted = first["no_freeze"] / first["planned"]
    measured = med["upper"] / med["stable"]
    monitoring = s.get("monitoring") or {}
    events = monitoring.get("rescales") or []
    return {
        "run": job.name,
        "schedule": s["schedule"],
        "steps": len(stable),
        "vs_first": statistics.median(spans[r["step"]] / first["planned"] - 1 for r in stable),
        "vs_first_f": statistics.median(spans[r["step"]] / (first["planned"] * f) - 1 for r in stable) if f else None,
        "vs_first_fk": statistics.median(spans[r["step"]] / (first["planned"] * fk[r["step"]]) - 1 for r in with_fk)
        if with_fk
        else None,
        "vs_in_force": statistics.median(spans[r["step"]] / r["predicted_batch_ms"] - 1 for r in stable),
        "upper_vs_no_freeze": med["upper"] / first["no_freeze"] - 1,
        "share": achieved_share(measured, predicted),
        "share_f": achieved_share(measured * f, predicted) if f else None,
        "f_factor": f,
        "rescales": sum(1 for e in events if not e.get("kept_replan")),
        "kept": sum(1 for e in events if e.get("kept_replan")),
        "replans": len(s.get("replans") or []),
        "anchored_steps": sum(1 for r in stable if abs(r["predicted_batch_ms"] / first["planned"] - 1) > 1e-9),
    }


def step_f_factors(trace, plan) -> dict[int, float]:
    """Per step: each pipeline rank's median over its F records of the step of (ms / the action's median in the
    upper-bound window), laid on ``plan``'s DAG (``planner.timing.spans.dag_scale``): how much slower the plan's
    batch is on that step's machine. Steps where a rank has no F record are left out."""

    dag, edges = plan_dag(trace, plan)
    ref = forward_medians(trace, "upper")
    rank = {a: r for r, order in trace.meta.rank_orders.items() for a in order}
    per: dict[int, dict[int, list[float]]] = {}
    for rec in trace.records:
        if rec.replica == 0 and action_kind(rec.action) == "F" and ref.get(rec.action, 0.0) > 0:
            per.setdefault(rec.step, {}).setdefault(rank[rec.action], []).append(rec.ms / ref[rec.action])
    durations = {a: ap.duration for a, ap in plan.actions.items()}
    out = {}
    for k, ranks in sorted(per.items()):
        f = dag_scale(dag, durations, {r: statistics.median(v) for r, v in ranks.items()}, edges)
        if f:
            out[k] = f
    return out


def _fmt(v: float | None, key: str) -> str:
    if v is None:
        return "n/a"
    return f"{100 * v:+.1f} %" if key in PCT else f"{v:.2f}"


def _stat_cells(vals: list[float], key: str) -> tuple[str, str]:
    """(``median [lo, hi]``, ``mean [lo, hi]``) of one column; numbers of ``PCT`` keys in %."""

    med, lo, hi, _ = median_ci(vals)
    m, mlo, mhi, _ = mean_ci(vals)
    scale, unit = (100, " %") if key in PCT else (1, "")
    sign = "+" if key in PCT else ""

    def num(x):
        return "n/a" if x is None else f"{scale * x:{sign}.{1 if key in PCT else 2}f}"

    return f"{num(med)}{unit} [{num(lo)}, {num(hi)}]", f"{num(m)}{unit} [{num(mlo)}, {num(mhi)}]"


LABELS = {
    "vs_first": "stable span vs first plan",
    "vs_first_f": "stable span vs first plan, the stable phase's F factor out",
    "vs_first_fk": "stable span vs first plan, each step's own F factor out",
    "vs_in_force": "stable span vs plan in force (re-anchored)",
    "upper_vs_no_freeze": "upper span vs no-freeze prediction",
    "share": "share of the first plan's speed-up, raw",
    "share_f": "share, F factor out",
    "f_factor": "F factor (stable / upper, on the plan's DAG)",
}


def table(jobs: Path, loads: dict[str, float] | None = None) -> str:
    """The per-schedule summary and the per-run figures of every packed run under ``jobs`` (``loads``: a run's
    ``loadavg_1m`` at its end, from the bench's ``results.jsonl`` next to ``jobs``)."""
    jobs = Path(jobs)
    if loads is None:
        res = jobs.parent / "results.jsonl"
        loads = {}
        if res.exists():
            for line in res.read_text().splitlines():
                r = json.loads(line)
                loads[f"{r['kind']}_{r['schedule']}_{r['repeat']}"] = r.get("loadavg_1m")
    runs = [r for d in sorted(jobs.iterdir()) if (d / "summary.json").exists() and (r := run_figures(d))]
    out = [
        "Per schedule: median [distribution-free interval of the median: order statistics, the sign test's, the "
        "narrowest whose coverage is at least 95 %; its exact coverage heads the column] and mean [95 % Student-t "
        "interval] over the runs.",
        "",
    ]
    for schedule in sorted({r["schedule"] for r in runs}):
        rs = [r for r in runs if r["schedule"] == schedule]
        cov = median_ci(range(len(rs)))[3]
        out += [
            f"### {schedule}: {len(rs)} runs"
            + (f" (median interval coverage {100 * cov:.1f} %)" if cov else " (too few runs for a median interval)"),
            "",
            f"| figure | median [{f'{100 * cov:.1f} %' if cov else 'no'} interval] | mean [95 % interval] |",
            "|---|---|---|",
        ]
        for key, label in LABELS.items():
            vals = [r[key] for r in rs if r[key] is not None]
            med, mean = _stat_cells(vals, key) if vals else ("n/a", "n/a")
            out.append(f"| {label} | {med} | {mean} |")
        for key, label in (
            ("rescales", "rescales per run"),
            ("kept", "kept re-plans per run"),
            ("replans", "re-plans taken per run"),
            ("anchored_steps", f"stable steps judged against a re-anchored prediction (of {rs[0]['steps']})"),
        ):
            vals = [r[key] for r in rs]
            out.append(
                f"| {label} | median {statistics.median(vals):g}, {sum(1 for v in vals if v)} of {len(rs)} runs "
                f"with any, {sum(vals)} in all | |"
            )
        out.append("")
    out += [
        "### Per run",
        "",
        "| run | loadavg 1 min | vs first plan | phase F out | step F out | vs plan in force | F factor | share raw "
        "| share F out | rescales | kept re-plans | re-plans |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        load = loads.get(r["run"])
        out.append(
            f"| {r['run']} | {'n/a' if load is None else f'{load:.2f}'} | {_fmt(r['vs_first'], 'vs_first')} | "
            f"{_fmt(r['vs_first_f'], 'vs_first')} | {_fmt(r['vs_first_fk'], 'vs_first')} | "
            f"{_fmt(r['vs_in_force'], 'vs_first')} | {_fmt(r['f_factor'], '')} | "
            f"{_fmt(r['share'], '')} | {_fmt(r['share_f'], '')} | {r['rescales']} | {r['kept']} | {r['replans']} |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    usage = "give 'pack DUMPS JOBS' or 'table JOBS'"
    if args[:1] == ["pack"] and len(args) == 3 and Path(args[1]).is_dir():
        names = pack(Path(args[1]), Path(args[2]))
        print(f"packed {len(names)} runs into {args[2]}")
        return 0
    if args[:1] == ["table"] and len(args) == 2 and Path(args[1]).is_dir():
        print(table(Path(args[1])), end="")
        return 0
    print(f"error: {usage} (folders that exist), got {' '.join(args) or 'nothing'}", file=sys.stderr)
    return 2
