"""A job's speed read off its actions' times: the machine's speed by its forward actions, a job's throughput ratio
with it taken out, and where a job's time went, per rank and action kind.

Freezing leaves every forward action as it is (it drops weight-gradient work, which only the backward does), so
the forward actions of two jobs over the same steps differ only by how fast the machine ran each: their time is
the yardstick of machine speed. ``kappa`` (``tta``) compares a job's stable throughput with its no-freezing
job's, run at another time, so machine drift between the two jobs is in it; ``kappa_fwd`` takes it out:

    kappa_fwd = (mean step of the no-freezing job over S / mean step of the job over S) x (F_job(S) / F_nf(S))

where S is the job's steady steps (:func:`steady_steps`) that the no-freezing job also ran, and F(S) is
:func:`forward_ms`, the sum over the schedule's forward actions of each one's median time over S (replica 0). A
job and its reference on an equally fast machine get ``kappa_fwd`` = their step-time ratio over S; a reference
whose machine ran 10 % slower (its forwards 10 % longer) has its steps scaled back by that much.

The time-to-accuracy ratio (``tta``: the job's training time to the target over the no-freezing job's) gets the
same treatment in ``tta_ratio_fwd``: ``tta_ratio x F_nf / F_job``, each F over the job's own steps but the first
(its start-up), since the two runs' step ranges differ.

Added after the runs of Study 1 of docs/results/smollm2-table1/README.md, whose jobs ran hours apart with forward
actions up to a third slower in some than in others; read beside the protocol's ``kappa``, never in its place.
What the forwards do not see (rank 0's weight-gradient time varied 1.8-4.0 s per step between ZBV jobs doing the
same work: that page's correction) stays in both.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection
from functools import lru_cache
from pathlib import Path
from typing import Any

from planner.errors import PlannerError
from planner.schedule.actions import action_kind
from planner.trace.load import load_trace
from timelyfreeze.experiments.sweep.results import read_metrics, steady_rows


def steady_steps(metrics: list[dict[str, Any]]) -> list[int]:
    """The steps of the run's steady phase that have a step time (``results.steady_rows``)."""
    return [m["step"] for m in steady_rows(metrics, "step_ms")]


@lru_cache(maxsize=256)
def _records(trace: str) -> tuple[tuple[int, str, str, int, float], ...]:
    """Replica 0's records of a trace (folder or archive) as (rank, kind, action, step, ms); () where it cannot be
    read."""
    try:
        records = load_trace(trace).records
    except PlannerError:
        return ()
    return tuple((r.rank, action_kind(r.action), r.action, r.step, r.ms) for r in records if r.replica == 0)


@lru_cache(maxsize=256)
def _forward_records(trace: str) -> dict[str, dict[int, list[float]]]:
    """Per forward action of replica 0, its times by step (cached: a reference's trace serves every arm it pairs
    with)."""
    out: dict[str, dict[int, list[float]]] = {}
    for _, kind, action, step, ms in _records(trace):
        if kind == "F":
            out.setdefault(action, {}).setdefault(step, []).append(ms)
    return out


def kind_times(trace: str | Path, steps: Collection[int]) -> dict[tuple[int, str], float]:
    """Per (rank, action kind), the median over ``steps`` of the step's summed time (ms) of that rank's actions of
    that kind (replica 0): where a job's time went, rank by rank. Steps without records are left out."""
    want = set(steps)
    per_step: dict[tuple[int, str], dict[int, float]] = {}
    for rank, kind, _, step, ms in _records(str(trace)):
        if step in want:
            sums = per_step.setdefault((rank, kind), {})
            sums[step] = sums.get(step, 0.0) + ms
    return {k: statistics.median(v.values()) for k, v in sorted(per_step.items())}


def forward_ms(trace: str | Path, steps: Collection[int]) -> float | None:
    """The sum over the trace's forward actions of each one's median time (ms) over ``steps``; None where an action
    has no record in those steps or the trace has none."""
    by_action = _forward_records(str(trace))
    if not by_action or not steps:
        return None
    total = 0.0
    for per_step in by_action.values():
        ms = [x for s in steps for x in per_step.get(s, ())]
        if not ms:
            return None
        total += statistics.median(ms)
    return total


def kappa_fwd(job: dict[str, Any], none: dict[str, Any]) -> float | None:
    """``kappa_fwd`` (module docstring) of a results row (``results.load_job``) against its no-freezing job's row;
    None without both traces, step times or common steady steps."""
    if job.get("_trace") is None or none.get("_trace") is None:
        return None
    steps = [
        s
        for s in steady_steps(read_metrics(job["_dir"] / "dump" / "timelyfreeze" / "metrics.jsonl"))
        if s in none["_step_ms"] and s in job["_step_ms"]
    ]
    if not steps:
        return None
    f_job, f_none = forward_ms(job["_trace"], steps), forward_ms(none["_trace"], steps)
    if not f_job or not f_none:
        return None
    t_job = sum(job["_step_ms"][s] for s in steps)
    t_none = sum(none["_step_ms"][s] for s in steps)
    return (t_none / t_job) * (f_job / f_none) if t_job > 0 else None


def tta_ratio_fwd(job: dict[str, Any], none: dict[str, Any], tta_ratio: float | None) -> float | None:
    """``tta_ratio`` with the machine's speed taken out (module docstring); None without it or both traces."""
    if tta_ratio is None or job.get("_trace") is None or none.get("_trace") is None:
        return None
    f_job = forward_ms(job["_trace"], [s for s in job["_step_ms"] if s > 1])
    f_none = forward_ms(none["_trace"], [s for s in none["_step_ms"] if s > 1])
    return tta_ratio * f_none / f_job if f_job and f_none else None
