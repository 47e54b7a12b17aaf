"""The planner benchmark of 2026-11-29 (issue 48 item 4): every figure its page quotes is what the committed runs
give. Fails when a file is missing."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from tests.figures_util import linked_figures
from timelyfreeze.experiments.stats import median_ci

PAGE = Path(__file__).resolve().parents[1] / "docs" / "results" / "planner" / "bench_process_32x512_2026-11-29.md"
RUNS = PAGE.with_suffix(".jsonl")


def test_the_pages_figures_are_what_the_committed_runs_give():
    lines = [json.loads(line) for line in RUNS.read_text().splitlines()]
    runs, check = lines[:-1], lines[-1]
    assert check == {"same_plan_but_solver_seconds": True}
    assert sorted((r["run"], r["code"]) for r in runs) == sorted(
        (k, c) for k in range(1, 11) for c in ("before", "after")
    )
    made = []
    for code in ("before", "after"):
        for key in ("wall_s", "cpu_s"):
            m, lo, hi, cover = median_ci([r[key] for r in runs if r["code"] == code])
            assert round(cover, 3) == 0.979  # order statistics 2 and 9 of 10, as the page labels them
            made.append(f"{m:.2f} [{lo:.2f}, {hi:.2f}]")
    made[2] = f"**{made[2]}**"
    wall = {(r["run"], r["code"]): r["wall_s"] for r in runs}
    ratios = [wall[k, "after"] / wall[k, "before"] for k in range(1, 11)]
    made += [f"{statistics.median(ratios):.2f}", f"{min(ratios):.2f} to {max(ratios):.2f}"]
    assert linked_figures(PAGE.read_text(), r"bench_process_32x512_2026-11-29\.jsonl") == made
    readme = (PAGE.parents[3] / "README.md").read_text()
    quoted = linked_figures(readme, r"planner/bench_process_32x512_2026-11-29\.jsonl")
    assert quoted == [made[2], made[0].strip("*")]
