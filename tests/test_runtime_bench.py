"""The runtime benchmark's bookkeeping (no torchrun): job order, resume keys, aggregation, the report."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from timelyfreeze.experiments.runtime import bench as rb
from timelyfreeze.experiments.runtime import report as rr
from timelyfreeze.experiments.runtime.analysis import decompose, paired_differences


def opts(**kw):
    o = SimpleNamespace(
        schedules=["1F1B", "ZBVZeroBubble"],
        repeats=2,
        skip_overhead=False,
        load_change=["1F1B"],
        load_repeats=1,
        pinning_ab=["1F1B"],
        layout_key=rb.DEFAULT_LAYOUT,
        nproc=2,
        layout_text="PP=2",
        size_text="seq 256, 8 microbatches",
        r_max=0.8,
        monitor=4,
        ramp=3,
        stable=12,
        load_core=None,
    )
    o.__dict__.update(kw)
    return o


def test_jobs_are_interleaved_repeat_by_repeat():
    jobs = rb.plan_jobs(opts())
    assert jobs[:6] == [
        ("overhead", "1F1B", 0),
        ("phases", "1F1B", 0),
        ("overhead", "ZBVZeroBubble", 0),
        ("phases", "ZBVZeroBubble", 0),
        ("load", "1F1B", 0),
        ("unpinned", "1F1B", 0),
    ]
    assert ("load", "1F1B", 1) not in jobs and ("unpinned", "1F1B", 1) in jobs and len(jobs) == 11


def test_aggregate_is_median_and_range_and_skips_missing():
    assert rr.agg([3.0, 1.0, 2.0], ".1f") == "2.0 [1.0, 3.0]"
    assert rr.agg([5.0, None, math.nan], ".0f") == "5"
    assert rr.agg([], ".0f") == "n/a"


def test_other_layouts_get_their_own_files_and_dirs():
    assert rb.job_dir_name("phases", "1F1B", 3, opts()) == "phases_1F1B_3"
    fsdp = opts(layout_key="PP=2 x FSDP 2; seq 256, 8 microbatches")
    assert rb.job_dir_name("phases", "1F1B", 3, fsdp) == "phases_1F1B_3_PP-2-x-FSDP-2--seq-256--8-microbatches"


def test_report_has_one_row_per_schedule_and_the_extra_tables():
    def phases(s, i, share):
        return {
            "kind": "phases",
            "schedule": s,
            "repeat": i,
            "stable_ms": 100.0,
            "pred_planned_ms": 95.0,
            "error_pct": 5.0,
            "model_gap_pct": 2.0,
            "action_drift_pct": 3.0,
            "speedup_measured": 1.2,
            "speedup_predicted": 1.25,
            "share_pct": share,
            "replans": 1,
            "avg_freeze_ratio": 0.5,
            "upper_ms": 120.0,
        }

    rows = [
        phases("1F1B", 0, 80.0),
        phases("1F1B", 1, 90.0),
        phases("ZBVZeroBubble", 0, 70.0),
        {"kind": "overhead", "schedule": "1F1B", "repeat": 0, "overhead_pct": 0.5, "direct_pct": 0.25},
        {
            "kind": "load",
            "schedule": "1F1B",
            "repeat": 0,
            "share_pct": 10.0,
            "replans": 2,
            "replan_step": 20,
            "stable_after_ms": 150.0,
            "pred_after_planned_ms": 140.0,
            "error_after_pct": 7.0,
            "share_after_pct": 60.0,
        },
        dict(phases("1F1B", 0, 50.0), kind="unpinned"),
    ]
    text = rr.report(rows, opts())
    assert "| 1F1B | 2 | +0.50 % / 0.25 % | 100 [100, 100] / 95 [95, 95] |" in text
    assert "85 [80, 90] %" in text and "| ZBVZeroBubble | 1 |" in text
    assert "| 1F1B | 1 | 1 | 6 |" in text  # the first re-plan 6 steps after the ramp (3 + 8 + 3 = 14)
    assert "| 1F1B | off | 1 |" in text
    rows.append({"kind": "overhead", "schedule": "1F1B", "repeat": 1, "overhead_pct": 1.5, "direct_pct": 0.75})
    assert "over 2 jobs: wall 1.00 [-5.35, 7.35] %, direct 0.50 [-2.68, 3.68] %" in rr.report(rows, opts())


def test_overhead_pairs_cancel_a_linear_drift_of_the_machine():
    # the machine speeds up by 10 ms a step; attached steps cost 3 ms more: every difference is exactly 3 ms
    kinds = ["cycle", "hooks", "plain", "hooks", "plain", "hooks", "plain"]
    rows = [
        {"step": 8 + i, "kind": k, "s": 1.0 - 0.010 * i + (0.003 if k == "hooks" else 0.0)} for i, k in enumerate(kinds)
    ]
    diffs = paired_differences([r for r in rows if r["kind"] != "cycle"])
    assert len(diffs) == 3
    assert diffs[1:] == pytest.approx([0.003, 0.003])  # both neighbours detached: the drift cancels
    assert diffs[0] == pytest.approx(0.003 + 0.010)  # the first attached step has one detached neighbour


def test_overhead_cycles_put_every_kind_on_odd_and_even_steps_between_detached_ones():
    from timelyfreeze.experiments.runtime.analysis import BASE, CYCLES

    for mode, cycle in CYCLES.items():
        assert len(cycle) % 2 == 1  # odd length: a kind's steps alternate in parity
        twice = cycle * 2
        for i, kind in enumerate(cycle):
            if kind != BASE[mode]:
                assert twice[i - 1] == BASE[mode] and twice[i + 1] == BASE[mode]


def test_the_overhead_probe_is_its_own_attached_kind():
    # 5 ms for a full attached step, 1 ms for a probe step, on a machine whose steps are 1 s
    kinds = ["hooks", "plain", "probe", "plain"] * 3
    rows = [
        {"step": 9 + i, "kind": k, "s": 1.0 + {"hooks": 0.005, "probe": 0.001}.get(k, 0.0), "direct_s": 0.002}
        for i, k in enumerate(kinds)
    ]
    fig = rb.overhead_figures(rows)
    assert fig["overhead_pct"] == pytest.approx(0.5) and fig["probe_pct"] == pytest.approx(0.1)
    assert fig["direct_pct"] == pytest.approx(0.2) and fig["pairs"] == 3
    o = opts(skip_overhead=False, overhead_only=True, overhead_probe=True, repeats=1)
    assert [j for j in rb.plan_jobs(o) if j[0].startswith("overhead")] == [
        ("overhead_probe", "1F1B", 0),
        ("overhead_probe", "ZBVZeroBubble", 0),
    ]
    rows = [{"kind": "overhead_probe", "schedule": "1F1B", "repeat": i, **fig} for i in range(2)]
    assert "(with the no-op probe steps), 1F1B, mean [95 % interval] over 2 jobs: wall 0.50 [" in rr.report(rows, o)


def test_masked_overhead_compares_attached_steps_with_masked_ones_and_reports_the_masks_alone():
    # at a plan's ratios: attached steps 6 ms over masked ones of 1 s; the draw 1 ms and the switches 0.5 ms a step
    kinds = ["hooks", "masked", "masked"] * 3
    rows = [
        {
            "step": 15 + i,
            "kind": k,
            "s": 1.0 + (0.006 if k == "hooks" else 0.0),
            "ratio": 0.45,
            **({"direct_s": 0.004, "hook_s": 0.002} if k == "hooks" else {"draw_s": 0.001, "switch_s": 0.0005}),
        }
        for i, k in enumerate(kinds)
    ]
    fig = rb.overhead_figures(rows)
    assert fig["overhead_pct"] == pytest.approx(0.6) and fig["pairs"] == 3
    assert fig["draw_pct"] == pytest.approx(0.1) and fig["switch_pct"] == pytest.approx(0.05)
    assert fig["hook_pct"] == pytest.approx(0.2) and fig["ratio_hooks"] == fig["ratio_masked"] == pytest.approx(0.45)
    o = opts(skip_overhead=False, overhead_only=True, overhead_masked=True, repeats=1)
    assert [j for j in rb.plan_jobs(o) if j[0].startswith("overhead")] == [
        ("overhead_masked", "1F1B", 0),
        ("overhead_masked", "ZBVZeroBubble", 0),
    ]
    rows = [{"kind": "overhead_masked", "schedule": "1F1B", "repeat": i, **fig} for i in range(2)]
    text = rr.report(rows, o)
    assert "Overhead at r_max 0.8 (attached vs masked: the same plan's masks, no runtime), 1F1B, mean [95 %" in text
    assert "draw 0.100 [0.100, 0.100] %, switches 0.050 [0.050, 0.050] %" in text


def test_decompose_without_a_trace_is_empty(tmp_path):
    assert decompose(tmp_path) == {}


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--schedules", "Nope"], "error: --schedules: unknown schedule 'Nope'"),
        (["--repeats", "0"], "error: --repeats: must be >= 1"),
        (["--r-max", "2"], "error: --r-max: must lie in [0, 1]"),
        (["--overhead-masked", "--r-max", "0"], "error: --overhead-masked: needs --r-max above 0"),
        (["--overhead-masked", "--overhead-probe"], "error: --overhead-masked and --overhead-probe: choose one"),
        (["--noise-core", "99"], "error: --noise-core: no core 99 on this machine"),
        (["--noise-core", "0", "--noise-on", "0"], "error: --noise-on: must be a number of seconds > 0"),
        (["--noise-off", "-1"], "error: --noise-off: must be a number of seconds > 0"),
    ],
)
def test_bad_options_are_one_error_line(capsys, argv, needle):
    with pytest.raises(SystemExit) as e:
        rb.main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith(needle) and "\n" not in err


def test_a_profile_folder_that_cannot_be_one_is_one_error_line(capsys, tmp_path):
    """``--profile``: a file, a folder under a file, or nothing to profile is bad input, before any job runs."""
    (tmp_path / "f").write_text("")
    for argv, needle in (
        (["--profile", str(tmp_path / "f")], f"error: --profile: {tmp_path / 'f'} is a file, not a folder"),
        (["--profile", str(tmp_path / "f" / "p")], f"error: --profile: cannot make the folder {tmp_path / 'f' / 'p'}"),
        (["--profile", str(tmp_path / "p"), "--skip-overhead"], "error: --profile: profiles the overhead jobs"),
    ):
        with pytest.raises(SystemExit) as e:
            rb.main(argv)
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and err.startswith(needle) and "\n" not in err, err
    assert not (tmp_path / "p").exists()


def test_replan_ab_pairs_on_and_off_of_the_same_repeat():
    o = opts(replan_ab=["1F1B"], load_core=1, pinning_ab=[], skip_overhead=True, repeats=2, load_repeats=2)
    jobs = rb.plan_jobs(o)
    assert jobs[:5] == [
        ("phases", "1F1B", 0),
        ("phases", "ZBVZeroBubble", 0),
        ("load_core1", "1F1B", 0),
        ("noreplan", "1F1B", 0),
        ("load_core1_noreplan", "1F1B", 0),
    ]
    rows = []
    for i, (on, off) in enumerate([(90.0, 100.0), (95.0, 100.0)]):
        for kind, ms in (("phases", on), ("noreplan", off), ("load_core1", on), ("load_core1_noreplan", off)):
            # the "on" jobs ran on a machine 10 % slower: taken out, re-planning was 1.1 x as fast again
            f = 11.0 if "noreplan" not in kind else 10.0
            row = {"kind": kind, "schedule": "1F1B", "repeat": i, "stable_ms": ms, "replans": 1, "upper_f_ms": f}
            rows.append(row | {"avg_freeze_ratio": 0.5 if "noreplan" in kind else 0.25})
    lines = rr._replan_ab(rows, o)
    quiet = next(line for line in lines if line.startswith("| 1F1B | quiet | 2 |"))
    assert "| 92 [90, 95] | 100 [100, 100] | 0.925 [" in quiet
    assert "| 0.841 [" in quiet and "| 0.250 [0.250, 0.250] / 0.500 [0.500, 0.500] |" in quiet
    assert any("| 1F1B | co-tenant from the stable phase | 2 |" in line for line in lines)


def test_the_noisy_cotenant_comes_and_goes_on_its_core_and_is_named_in_the_report():
    import subprocess
    import time
    from types import SimpleNamespace

    from timelyfreeze.experiments.runtime.report import _noise_means

    assert rb.noisy_cotenant(SimpleNamespace(noise_core=None)) is None
    opts = SimpleNamespace(noise_core=0, noise_on=0.05, noise_off=0.05, schedules=["1F1B"])
    p = rb.noisy_cotenant(opts)
    try:
        deadline = time.monotonic() + 30
        while p.poll() is None and time.monotonic() < deadline:
            out = subprocess.run(["taskset", "-pc", str(p.pid)], capture_output=True, text=True).stdout
            if out.strip().endswith(": 0"):
                break
            time.sleep(0.05)
        assert p.poll() is None and out.strip().endswith(": 0")
    finally:
        p.kill()
        p.wait()
    rows = [{"kind": "phases", "schedule": "1F1B", "replans": n, "share_pct": 90.0 + n} for n in (0, 0, 2)]
    text = "\n".join(_noise_means(rows, opts))
    assert "busy loop pinned to core 0, on 0.05 s / off 0.05 s" in text
    assert "| 1F1B | 3 | 0.67 [" in text and "| 2 | 91 [" in text


def test_the_gathers_wait_is_taken_out_of_the_own_cost_and_stated_beside_it():
    # attached steps of 4 ms direct, 1.5 ms of it waiting in the gather, over masked steps of 1 s
    kinds = ["hooks", "masked", "masked"] * 3
    steps = [
        {
            "step": 15 + i,
            "kind": k,
            "s": 1.0,
            "ratio": 0.4,
            **(
                {"direct_s": 0.004, "hook_s": 0.002, "own_s": 0.0025, "wait_s": 0.0015}
                if k == "hooks"
                else {"draw_s": 0.001, "switch_s": 0.0005}
            ),
        }
        for i, k in enumerate(kinds)
    ]
    fig = rb.overhead_figures(steps)
    assert fig["own_pct"] == pytest.approx(0.25) and fig["own_ms"] == pytest.approx(2.5)
    assert fig["wait_ms"] == pytest.approx(1.5) and fig["direct_pct"] == pytest.approx(0.4)
    o = opts(skip_overhead=False, overhead_only=True, overhead_masked=True, repeats=1)
    rows = [{"kind": "overhead_masked", "schedule": "1F1B", "repeat": i, **fig} for i in range(2)]
    text = rr.report(rows, o)
    assert "direct 0.40 [0.40, 0.40] % (without the gather's wait: 0.25 [0.25, 0.25] %); the masks" in text
    assert "own_step_ms" not in fig  # rows without the split give none
    split = [
        dict(r, own_hook_s=0.0012, own_profiler_s=0.0003, own_step_s=0.001) if r["kind"] == "hooks" else r
        for r in steps
    ]
    parts = rb.overhead_figures(split)
    assert (parts["own_hook_ms"], parts["own_profiler_ms"], parts["own_step_ms"]) == pytest.approx((1.2, 0.3, 1.0))
    split = [  # the bench since the actions' frames are timed whole
        dict(r, own_actions_s=0.002, own_draws_s=0.0003, own_step_s=0.001) if r["kind"] == "hooks" else r for r in steps
    ]
    parts = rb.overhead_figures(split)
    assert (parts["own_actions_ms"], parts["own_draws_ms"], parts["own_step_ms"]) == pytest.approx((2.0, 0.3, 1.0))
    assert "own_hook_ms" not in parts and "own_profiler_ms" not in parts
    no_hook = [{k: v for k, v in r.items() if k != "hook_s"} for r in steps]  # (the new bench has no hook_s)
    text = rr.report(
        [
            {"kind": "overhead_masked", "schedule": "1F1B", "repeat": i, **rb.overhead_figures(no_hook)}
            for i in range(2)
        ],
        o,
    )
    assert "switches 0.050 [0.050, 0.050] %; mean applied ratio" in text and "the freezing hook inside" not in text
    older = [{k: v for k, v in r.items() if k not in ("own_s", "wait_s")} for r in steps]  # jobs before the split
    assert "own_pct" not in rb.overhead_figures(older)
