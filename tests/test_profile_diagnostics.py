"""docs/results/runtime/profile-2026-11-29/: every cumulative time its page quotes is what its committed pstats hold."""

from __future__ import annotations

import pstats
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "results" / "runtime" / "profile-2026-11-29"


def _cum(stats: pstats.Stats, path_end: str, func: str) -> tuple[int, float]:
    """(calls, cumulative seconds) of the one function ``func`` whose file ends in ``path_end``."""
    hits = [(v[1], v[3]) for (f, _, name), v in stats.stats.items() if name == func and f.endswith(path_end)]
    assert len(hits) == 1, (path_end, func, hits)
    return hits[0]


@pytest.mark.parametrize(
    "job,total,rows",
    [
        ("overhead_masked_1F1B_0", "0.094", ("0.066", "0.027", "0.026", "0.017")),
        ("overhead_masked_ZBVZeroBubble_0", "0.155", ("0.122", "0.083", "0.016", "0.016")),
    ],
)
def test_the_runtime_table_is_what_rank_0s_profile_holds(job, total, rows):
    s = pstats.Stats(str(PAGE / job / "profile_rank0.pstats"))
    assert f"{s.total_tt:.3f}" == total
    got = [
        _cum(s, "runtime/freeze_runtime.py", "end_step")[1],
        _cum(s, "plan/coordinator.py", "check_drift")[1],
        _cum(s, "job/collectives.py", "all_gather_floats")[1],
        _cum(s, "hooks/freezing.py", "before_action")[1],
    ]
    assert tuple(f"{v:.3f}" for v in got) == rows
    page = (PAGE / "README.md").read_text()
    assert all(v in page for v in (total, *rows))


def test_the_planner_figures_are_what_its_profile_holds():
    s = pstats.Stats(str(PAGE / "planner_plan_32x512.pstats"))
    page = " ".join((PAGE / "README.md").read_text().split())
    calls, cum = _cum(s, "planner/schedule/actions.py", "plain_fields")
    assert f"`plain_fields` **{calls} calls, {cum:.2f}**" in page
    for path_end, func in (
        ("planner/plan.py", "plan_problem"),
        ("planner/lp/solve.py", "solve_problem"),
        ("planner/schedule/dag.py", "build_dag"),
        ("planner/trace/load.py", "load_trace"),
        ("planner/plan.py", "write_plan"),
    ):
        assert f"{_cum(s, path_end, func)[1]:.2f}" in page, func
