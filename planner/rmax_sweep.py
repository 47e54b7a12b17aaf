"""Sweep the freeze budget ``r_max``: predicted batch time and throughput gain for each value.

One problem (DAG, delays, LP arrays: :mod:`planner.lp.problem`) is built and reused for every LP solve.
``speedup`` is ``no_freeze / batch_ms`` (the predicted throughput relative to training without freezing),
``throughput_gain = speedup - 1``, and ``mean_ratio`` is the mean planned freeze ratio over all freezable
actions.  A value is one budget
for every stage (a number; what ``python -m planner sweep`` takes) or one per stage (a sequence of
``num_stages`` numbers, :mod:`planner.lp.budget`): the table and CSV write it as ``0.5,0.8,...`` and the plot
puts it at the mean of its values.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields

from planner.errors import PlannerError
from planner.fileio import replace_atomically
from planner.lp.budget import RMax, check_r_max
from planner.lp.problem import build_problem
from planner.lp.solve import solve_problem
from planner.schedule.dag import EdgeDelays, build_dag
from planner.trace.load import NodeWeights, TraceMeta


@dataclass(frozen=True)
class SweepRow:
    """The planned batch for one ``r_max`` (times in ms, ``seconds`` = LP solve wall time); ``r_max`` is a
    float, or a tuple of one float per stage."""

    r_max: float | tuple[float, ...]
    batch_ms: float
    speedup: float
    throughput_gain: float
    mean_ratio: float
    seconds: float
    no_freeze_ms: float
    all_frozen_ms: float


def check_r_values(r_values: list, num_stages: int | None = None) -> list[RMax]:
    """Every value must be a finite number in [0, 1], or a sequence of ``num_stages`` of them (any non-zero
    length when ``num_stages`` is None; :func:`planner.lp.budget.check_r_max`); at least one value."""
    out = [check_r_max(r, num_stages) for r in r_values]
    if not out:
        raise PlannerError("no r_max values to sweep")
    return out


def mean_freeze_ratio(durations: dict[str, float], weights: NodeWeights) -> float:
    """Mean of ``(w_max - d) / (w_max - w_min)`` over the freezable actions (0 if there are none)."""
    ratios = [
        (weights.w_max[a] - durations[a]) / (weights.w_max[a] - weights.w_min[a]) for a in sorted(weights.freezable)
    ]
    return sum(ratios) / len(ratios) if ratios else 0.0


def sweep(
    meta: TraceMeta,
    weights: NodeWeights,
    r_values: Sequence[float | Sequence[float]],
    *,
    solver: str = "auto",
    edge_ms: EdgeDelays | None = None,
    gap: float | None = None,
) -> list[SweepRow]:
    """Solve the freeze LP for every ``r_max`` in ``r_values`` (in the given order; each one number or one
    per stage) on one DAG, with the delays ``edge_ms`` on its edges (``planner.timing.comm``) when given; ``gap``: as
    :func:`planner.lp.solve.solve_freeze_lp`."""
    r_values = check_r_values(list(r_values), meta.num_stages)
    problem = build_problem(build_dag(meta), weights, r_values[0], edge_ms)
    no_freeze = problem.no_freeze
    all_frozen = problem.makespan(weights.w_min)
    rows: list[SweepRow] = []
    for r in r_values:
        sol = solve_problem(problem.with_r_max(r), solver=solver, gap=gap)
        speedup = no_freeze / sol.makespan if sol.makespan > 0 else 1.0
        rows.append(
            SweepRow(
                r_max=r,
                batch_ms=sol.makespan,
                speedup=speedup,
                throughput_gain=speedup - 1.0,
                mean_ratio=mean_freeze_ratio(sol.durations, weights),
                seconds=sol.seconds,
                no_freeze_ms=no_freeze,
                all_frozen_ms=all_frozen,
            )
        )
    return rows


def format_table(rows: list[SweepRow]) -> str:
    """A Markdown table: r_max, predicted batch ms, speedup vs no-freeze, mean freeze ratio."""
    lines = [
        "| r_max | batch ms | speedup | mean ratio |",
        "|------:|---------:|--------:|-----------:|",
    ]
    for row in rows:
        r = _r_text(row.r_max, ".3g")
        lines.append(f"| {r} | {row.batch_ms:.3f} | {row.speedup:.4f}x | {row.mean_ratio:.3f} |")
    if rows:
        lines.append(f"no freezing: {rows[0].no_freeze_ms:.3f} ms, everything frozen: {rows[0].all_frozen_ms:.3f} ms")
    return "\n".join(lines)


def _r_text(v: float | tuple[float, ...], spec: str) -> str:
    """A number with format ``spec``; a per-stage budget as its values joined by commas."""
    return ",".join(format(x, spec) for x in v) if isinstance(v, tuple) else format(v, spec)


def _x(r_max: float | tuple[float, ...]) -> float:
    """Where a row goes on the plot's r_max axis: the value, or the mean of a per-stage budget."""
    return sum(r_max) / len(r_max) if isinstance(r_max, tuple) else r_max


def write_csv(rows: list[SweepRow], path: str | os.PathLike[str]) -> None:
    """Write the rows as CSV with a header of the :class:`SweepRow` field names (atomic replace)."""
    names = [f.name for f in fields(SweepRow)]

    def write(tmp: str) -> None:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=names)
            w.writeheader()
            for row in rows:
                w.writerow({k: _r_text(v, ".9g") for k, v in asdict(row).items()})

    replace_atomically(os.fspath(path), write)


def plot_sweep(rows: list[SweepRow], path: str | os.PathLike[str], title: str | None = None) -> None:
    """PNG: predicted throughput vs ``r_max``, relative to no freezing (left axis) and in batches/s
    (right axis), with the no-freeze and all-frozen references as horizontal lines."""
    if not rows:
        raise PlannerError("no sweep rows to plot")
    import matplotlib  # deferred: matplotlib is heavy and only plots need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: matplotlib is heavy and only plots need it

    rows = sorted(rows, key=lambda r: _x(r.r_max))
    no_freeze, all_frozen = rows[0].no_freeze_ms, rows[0].all_frozen_ms
    xs = [_x(r.r_max) for r in rows]
    per_stage = any(isinstance(r.r_max, tuple) for r in rows)
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    ax.plot(xs, [r.speedup for r in rows], marker="o", color="tab:blue", label="planned (LP)")
    ax.axhline(1.0, color="0.4", linestyle="--", label=f"no freezing ({no_freeze:.2f} ms/batch)")
    if all_frozen > 0:
        ax.axhline(
            no_freeze / all_frozen,
            color="tab:green",
            linestyle=":",
            label=f"everything frozen ({all_frozen:.2f} ms/batch)",
        )
    ax.set_xlabel(
        "r_max (freeze budget: max mean freeze ratio per stage)"
        if not per_stage
        else "r_max (freeze budget; per-stage budgets at their mean)"
    )
    ax.set_ylabel("predicted throughput / no-freeze throughput")
    ax.set_xlim(min(0.0, xs[0]), max(1.0, xs[-1]))
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    if no_freeze > 0:
        # batches/s = 1000 / batch_ms = (1000 / no_freeze) * relative throughput: a linear secondary axis.
        scale = 1000.0 / no_freeze
        sec = ax.secondary_yaxis("right", functions=(lambda y: y * scale, lambda y: y / scale))
        sec.set_ylabel("predicted batches / s")
    ax.set_title(title or "Predicted throughput vs freeze budget")
    fig.tight_layout()
    try:
        replace_atomically(os.fspath(path), lambda tmp: fig.savefig(tmp, format="png"))
    finally:
        plt.close(fig)
