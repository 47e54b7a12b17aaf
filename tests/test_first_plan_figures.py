"""Issue 39's first-plan figures: the interval, the lossless trace packing, and every README figure recomputed from
the committed traces of the runs it comes from (``docs/results/runtime/first-plan/``)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from tests.figures_util import linked_figures, overhead_job_rows
from timelyfreeze.experiments.runtime import first_plan as fp
from timelyfreeze.experiments.stats import median_ci

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results" / "runtime" / "first-plan"
TABLE = RESULTS / "first_plan.md"
QUIET = ROOT / "docs" / "results" / "runtime" / "first-plan-quiet"
"""The same two parts again on a quiet machine, under a protocol naming the first (issue 49, item 5)."""
FOLDERS = [RESULTS, QUIET]


def test_the_median_interval_takes_the_order_statistics_of_the_sign_test():
    med, lo, hi, cov = median_ci(range(10, 0, -1))  # 1..10 in any order
    assert (med, lo, hi) == (5.5, 2, 9)  # the 2nd and 9th smallest
    assert cov == pytest.approx(1 - 2 * 11 / 1024)  # P(Binomial(10, 1/2) <= 1) = 11/1024 on each side
    assert median_ci(range(5))[1:] == (None, None, None)  # 2 / 32 > 5 %: no 95 % interval from 5 runs
    assert median_ci(range(6))[1:3] == (0, 5)  # 2 / 64 <= 5 %


def test_pack_copies_a_finished_run_with_its_trace_archived_losslessly(tmp_path):
    """``pack`` writes the trace as ``planner.trace.archive`` does (tests/test_trace_archive.py), from a trace folder
    or from a dump whose trace was packed already; the dump stays as it was."""
    from planner.trace.archive import pack_trace, read_archive

    for k in range(2):
        tf = tmp_path / "dumps" / f"run{k}" / "timelyfreeze"
        (tf / "trace").mkdir(parents=True)
        (tf / "summary.json").write_text("{}\n")
        (tf / "trace" / "meta.json").write_text('{"format": "x"}\n')
        (tf / "trace" / "actions_rank0.jsonl").write_bytes(b'{"step": 1}\n' * 50)
    files = {f.name: f.read_bytes() for f in (tf / "trace").iterdir()}
    pack_trace(tf / "trace")
    assert fp.pack(tmp_path / "dumps", tmp_path / "jobs") == ["run0", "run1"]
    a, b = (tmp_path / "jobs" / f"run{k}" / fp.TRACE for k in range(2))
    assert read_archive(a) == read_archive(b) == files and a.read_bytes() == b.read_bytes()
    assert (tmp_path / "dumps" / "run0" / "timelyfreeze" / "trace" / "meta.json").is_file()


def test_bad_arguments_are_one_error_line(capsys, tmp_path):
    assert fp.main(["table", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: f.name)
def test_the_committed_table_is_what_the_committed_traces_give(folder):
    """Recomputed from each run's trace, plan and metrics: spans from the trace's timestamps, the first plan's
    prediction from plan.json, the F factor through the plan's DAG."""
    assert fp.table(folder / "jobs") == (folder / "first_plan.md").read_text()


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: f.name)
def test_every_readme_figure_linked_to_the_table_is_in_it(folder):
    table = (folder / "first_plan.md").read_text()
    quoted = []
    for doc in (ROOT / "README.md", ROOT / "docs" / "results" / "runtime" / "README.md"):
        quoted += linked_figures(doc.read_text(), rf"{folder.name}/first_plan\.md")
    quoted += linked_figures((folder / "README.md").read_text(), r"first_plan\.md")  # its own page's links
    assert quoted, f"no figure links to {folder.name}/first_plan.md"
    for q in quoted:
        for figure in re.split(r" and |; ", q):
            assert figure.strip() in table, figure


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: f.name)
def test_the_recomputation_agrees_with_what_the_runtime_wrote(folder):
    """A committed run's figures from its packed trace against its own summary.json (written at the end of the run
    from the same records)."""
    import json

    jobs = sorted((folder / "jobs").glob("phases_1F1B_*"))
    assert jobs, f"no committed run under {folder / 'jobs'}"
    r = fp.run_figures(jobs[0])
    s = json.loads((jobs[0] / "summary.json").read_text())
    # the summary's own figures, written by the runtime at the end of the run, agree with the recomputation
    assert r["share"] == pytest.approx(s["speedup"]["share_span"], rel=1e-6)
    if s["speedup"].get("f_factor_dag") is not None:
        assert r["f_factor"] == pytest.approx(s["speedup"]["f_factor_dag"], rel=1e-9)
    assert r["rescales"] + r["kept"] == len((s.get("monitoring") or {}).get("rescales") or [])
    assert math.isfinite(r["vs_first"])


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: f.name)
def test_the_overhead_figures_are_what_the_committed_step_times_give(folder):
    """Each overhead job's figures from its packed ``bench_overhead.json`` equal its result line; the report's
    lines from those figures are in the committed ``bench_runtime.md``, and every README figure linked to it is
    in it."""
    from types import SimpleNamespace

    from timelyfreeze.experiments.runtime import report as rr

    overhead = folder / "overhead"
    rows = overhead_job_rows(overhead)
    report = (overhead / "bench_runtime.md").read_text()
    opts = SimpleNamespace(schedules=sorted({r["schedule"] for r in rows}), r_max=0.6)
    made = [line for line in rr._overhead_means(rows, opts) if line]
    assert made and all(line in report for line in made)
    quoted = linked_figures((ROOT / "README.md").read_text(), rf"{folder.name}/overhead/bench_runtime\.md")
    quoted += linked_figures((folder / "README.md").read_text(), r"overhead/bench_runtime\.md")
    assert quoted, "no figure links to the overhead results"
    for q in quoted:
        assert q in report, q


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: f.name)
def test_every_median_interval_in_the_committed_table_is_labelled_with_its_real_coverage(folder):
    """Order statistics 2 and 9 of 10 runs cover 97.9 %, not 95 %: each column head says what its rows hold."""
    text = (folder / "first_plan.md").read_text()
    for section in text.split("### ")[1:-1]:
        runs = int(re.match(r"\S+: (\d+) runs", section).group(1))
        cov = median_ci(range(runs))[3]
        assert f"| median [{100 * cov:.1f} % interval] |" in section
    assert "median [95 % interval]" not in text


def test_the_quiet_overhead_in_ms_per_step_is_what_the_result_lines_give():
    """The direct cost in ms per step (issue 48 item 5 asks for it beside the percentage): mean [95 % t-interval]
    of each job's median time inside the runtime's own code, per schedule, as the page quotes it."""
    import json

    from timelyfreeze.experiments.stats import mean_ci

    lines = [json.loads(line) for line in (QUIET / "overhead" / "results.jsonl").read_text().splitlines()]
    quoted = linked_figures((QUIET / "README.md").read_text(), r"overhead/results\.jsonl")
    made = []
    for schedule in ("1F1B", "ZBVZeroBubble"):
        m, lo, hi, n = mean_ci(r["direct_ms"] for r in lines if r["schedule"] == schedule)
        assert n == 6
        made.append(f"{m:.2f} [{lo:.2f}, {hi:.2f}] ms")
    assert quoted == made
