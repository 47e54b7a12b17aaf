"""The committed measurement of the runtime's own cost after the one-pass drift check and the overlapped gather
(``docs/results/runtime/overhead-3``, issue 48 item 5): every figure its page quotes is what the committed step
times give. Fails when a file is missing."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from tests.figures_util import linked_figures, overhead_job_rows
from timelyfreeze.experiments.runtime import report as rr
from timelyfreeze.experiments.stats import mean_ci

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "docs" / "results" / "runtime" / "overhead-3"
SCHEDULES = ("1F1B", "ZBVZeroBubble")


def _lines() -> list[dict]:
    return [json.loads(line) for line in (FOLDER / "results.jsonl").read_text().splitlines()]


def test_each_jobs_figures_are_what_its_committed_step_times_give_and_the_report_holds_their_means():
    lines = _lines()
    assert sorted((r["schedule"], r["repeat"]) for r in lines) == [(s, k) for s in SCHEDULES for k in range(6)]
    rows = overhead_job_rows(FOLDER)
    assert all("own_pct" in r for r in rows)  # every job of this protocol split the gather's wait out
    report = (FOLDER / "bench_runtime.md").read_text()
    made = [line for line in rr._overhead_means(rows, SimpleNamespace(schedules=list(SCHEDULES), r_max=0.6)) if line]
    assert len(made) == 2 and all(line in report for line in made)


def test_the_pages_figures_are_the_means_of_the_result_lines():
    """The page's table, row by row (own %, own ms, direct %, direct ms, the gather's wait in ms), each row 1F1B then
    ZBV: the mean [95 % t-interval] over the 6 jobs, linked to ``results.jsonl``; the README quotes some of them."""
    lines = _lines()
    made = []
    for key, unit in (("own_pct", "%"), ("own_ms", "ms"), ("direct_pct", "%"), ("direct_ms", "ms"), ("wait_ms", "ms")):
        for schedule in SCHEDULES:
            m, lo, hi, n = mean_ci(r[key] for r in lines if r["schedule"] == schedule)
            assert n == 6
            made.append(f"{m:.2f} [{lo:.2f}, {hi:.2f}] {unit}")
    assert linked_figures((FOLDER / "README.md").read_text(), r"results\.jsonl") == made
    for q in linked_figures((ROOT / "README.md").read_text(), r"overhead-3/results\.jsonl"):
        assert q in made, q
