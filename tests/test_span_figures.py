"""timelyfreeze.experiments.runtime.span_figures on committed runs and on bad input."""

from pathlib import Path

from timelyfreeze.experiments.runtime.span_figures import main, run_figures, table
from timelyfreeze.experiments.stats import fmt_ci, mean_ci

JOBS = Path("docs/results/runtime/monitoring/jobs")


def test_committed_runs_give_their_committed_table():
    """The committed runs give, figure for figure, the table committed beside them (``span_figures.md``): the
    figures are computed from committed files only, so any difference is a change to the computation or to
    the files. (Before: each run's stable span within +-50 % of its plan, which no plausible error fails.)"""
    runs = [run_figures(d.parent) for d in sorted(JOBS.glob("*/timelyfreeze/summary.json"))]
    assert len(runs) == 10 and all(r is not None for r in runs)
    assert all(r["replans"] >= 0 and r["lower_f"] > 0 for r in runs)
    assert table([JOBS]) == (JOBS.parent / "span_figures.md").read_text()


def test_no_folder_is_exit_2(tmp_path, capsys):
    assert main([str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.startswith("error:")


def test_intervals_are_the_mean_and_t_interval_of_each_run_figure(capsys):
    runs = [run_figures(d.parent) for d in sorted(JOBS.glob("*/timelyfreeze/summary.json"))]
    text = table([JOBS], intervals=True)
    assert text.startswith(table([JOBS]).split("\n\nOdd")[0])
    for schedule in ("1F1B", "ZBVZeroBubble"):
        rs = [r for r in runs if r["schedule"] == schedule]
        cells = [fmt_ci(*mean_ci(r[k] for r in rs)[:3], 2) for k in ("share_f", "share", "replans")]
        row = f"| {schedule} | {len(rs)} | {' | '.join(cells)} | {sum(1 for r in rs if not r['replans'])} |"
        assert row in text.splitlines()
    assert main(["--intervals", str(JOBS)]) == 0 and capsys.readouterr().out == text
