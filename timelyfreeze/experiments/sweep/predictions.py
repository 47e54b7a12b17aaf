"""The planner's predictions the report draws, computed in this process with the ``planner`` package:
an r_max sweep of a run's trace (what ``python -m planner sweep`` prints) and a run's timeline
(what ``python -m planner gantt`` draws).

A planner failure is a :class:`planner.errors.PlannerError` (or OSError) that the report turns into
one warning; any other exception from the planner is wrapped in a PlannerError too, so one bad trace
never stops the report (as when the planner ran as a child process).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

from planner.errors import PlannerError
from planner.gantt import plot_timeline, trace_panels
from planner.plan import load_plan
from planner.rmax_sweep import sweep
from planner.trace.load import load_trace, node_weights


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
        """The planner's r_max sweep of one trace: a dict per r_max value with ``planner.rmax_sweep.SweepRow``'s
        fields (``r_max``, ``batch_ms``, ``speedup``, ... as floats)."""

        def run() -> list[dict[str, Any]]:
            tr = load_trace(trace)
            rows = sweep(tr.meta, node_weights(tr), list(r_values), solver=self.solver)
            return [{k: float(v) for k, v in asdict(r).items()} for r in rows]

        return _guarded("sweep", run)

    def gantt(self, trace: Path, plan: Path, out_png: Path) -> None:
        """Per-rank timeline PNG: measured upper bound, the plan's batch, and the measured stable phase
        when the trace has one (``planner.gantt.trace_panels``)."""

        def run() -> None:
            tr = load_trace(trace)
            panels, ratios, _ = trace_panels(tr, load_plan(plan), str(plan))
            plot_timeline(tr.meta, panels, out_png, ratios=ratios)

        _guarded("gantt", run)
