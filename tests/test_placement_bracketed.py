"""The bracketed placement study (docs/results/placement-bracketed/README.md): the grid expands to the protocol's
90 jobs in its order (and the dry run prints it), the planned precision from the committed pairs, and the report on
synthetic job folders (committed TimelyFreeze jobs copied, their batch and forward times rewritten): no training.
The sweep's side (bracket = true, a block runs again whole) is tested in test_placement.py."""

import csv
import json
import math
import shutil
import statistics
from pathlib import Path

import pytest

from planner.timing.spans import f_factor
from planner.trace.archive import unpack_trace
from planner.trace.load import load_trace
from timelyfreeze.experiments.stats import NO_DIFFERENCE, half_width, n_for_half_width, pooled_sd
from timelyfreeze.experiments.studies.placement_bracketed import (
    BEYOND,
    FASTER,
    QUANTITIES,
    UNDECIDED,
    WITHIN,
    answer,
    block_row,
    bracketed_cells,
    checks,
    design,
    main,
    size_verdict,
    statement,
)
from timelyfreeze.experiments.sweep.cli import main as sweep_main
from timelyfreeze.experiments.sweep.grid import Job, bracket_blocks, expand_grid, load_grid_file

REPO = Path(__file__).resolve().parent.parent
GRID = REPO / "scripts" / "placement_bracketed_grid.toml"
COMMITTED_PAIRS = REPO / "docs" / "results" / "placement" / "report" / "placement_pairs.csv"


def _protocol_order() -> list[str]:
    """The README's order: seeds 0-14 outermost; per seed 1F1B's block, then ZBV's; a block is A, R, B."""
    ids = []
    for seed in range(15):
        for s in ("1F1B", "ZBVZeroBubble"):
            a = f"{s}__timelyfreeze__r_max=0.8__seed={seed}"
            ids += [a, f"{s}__random__ratio=matched-timelyfreeze-r_max0.8__seed={seed}", f"{a}__repeat=1"]
    return ids


# ------------------------------------------------------------------------------------------ grid
def test_the_bracketed_grid_expands_to_the_protocols_90_jobs_in_order():
    grid = load_grid_file(GRID)
    assert Path(grid["config"]).name == "llama3_debug_finetune_cpu.toml" and Path(grid["config"]).is_file()
    jobs = expand_grid(grid)
    assert [j.job_id for j in jobs] == _protocol_order()
    for a, r, b in zip(jobs[::3], jobs[1::3], jobs[2::3]):
        assert (a.method, a.knob_value, a.repeat, a.matched_to) == ("timelyfreeze", 0.8, 0, None)
        assert (r.method, r.knob_value, r.matched_to, r.seed) == ("random", "matched", a.job_id, a.seed)
        assert b == Job(a.schedule, a.method, a.knob_value, a.seed, a.overrides, a.extend, None, repeat=1)
        assert dict(a.overrides) == {"metrics.enable_tensorboard": False} and a.extend is None
    blocks = bracket_blocks(jobs)
    assert len(blocks) == 90 and blocks[jobs[4].job_id] == [j.job_id for j in jobs[3:6]]


