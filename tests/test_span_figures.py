"""timelyfreeze.experiments.runtime.span_figures on committed runs and on bad input."""

from pathlib import Path

from timelyfreeze.experiments.runtime.span_figures import main, run_figures, table

JOBS = Path("docs/results/runtime/monitoring/jobs")


def test_committed_runs_give_their_figures():
    runs = [run_figures(d.parent) for d in sorted(JOBS.glob("*/timelyfreeze/summary.json"))]
    assert len(runs) == 10 and all(r is not None for r in runs)
    for r in runs:
        assert -0.5 < r["stable_vs_plan"] < 0.5 and r["replans"] >= 0 and r["lower_f"] > 0
    text = table([JOBS])
    assert "| 1F1B | 5 |" in text and "| ZBVZeroBubble | 5 |" in text


def test_no_folder_is_exit_2(tmp_path, capsys):
    assert main([str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.startswith("error:")
