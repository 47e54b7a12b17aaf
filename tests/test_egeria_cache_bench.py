"""The Egeria cache benchmark's bookkeeping (timelyfreeze/experiments/studies/egeria_cache_bench.py):
interleaved job order, per-epoch tokens/s, time to the no-freezing target, the report,
and a dry run that starts nothing."""

from timelyfreeze.experiments.studies import egeria_cache_bench as bench


def test_job_order_interleaves_and_rotates_the_arms():
    order = bench.job_order([0, 1])
    assert order[:3] == [(0, "none"), (0, "egeria"), (0, "egeria_cache")]
    assert order[3:] == [(1, "egeria"), (1, "egeria_cache"), (1, "none")]


def _rows(step_ms, vals):
    rows = [{"step": s, "step_ms": ms, "tokens_per_s": 2048 / (ms / 1e3)} for s, ms in enumerate(step_ms, 1)]
    return rows + [{"step": s, "val_loss": v} for s, v in vals]


def test_analyse_time_to_target_and_report():
    none = bench.analyse(_rows([1000] * 4, [(2, 3.0), (4, 2.5)]), {"method_summary": {}}, steps_per_epoch=2)
    assert none["tokens_per_s_epoch"] == {"1": 2048.0, "2": 2048.0}
    fast = bench.analyse(
        _rows([500, 500, 1000, 1000], [(2, 2.4), (4, 2.2)]),
        {"method_summary": {"cache_hits": 8, "forward_ms_saved": 3.5}},
        steps_per_epoch=2,
    )
    assert fast["tokens_per_s_epoch"]["1"] == 4096.0 and fast["cache"]["cache_hits"] == 8
    assert bench.time_to(fast, 2.5) == 1.0 and bench.time_to(none, 2.5) == 4.0 and bench.time_to(none, 1.0) is None
    jobs = [{"seed": 0, "arm": "none", **none}, {"seed": 0, "arm": "egeria_cache", **fast}]
    md = bench.report(jobs, "python scripts/bench_egeria_cache.py --seeds 0")
    assert "| egeria_cache | 4096.0 [4096.0, 4096.0] | 2048.0 [2048.0, 2048.0] | 2.2000" in md
    assert "| egeria | - | - |" in md


def test_dry_run_prints_commands_and_writes_nothing(tmp_path, capsys):
    assert bench.main(["--seeds", "3", "--out", str(tmp_path / "out"), "--dumps", str(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and all("pystdlib_finetune_fixed192_seed3" in line for line in out)
    assert any("--freeze.egeria.no-cache" in line for line in out)
    assert not (tmp_path / "out").exists()
