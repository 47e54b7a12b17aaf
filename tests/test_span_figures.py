"""timelyfreeze.experiments.runtime.span_figures on committed runs and on bad input."""

from pathlib import Path

from timelyfreeze.experiments.runtime.span_figures import main, run_figures, table

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
