"""The planner's predictions the report draws, computed in this process with the ``planner`` package:
an r_max sweep of a run's trace (what ``python -m planner sweep`` prints) and a run's timeline
(what ``python -m planner gantt`` draws).

A planner failure is a :class:`planner.errors.PlannerError` (or OSError) that the report turns into
one warning; any other exception from the planner is wrapped in a PlannerError too, so one bad trace
never stops the report (as when the planner ran as a child process).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from planner.budget import format_r_max
from planner.errors import PlannerError


def _guarded(what: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except (PlannerError, OSError):
        raise
    except Exception as e:
        raise PlannerError(f"planner {what}: {type(e).__name__}: {e}") from e


class Planner:
    """The planner calls of the report (tests substitute a fake with the same two methods)."""

    def __init__(self, solver: str = "auto"):
        self.solver = solver

    def sweep(self, trace: Path, r_values: Sequence[float]) -> list[dict[str, Any]]:
        """The planner's r_max sweep of one trace: a dict per r_max value with ``planner.sweep.SweepRow``'s
        fields (``r_max``, ``batch_ms``, ``speedup``, ... as floats)."""
        from dataclasses import asdict

        from planner.sweep import sweep
        from planner.trace import load_trace, node_weights

        def run() -> list[dict[str, Any]]:
            tr = load_trace(trace)
            rows = sweep(tr.meta, node_weights(tr), list(r_values), solver=self.solver)
            return [{k: float(v) for k, v in asdict(r).items()} for r in rows]

        return _guarded("sweep", run)

    def gantt(self, trace: Path, plan: Path, out_png: Path) -> None:
        """Per-rank timeline PNG: measured upper bound, the plan's batch, and the measured stable phase
        when the trace has one."""
        from planner.gantt import plot_timeline, stable_panel
        from planner.plan import check_plan_matches, load_plan
        from planner.trace import load_trace, node_weights

        def run() -> None:
            tr = load_trace(trace)
            meta = tr.meta
            p = load_plan(plan)
            check_plan_matches(p, meta.schedule, meta.num_stages, meta.num_microbatches, str(plan))
            actions = meta.all_actions()
            missing = [a for a in actions if a not in p.actions]
            if missing:
                raise PlannerError(f"{plan}: plan has no entry for action {missing[0]!r} of the trace")
            panels: list[tuple[str, dict[str, float]]] = [
                ("measured, nothing frozen (upper bound)", node_weights(tr).w_max),
                (f"planned, r_max={format_r_max(p.r_max)}", {a: p.actions[a].duration for a in actions}),
            ]
            ratios: list[dict[str, float] | None] = [None, {a: p.actions[a].freeze_ratio for a in actions}]
            stable = stable_panel(tr)
            if stable is not None and stable[2]:
                stable = None
            if stable is not None:
                panels.append(("measured, stable phase (median)", stable[0]))
                ratios.append(stable[1])
            plot_timeline(meta, panels, out_png, ratios=ratios)

        _guarded("gantt", run)
