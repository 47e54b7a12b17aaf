"""The time-to-accuracy grid (``scripts/tta_grid.toml``) parses and expands to the jobs its protocol
(``docs/results/tta/README.md``) names: 2 schedules x 5 seeds x {no freezing, TimelyFreeze r_max 0.6 and 1.0},
144 steps, freezing jobs extended up to 2x, each (seed, schedule)'s no-freezing job first; and every figure quoted
from its committed reports is what the committed jobs give."""

from pathlib import Path

import pytest

from tests.figures_util import linked_figures
from timelyfreeze.experiments.sweep.cli import main
from timelyfreeze.experiments.sweep.grid import expand_grid, load_grid_file

GRID = Path(__file__).resolve().parent.parent / "scripts" / "tta_grid.toml"


def test_tta_grid_expands_to_the_protocols_30_jobs():
    grid = load_grid_file(GRID)
    assert Path(grid["config"]).name == "llama3_debug_finetune_cpu.toml" and Path(grid["config"]).is_file()
    jobs = expand_grid(grid)
    assert len(jobs) == 30
    cells = {(j.schedule, j.method, j.knob_value) for j in jobs}
    methods = (("none", None), ("timelyfreeze", 0.6), ("timelyfreeze", 1.0))
    assert cells == {(s, m, v) for s in ("1F1B", "ZBVZeroBubble") for m, v in methods}
    assert sorted({j.seed for j in jobs}) == [0, 1, 2, 3, 4]
    for j in jobs:
        assert dict(j.overrides)["training.steps"] == 144
        assert j.extend == (None if j.method == "none" else 2.0)
    # seeds outermost, and within a (seed, schedule) the no-freezing job (the targets' source) first
    assert [j.seed for j in jobs] == sorted(j.seed for j in jobs)
    for k, j in enumerate(jobs):
        if j.method != "none":
            assert any(i.method == "none" and (i.seed, i.schedule) == (j.seed, j.schedule) for i in jobs[:k])


def test_tta_grid_dry_run(tmp_path, capsys):
    assert main(["run", "--grid", str(GRID), "--out", str(tmp_path / "tta"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("30 jobs") and out.count("--training.steps 144") == 30
    assert not (tmp_path / "tta").exists()  # a dry run writes nothing


TTA = GRID.parent.parent / "docs" / "results" / "tta"
REPORTS = {"report_final": None, "report_step108": 108}
"""The two committed reports of the protocol's commands, each with its ``--tta-step``."""


@pytest.mark.parametrize("report", list(REPORTS))
def test_every_readme_figure_is_what_the_committed_jobs_give(report):
    """Each README and results-page figure linked to a TTA report is a cell of that report's table, recomputed here
    from the committed jobs (``job.json``, ``summary.json``, ``metrics.jsonl``) with the report's own functions."""
    from timelyfreeze.experiments.stats import cell_stats
    from timelyfreeze.experiments.sweep.report import md_cells
    from timelyfreeze.experiments.sweep.results import load_rows
    from timelyfreeze.experiments.sweep.tta import tta_rows

    table = md_cells(cell_stats(tta_rows(load_rows(TTA), REPORTS[report])))
    committed = (TTA / report / "report.md").read_text()
    cells = {c.strip() for line in table.splitlines()[2:] for c in line.strip("|").split("|")}
    assert all(line in committed for line in table.splitlines()[2:])  # the committed report is today's
    quoted = []
    for doc in (GRID.parent.parent / "README.md", TTA / "README.md"):
        quoted += linked_figures(doc.read_text(), report + r"/(?:report\.md|cells\.csv)")
    assert quoted or report != "report_final", "no figure links to the primary target's report"
    for q in quoted:
        assert q.split(" (")[0] in cells, q


def test_the_sensitivity_figures_are_what_the_committed_jobs_give():
    """The committed ``tta_sensitivity.md`` is the report's own function on the committed jobs, and every README and
    results-page figure linked to it is one of its cells."""
    from timelyfreeze.experiments.sweep.report import SENSITIVITY_NAME, sensitivity_md
    from timelyfreeze.experiments.sweep.results import load_rows
    from timelyfreeze.experiments.sweep.tta import tta_rows

    committed = (TTA / "report_final" / SENSITIVITY_NAME).read_text()
    assert committed == sensitivity_md(tta_rows(load_rows(TTA)))
    cells = {c.strip() for line in committed.splitlines() if line.startswith("| ") for c in line.strip("|").split("|")}
    quoted = []
    for doc in (GRID.parent.parent / "README.md", TTA / "README.md"):
        quoted += linked_figures(doc.read_text(), r"report_final/tta_sensitivity\.md")
    assert len(quoted) >= 6
    assert all(q in cells for q in quoted), quoted