def test_the_dry_run_prints_the_exact_order(tmp_path, capsys):
    out = tmp_path / "pb"
    assert sweep_main(["run", "--grid", str(GRID), "--out", str(out), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert text.rstrip().endswith("90 jobs") and not out.exists()
    listed = [line.split("] ", 1)[1].split("  (")[0] for line in text.splitlines() if line.startswith("[")]
    assert listed == _protocol_order()
    commands = [line for line in text.splitlines() if line.startswith("    ")]
    a_dump = out / "jobs" / "1F1B__timelyfreeze__r_max=0.8__seed=0" / "dump"
    assert f"--freeze.random.matched {a_dump}" in commands[1]  # R reads A's dump
    assert "--freeze.r_max 0.8" in commands[2] and "--freeze.seed 0" in commands[2]  # B: A's settings, own dump
    assert "repeat=1/dump" in commands[2]


# ------------------------------------------------------------------------------------------ design
def test_design_from_the_committed_pairs_gives_the_protocols_numbers():
    with open(COMMITTED_PAIRS, newline="") as f:
        rows = {(r["schedule"], r["quantity"]): r for r in design(list(csv.DictReader(f)), blocks=15)}
    one, zbv = rows[("1F1B", "d_speedup")], rows[("ZBVZeroBubble", "d_speedup")]
    assert (one["pairs"], one["dof"]) == (8, 6)
    assert round(one["sd_pair"], 3) == 0.041 and round(one["sd_block"], 3) == 0.035
    assert round(one["half_width"], 3) == 0.020 and one["blocks_needed"] == 15
    assert round(zbv["sd_pair"], 3) == 0.068 and round(zbv["half_width"], 3) == 0.033 and zbv["blocks_needed"] == 36
    assert rows[("1F1B", "d_speedup_f")]["blocks_needed"] == 34
    assert rows[("ZBVZeroBubble", "d_speedup_f")]["blocks_needed"] == 37


def test_precision_helpers_hand_checked():
    assert half_width(1.0, 2) == pytest.approx(12.7062 / math.sqrt(2), rel=1e-4)
    assert n_for_half_width(1.0, half_width(1.0, 10)) == 10 and n_for_half_width(1.0, 1e-6, n_max=50) is None
    sd, dof = pooled_sd([[1.0, 3.0], [10.0, 14.0], [7.0]])
    assert dof == 2 and sd == pytest.approx(math.sqrt((2.0 + 8.0) / 2))
    assert pooled_sd([[1.0]]) == (None, 0)


def _cell(lo, hi, q="d_bracket"):
    return {f"{q}_lo": lo, f"{q}_hi": hi}


def test_size_verdicts_and_answers():
    assert size_verdict(-0.01, 0.019) == WITHIN and size_verdict(0.021, 0.05) == BEYOND
    assert size_verdict(0.001, 0.03) == UNDECIDED and size_verdict(None, None) is None
    assert answer(_cell(-0.04, 0.02)) == (
        "no difference resolved; not decided at +-0.02 (the interval crosses -0.02): the difference lies between "
        "-0.040 and +0.020, so TimelyFreeze's gain is below 0.020"
    )
    # off-centre, half-width 0.015 < 0.02: it crosses +0.02, it is not "wider than +-0.02"
    assert "(the interval crosses +0.02): the difference lies between -0.005 and +0.025" in answer(_cell(-0.005, 0.025))
    assert "(the interval crosses -0.02 and +0.02)" in answer(_cell(-0.03, 0.03))
    assert answer(_cell(0.005, 0.035)) == (
        "TimelyFreeze faster, by at least 0.005; not decided at +-0.02 (the interval crosses +0.02): the difference "
        "lies between +0.005 and +0.035, so TimelyFreeze's gain is below 0.035"
    )
    assert answer(_cell(-0.035, -0.005)).endswith(
        "(the interval crosses -0.02): the difference lies between -0.035 and -0.005, so random's gain is below 0.035"
    )
    assert answer(_cell(-0.035, -0.005)).startswith("random faster, by at least 0.005; not decided at +-0.02")
    assert answer(_cell(0.001, 0.015)) == (
        "TimelyFreeze faster; the difference is smaller than 0.02 either way (the interval lies within +-0.02)"
    )
    assert answer(_cell(0.021, 0.05)) == "TimelyFreeze faster, by more than 0.02 (the interval lies beyond +0.02)"
    assert answer(_cell(-0.05, -0.03)) == "random faster, by more than 0.02 (the interval lies beyond -0.02)"
    assert answer(_cell(0.021, 0.05, "d_bracket_f"), "d_bracket_f").endswith(
        "by more than 0.02 (the interval lies beyond +0.02)"
    )
    assert answer(_cell(0.01, None)) == "no interval (fewer than two blocks)"


def test_the_checks_flag_a_direction_the_f_out_interval_does_not_share_and_a_verdict_close_f_does_not_reach():
    c = {"speed": FASTER, "size": UNDECIDED, "speed_f": FASTER, "speed_close_f": FASTER, "size_close_f": WITHIN}
    assert checks(c) == (None, None)  # an unresolved size cannot be lost; a size the primary lacks is no flag
    c |= {"speed_f": NO_DIFFERENCE, "speed_close_f": None, "size_close_f": None}
    check_f, check_close_f = checks(c)
    assert check_f == "with the F factors out the direction is 'no difference resolved', not 'TimelyFreeze faster'"
    assert (
        check_close_f == "over the close-F blocks its direction is 'not read (no interval)', not 'TimelyFreeze faster'"
    )
    c = {"speed": FASTER, "size": WITHIN, "speed_f": FASTER, "speed_close_f": FASTER, "size_close_f": UNDECIDED}
    assert checks(c) == (None, "over the close-F blocks its size is 'not decided at +-0.02', not 'within +-0.02'")
    c = {"speed": NO_DIFFERENCE, "size": WITHIN, "speed_f": None, "speed_close_f": FASTER, "size_close_f": WITHIN}
    assert checks(c) == (None, None)  # no F-out interval: nothing to compare


# ------------------------------------------------------------------------------------------ report
SRC = REPO / "docs" / "results" / "comparison" / "jobs"
UNFROZEN_MS = 1000.0


def _metrics(speedup: float) -> str:
    """A 36-step metrics.jsonl with the fine-tuning phases whose in-run speed-up is ``speedup``."""
    phases = ["warmup"] * 6 + ["upper"] * 3 + ["lower"] * 3 + ["progressive"] * 4 + ["stable"] * 20
    lines = []
    for step, phase in enumerate(phases, 1):
        ms = UNFROZEN_MS / speedup if phase == "stable" else UNFROZEN_MS
        lines.append(
            json.dumps({"step": step, "phase": phase, "batch_ms": ms, "step_ms": ms, "tokens_per_s": 1e6 / ms})
        )
    return "\n".join(lines) + "\n"


def _set_f_factor(trace_dir: Path, f: float) -> None:
    """Scale the stable phase's forward times so that the trace's F factor (stable over upper) becomes ``f``."""
    k = f / f_factor(load_trace(trace_dir))
    for path in trace_dir.glob("actions_rank*.jsonl"):
        recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for rec in recs:
            if rec["phase"] == "stable" and "F" in rec["action"]:
                rec["ms"] *= k
        path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def _job(out, src, job_id, spec, speedup, f, val_loss, start_s, status="ok", method=None):
    """One synthetic job folder: a committed TimelyFreeze job with its speed-up, F factor, validation loss,
    status and start time (seconds after 10:00) rewritten; it ran 60 s."""
    d = out / "jobs" / job_id
    shutil.copytree(src, d)
    tf = d / "dump" / "timelyfreeze"
    unpack_trace(tf / "trace.tar.gz", tf / "trace")  # the committed trace is packed; this test edits its files
    (tf / "trace.tar.gz").unlink()
    (tf / "metrics.jsonl").write_text(_metrics(speedup))
    _set_f_factor(tf / "trace", f)
    summary = json.loads((tf / "summary.json").read_text())
    summary.update(val_loss=val_loss, method=method or summary["method"], seed=spec["seed"])
    if method == "random":
        summary["knob"] = {"name": "ratio", "value": "matched"}
    (tf / "summary.json").write_text(json.dumps(summary))

    def at(s):
        return f"2030-01-01T{10 + s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}+00:00"

    rec = {"job_id": job_id, "spec": spec, "status": status, "start_time": at(start_s), "end_time": at(start_s + 60)}
    (d / "job.json").write_text(json.dumps(rec))


def _block(out, schedule, seed, speedups, fs, losses, start_s, gap_s=0, r_status="ok", jobs=3):
    """A synthetic block A, R, B of ``schedule`` and ``seed`` starting at ``start_s``: (A, R, B)'s speed-ups,
    F factors and validation losses; ``gap_s`` idle seconds between its jobs; only its first ``jobs`` jobs (an
    interrupted block)."""
    src = SRC / f"{schedule}__timelyfreeze__r_max=0.8__seed=0"
    a = Job(schedule, "timelyfreeze", 0.8, seed)
    r = Job(schedule, "random", "matched", seed, matched_to=a.job_id)
    b = Job(schedule, "timelyfreeze", 0.8, seed, repeat=1)
    for k, (job, status) in enumerate(((a, "ok"), (r, r_status), (b, "ok"))[:jobs]):
        method = "random" if job is r else None
        t = start_s + k * (60 + gap_s)
        _job(out, src, job.job_id, job.spec(), speedups[k], fs[k], losses[k], t, status, method)


def _read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_bracketed_report_on_synthetic_blocks(tmp_path, capsys):
    out = tmp_path / "pb"
    one = [  # 1F1B: (A, R, B) speed-ups and F factors
        ((1.30, 1.25, 1.28), (1.00, 1.00, 1.00)),
        ((1.26, 1.24, 1.30), (0.95, 1.02, 0.99)),
        ((1.22, 1.21, 1.24), (1.01, 0.98, 1.00)),
    ]
    zbv = [((1.20, 1.22, 1.21), (1.00, 1.00, 1.00)), ((1.25, 1.20, 1.19), (1.00, 0.90, 1.00))]
    start = 0
    for seed in range(3):  # the two schedules' blocks alternate in time, as the grid runs them
        _block(out, "1F1B", seed, *one[seed], (3.50, 3.49, 3.51), start)
        start += 180
        if seed < 2:
            _block(out, "ZBVZeroBubble", seed, *zbv[seed], (3.60, 3.60, 3.61), start)
            start += 180
    _block(out, "1F1B", 7, (1.3, 1.0, 1.3), (1, 1, 1), (3, 3, 3), start, r_status="failed")  # left out
    _block(out, "1F1B", 8, (1.3, 1.0, 1.3), (1, 1, 1), (3, 3, 3), start + 200, gap_s=300)  # not back to back
    _block(out, "ZBVZeroBubble", 8, (1.3, 1.0, 1.3), (1, 1, 1), (3, 3, 3), start + 900, jobs=2)  # B never started
    _block(out, "ZBVZeroBubble", 9, (1.3, 1.0, 1.3), (1, 1, 1), (3, 3, 3), start + 1200, jobs=1)  # only A ran
    assert main([str(out)]) == 0  # the script's entry point picks the bracketed report
    md = Path(capsys.readouterr().out.strip())
    assert md == out / "report" / "bracketed.md"
    rep = out / "report"

    blocks = _read(rep / "bracketed_blocks.csv")
    assert [(b["schedule"], b["seed"], b["position"]) for b in blocks] == [
        ("1F1B", "0", "1"),
        ("ZBVZeroBubble", "0", "2"),
        ("1F1B", "1", "3"),
        ("ZBVZeroBubble", "1", "4"),
        ("1F1B", "2", "5"),
    ]
    b1 = blocks[2]  # 1F1B seed 1: A 1.26, R 1.24, B 1.30; F 0.95, 1.02, 0.99
    assert float(b1["d_first"]) == pytest.approx(0.02) and float(b1["d_second"]) == pytest.approx(0.06)
    assert float(b1["d_bracket"]) == pytest.approx(0.04) and float(b1["d_ab"]) == pytest.approx(-0.04)
    assert float(b1["f_a"]) == pytest.approx(0.95) and float(b1["f_r"]) == pytest.approx(1.02)
    assert float(b1["d_bracket_f"]) == pytest.approx((1.26 * 0.95 + 1.30 * 0.99) / 2 - 1.24 * 1.02)
    assert float(b1["f_bracket"]) == pytest.approx(0.97 - 1.02) and b1["close_f"] == "True"
    assert float(b1["d_val_loss_bracket"]) == pytest.approx(0.015) and float(b1["share_gap"]) == 0.0
    assert b1["back_to_back"] == "True" and float(b1["idle_s"]) == 0.0
    assert blocks[3]["close_f"] == "False"  # ZBV seed 1: (1 + 1) / 2 - 0.9 = 0.1

    pairs = _read(rep / "bracketed_pairs.csv")
    assert len(pairs) == 10 and [p["order"] for p in pairs[:2]] == ["TF first", "random first"]
    assert pairs[5]["timelyfreeze_job"].endswith("seed=1__repeat=1") and pairs[5]["position"] == "3"

    cells = {c["schedule"]: c for c in _read(rep / "bracketed_cells.csv")}
    assert [cells[s]["blocks"] for s in ("1F1B", "ZBVZeroBubble", "all")] == ["3", "2", "5"]
    brackets = [0.04, 0.04, 0.02]  # 1F1B: (1.30 + 1.28) / 2 - 1.25, ...
    m = statistics.fmean(brackets)
    h = half_width(statistics.stdev(brackets), 3)
    c = cells["1F1B"]
    assert float(c["d_bracket_mean"]) == pytest.approx(m)
    assert float(c["d_bracket_lo"]) == pytest.approx(m - h) and float(c["d_bracket_hi"]) == pytest.approx(m + h)
    assert c["speed"] == "TimelyFreeze faster" and c["size"] == UNDECIDED
    assert (c["speed_f"], c["size_f"], c["speed_close_f"]) == (NO_DIFFERENCE, UNDECIDED, FASTER)  # read as checks
    assert c["check_f"].startswith("with the F factors out the direction is") and c["check_close_f"] == ""
    assert c["blocks_close_f"] == "3" and cells["ZBVZeroBubble"]["blocks_close_f"] == "1"
    assert cells["ZBVZeroBubble"]["d_bracket_close_f_lo"] == ""  # one block: no interval

    text = md.read_text()
    assert "Checks, not the answer: with the F factors taken out" in text and "|f_bracket| <= 0.05" in text
    assert "Flagged: with the F factors out the direction is 'no difference resolved'" in text
    assert "5 complete blocks" in text and "**1F1B** (3 blocks)" in text and "**both schedules** (5 blocks)" in text
    assert "1F1B__timelyfreeze__r_max=0.8__seed=7: R failed" in text
    assert "1F1B__timelyfreeze__r_max=0.8__seed=8: its jobs did not run back to back" in text
    assert "ZBVZeroBubble__timelyfreeze__r_max=0.8__seed=8: B missing;" in text
    assert "ZBVZeroBubble__timelyfreeze__r_max=0.8__seed=9: R missing, B missing." in text
    assert (rep / "bracketed.png").is_file()


def test_a_blocks_pair_quantities_are_the_mean_of_its_two_pairs():
    def job(job_id, speedup):
        return {"job_id": job_id, "schedule": "1F1B", "knob_value": 0.8, "seed": 0, "speedup_in_run": speedup}

    def pair(d, share_gap, loss, predicted):
        keys = ("d_speedup", "d_speedup_f", "share_gap", "d_val_loss", "predicted_d_speedup")
        return {"f_tf": 1.0, "f_random": 1.0, **dict(zip(keys, (d, d, share_gap, loss, predicted)))}

    x = block_row(job("a", 1.3), job("r", 1.2), job("b", 1.2), pair(0.1, 0.01, 0.02, 0.04), pair(0.0, 0.03, 0.0, 0.02))
    assert x["share_gap"] == pytest.approx(0.02) and x["d_val_loss_bracket"] == pytest.approx(0.01)
    assert x["predicted_d_bracket"] == pytest.approx(0.03) and x["d_bracket"] == pytest.approx(0.05)
    assert x["back_to_back"] is None  # no times


def _hand_block(d, f_bracket=0.0, **over):
    """A block row with every quantity ``d`` but the F difference, and ``over``."""
    row = {q: d for q in QUANTITIES} | {"schedule": "1F1B", "f_bracket": f_bracket, "close_f": abs(f_bracket) <= 0.05}
    return row | over


def test_a_quantity_missing_for_some_blocks_says_over_how_many():
    blocks = [_hand_block(0.01), _hand_block(0.03, predicted_d_bracket=None), _hand_block(0.02, f_bracket=0.1)]
    (c,) = bracketed_cells(blocks)
    assert c["blocks"] == 3 and c["d_bracket_n"] == 3 and c["predicted_d_bracket_n"] == 2
    assert c["blocks_close_f"] == 2 == c["d_bracket_close_f_n"]
    (text,) = statement([c])
    assert "The planner predicted +0.015 [" in text and "] (over 2 of 3 blocks);" in text
    assert text.count("(over ") == 1  # every other quantity has all its blocks


def test_the_script_still_writes_the_placement_report_of_an_unbracketed_folder(tmp_path, capsys):
    out = tmp_path / "p"
    a = Job("1F1B", "timelyfreeze", 0.8, 0)
    r = Job("1F1B", "random", "matched", 0, matched_to=a.job_id)
    src = SRC / "1F1B__timelyfreeze__r_max=0.8__seed=0"
    _job(out, src, a.job_id, a.spec(), 1.3, 1.0, 3.5, 0)
    _job(out, src, r.job_id, r.spec(), 1.2, 1.0, 3.5, 60, method="random")
    assert main([str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out / "report" / "placement.md")


# ------------------------------------------------------------------------------------------ committed results
RESULTS = REPO / "docs" / "results" / "placement-bracketed"


def test_every_quoted_figure_is_what_the_committed_blocks_give():
    """The committed cells are the committed blocks' statistics, and each README and results-page figure linked to
    them is one of those cells (mean and interval), recomputed here with the report's own functions."""
    from tests.figures_util import linked_figures
    from timelyfreeze.experiments.studies.placement_bracketed import _ci

    with open(RESULTS / "report" / "bracketed_blocks.csv") as f:
        blocks = [
            {
                **row,
                **{q: float(row[q]) if row[q] else None for q in QUANTITIES if q in row},
                "close_f": row["close_f"] == "True",
            }
            for row in csv.DictReader(f)
        ]
    cells = bracketed_cells(blocks)
    with open(RESULTS / "report" / "bracketed_cells.csv") as f:
        committed = {row["schedule"]: row for row in csv.DictReader(f)}
    for c in cells:
        for key in (k for k in c if k.endswith(("_mean", "_lo", "_hi"))):
            assert float(committed[c["schedule"]][key]) == pytest.approx(c[key], abs=1e-12), (c["schedule"], key)
        assert committed[c["schedule"]]["speed"] == c["speed"] and committed[c["schedule"]]["size"] == c["size"]
    figures = {_ci(c, q, digits) for c in cells for q in (*QUANTITIES, "d_bracket_close_f") for digits in (3, 4)}
    quoted = []
    for page in (REPO / "README.md", RESULTS / "README.md"):
        quoted += linked_figures(page.read_text(), r"(?:placement-bracketed/)?report/bracketed_cells\.csv")
    assert len(quoted) >= 15, "the results page quotes its table from bracketed_cells.csv"
    for q in quoted:
        assert q in figures, q
