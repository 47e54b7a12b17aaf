"""``python -m planner`` end to end, in subprocesses (cwd = repo root), plus its one-line user errors."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "planner", *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def assert_ok(proc: subprocess.CompletedProcess) -> str:
    """Exit status 0, and nothing of the planner's own on stderr: no ``error:`` or ``warning:`` line, no traceback.
    Other lines are tolerated, since a library may log there (matplotlib, e.g., while it builds its font cache):
    the earlier ``stderr == ""`` failed once on a loaded machine, and what it printed was not kept."""
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert not [line for line in proc.stderr.splitlines() if line.startswith(("error:", "warning:"))], proc.stderr
    return proc.stdout


def assert_user_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit status 2, exactly one stderr line ``error: ...`` containing every needle, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "trace"
    stdout = assert_ok(
        run(
            "simulate",
            "--schedule",
            "1F1B",
            "--pp",
            4,
            "--microbatches",
            8,
            "--out",
            out,
            "--stage-scale",
            "1,1.3,0.8,1.1",
            "--jitter",
            0.05,
            "--stable-ratio",
            0.4,
        )
    )
    assert "wrote" in stdout and "1F1B" in stdout
    return out


# ----------------------------------------------------------------------------------- happy paths


def test_simulate_plan_sweep_gantt(trace_dir, tmp_path):
    meta = json.loads((trace_dir / "meta.json").read_text())
    assert meta["format"] == "timelyfreeze-trace/1" and meta["num_stages"] == 4
    assert sorted(p.name for p in trace_dir.iterdir()) == [
        "actions_rank0.jsonl",
        "actions_rank1.jsonl",
        "actions_rank2.jsonl",
        "actions_rank3.jsonl",
        "meta.json",
    ]

    plan_path = tmp_path / "plan.json"
    out = assert_ok(run("plan", trace_dir, "--r-max", 0.5, "--out", plan_path))
    assert str(plan_path) in out
    plan = json.loads(plan_path.read_text())
    assert plan["format"] == "timelyfreeze-plan/1" and plan["r_max"] == 0.5
    assert set(plan["actions"]) == {a for order in meta["rank_orders"].values() for a in order}
    bt = plan["batch_time_ms"]
    assert bt["all_frozen"] <= bt["planned"] < bt["no_freeze"]

    csv_path, png_path = tmp_path / "sweep.csv", tmp_path / "sweep.png"
    out = assert_ok(run("sweep", trace_dir, "--r-max", "0,0.1,0.3,0.5,1", "--csv", csv_path, "--png", png_path))
    table = [line for line in out.splitlines() if line.startswith("| 0") or line.startswith("| 1")]
    assert len(table) == 5
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["r_max"]) for r in rows] == [0.0, 0.1, 0.3, 0.5, 1.0]
    speedups = [float(r["speedup"]) for r in rows]
    assert speedups[0] == pytest.approx(1.0)
    assert all(b >= a - 1e-9 for a, b in zip(speedups, speedups[1:]))
    assert speedups[-1] > 1.05
    # The sweep's r_max=0.5 row predicts what plan predicted.
    assert float(rows[3]["batch_ms"]) == pytest.approx(bt["planned"], rel=1e-6)
    assert png_path.read_bytes()[:4] == b"\x89PNG" and png_path.stat().st_size > 10_000

    gantt_path = tmp_path / "timeline.png"
    out = assert_ok(run("gantt", trace_dir, "--plan", plan_path, "--out", gantt_path))
    assert "planned" in out and "stable" in out  # three panels: upper bound, planned, measured stable
    assert gantt_path.read_bytes()[:4] == b"\x89PNG" and gantt_path.stat().st_size > 20_000


def test_plan_with_per_stage_budgets_and_sensitivity(trace_dir, tmp_path):
    """``--r-max`` takes one value per stage; the plan keeps the list, respects each stage's budget, and
    ``plan`` prints the budget sensitivity it writes."""
    from planner.plan import load_plan, stage_mean_ratios

    path = tmp_path / "per_stage.json"
    out = assert_ok(run("plan", trace_dir, "--r-max", "0.5, 0.8,0.8,0.6", "--out", path))
    assert "r_max 0.5,0.8,0.8,0.6" in out
    plan = json.loads(path.read_text())
    assert plan["r_max"] == [0.5, 0.8, 0.8, 0.6]
    sens = plan["budget_sensitivity"]
    assert set(sens) == {"0", "1", "2", "3"} and all(v >= 0 for v in sens.values())
    line = next(x for x in out.splitlines() if x.startswith("budget sensitivity"))
    assert line.startswith("budget sensitivity (ms of batch time saved per +0.01 of r_max): stage 0: ")
    for s, v in sens.items():
        assert (f"stage {s}: {v:.4g}" if v > 0 else f"stage {s}: 0 (") in line
    means = stage_mean_ratios(load_plan(path))
    assert all(means[s] <= plan["r_max"][s] + 1e-7 for s in means)
    # One value is one budget for every stage: the plan file keeps a number.
    assert_ok(run("plan", trace_dir, "--r-max", "0.8", "--out", tmp_path / "scalar.json"))
    assert json.loads((tmp_path / "scalar.json").read_text())["r_max"] == 0.8


def test_plan_on_two_replica_trace(tmp_path):
    """``plan`` on a trace of 2 data-parallel replicas plans on the per-action max of their weights."""
    import dataclasses

    from planner.trace.load import Trace, load_trace, node_weights
    from planner.trace.simulate import simulate_batch, synthetic_trace, write_trace

    reps = [
        synthetic_trace("1F1B", 2, 4, stage_scale=[1.0, 1.4], jitter=0.05, seed=1),
        synthetic_trace("1F1B", 2, 4, stage_scale=[1.3, 1.0], jitter=0.05, seed=2),
    ]
    meta = dataclasses.replace(reps[0].meta, replicas=2)
    recs = reps[0].records + [dataclasses.replace(x, replica=1) for x in reps[1].records]
    trace_dir = Path(write_trace(Trace(meta, recs, "two"), tmp_path / "trace"))
    assert sorted(p.name for p in trace_dir.iterdir()) == [
        "actions_rank0.jsonl",
        "actions_rank0_replica1.jsonl",
        "actions_rank1.jsonl",
        "actions_rank1_replica1.jsonl",
        "meta.json",
    ]
    assert json.loads((trace_dir / "meta.json").read_text())["replicas"] == 2
    assert load_trace(trace_dir).meta.replicas == 2

    plan_path = tmp_path / "plan.json"
    assert str(plan_path) in assert_ok(
        run("plan", trace_dir, "--r-max", 0.5, "--out", plan_path, "--estimator", "median", "--no-anchor")
    )
    plan = json.loads(plan_path.read_text())
    single = [node_weights(t) for t in reps]
    for a, entry in plan["actions"].items():
        assert entry["w_max"] == max(w.w_max[a] for w in single)
        assert entry["w_min"] == max(w.w_min[a] for w in single)
    no_freeze = plan["batch_time_ms"]["no_freeze"]
    assert all(no_freeze >= simulate_batch(meta, w.w_max) for w in single)
    assert no_freeze > max(simulate_batch(meta, w.w_max) for w in single)  # each replica slow on another stage
    assert_ok(run("sweep", trace_dir, "--r-max", "0,0.5"))


def test_plan_and_sweep_with_pooled_estimator(trace_dir, tmp_path):
    """``--estimator pooled``: the plan's bounds are ``estimate_weights(trace, "pooled")``, the plan says so,
    and sweep predicts the same batch time; ``--estimator median`` is ``node_weights``; pooled is the default."""
    from planner.timing.estimate import estimate_weights
    from planner.trace.load import load_trace, node_weights

    trace = load_trace(trace_dir)
    plans = {}
    for name, extra in (("median", ("--estimator", "median")), ("pooled", ())):
        path = tmp_path / f"{name}.json"
        out = assert_ok(run("plan", trace_dir, "--r-max", 0.5, "--out", path, "--no-anchor", *extra))
        assert f"estimator {name}" in out
        plans[name] = json.loads(path.read_text())
        assert plans[name]["estimator"] == name
    for name, w in (("median", node_weights(trace)), ("pooled", estimate_weights(trace, "pooled"))):
        for a, entry in plans[name]["actions"].items():
            assert entry["w_max"] == w.w_max[a] and entry["w_min"] == w.w_min[a]
    pooled = plans["pooled"]["actions"]
    for s in range(4):  # synthetic microbatches are alike: one w_max per stage's B actions
        assert len({pooled[f"{s}B{m}"]["w_max"] for m in range(8)}) == 1
        assert len({plans["median"]["actions"][f"{s}B{m}"]["w_max"] for m in range(8)}) > 1
    out = assert_ok(
        run("sweep", trace_dir, "--r-max", "0,0.5", "--estimator", "pooled", "--no-anchor", "--csv", tmp_path / "s.csv")
    )
    assert "estimator pooled" in out
    with open(tmp_path / "s.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[1]["batch_ms"]) == pytest.approx(plans["pooled"]["batch_time_ms"]["planned"], rel=1e-6)


def test_plan_and_sweep_with_measured_communication(trace_dir, tmp_path):
    """A trace whose records carry start_ms: ``plan`` uses the delays on cross-rank edges and prints one line
    about them, the plan records them (``comm``); ``--no-comm`` plans as without start times; sweep agrees."""
    from planner.defaults import PLAN_DEFAULTS
    from planner.plan import plan_from_trace
    from planner.timing.comm import estimate_edge_delays, summarize, summary_line
    from planner.trace.simulate import write_trace
    from tests.test_comm import timed_trace

    trace = timed_trace("1F1B", 4, 8, lambda es: {e: 1.5 for e in es}, stage_scale=[1, 1.3, 0.8, 1.1])
    root = write_trace(trace, tmp_path / "timed")
    delays = estimate_edge_delays(trace)
    line = summary_line(summarize(delays))
    assert line == "communication: 48 cross-rank edges, median 1.5 ms, max 1.5 ms"
    out = assert_ok(run("plan", root, "--r-max", 0.5, "--out", tmp_path / "comm.json"))
    assert line in out.splitlines()
    with_comm = json.loads((tmp_path / "comm.json").read_text())
    assert with_comm["comm"] == summarize(delays)
    assert with_comm["batch_time_ms"]["planned"] == pytest.approx(
        plan_from_trace(trace, 0.5, **PLAN_DEFAULTS).batch_time_ms["planned"], rel=1e-9
    )
    out = assert_ok(run("plan", root, "--r-max", 0.5, "--out", tmp_path / "plain.json", "--no-comm"))
    assert "communication" not in out
    plain = json.loads((tmp_path / "plain.json").read_text())
    assert "comm" not in plain
    assert plain["batch_time_ms"]["planned"] < with_comm["batch_time_ms"]["planned"]
    assert plain["batch_time_ms"]["planned"] == pytest.approx(
        plan_from_trace(trace, 0.5, **(PLAN_DEFAULTS | {"comm": False})).batch_time_ms["planned"], rel=1e-9
    )
    for extra, want in (((), with_comm), (("--no-comm",), plain)):
        out = assert_ok(run("sweep", root, "--r-max", "0,0.5", "--csv", tmp_path / "s.csv", *extra))
        assert (line in out.splitlines()) == (not extra)
        with open(tmp_path / "s.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        assert float(rows[1]["batch_ms"]) == pytest.approx(want["batch_time_ms"]["planned"], rel=1e-6)
        assert float(rows[0]["batch_ms"]) == pytest.approx(want["batch_time_ms"]["no_freeze"], rel=1e-6)
    # A trace without start times (the module's synthetic one): no line, with or without the flag.
    out = assert_ok(run("plan", trace_dir, "--r-max", 0.5, "--out", tmp_path / "p.json"))
    assert "communication" not in out and "comm" not in json.loads((tmp_path / "p.json").read_text())


def test_orders(tmp_path):
    out = assert_ok(run("orders", "--schedule", "1F1B", "--pp", 2, "--microbatches", 4))
    assert out.splitlines() == ["rank 0: 0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3", "rank 1: 1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3"]
    meta = json.loads(assert_ok(run("orders", "--schedule", "ZBVZeroBubble", "--pp", 2, "--microbatches", 4, "--json")))
    assert meta["stage_to_rank"] == [0, 1, 1, 0] and len(meta["rank_orders"]["1"]) == 24
    # The printed meta is a valid trace meta: simulate-free gantt input needs only records besides it.
    assert meta["format"] == "timelyfreeze-trace/1"


_NO_TORCH = (
    "import sys; sys.modules['torch'] = None  # any 'import torch' now raises ImportError\n"
    "from planner.cli import main; sys.exit(main(sys.argv[1:]))"
)


def test_cli_runs_without_torch(tmp_path):
    """simulate -> sweep -> gantt -> orders with torch made unimportable."""

    def run_no_torch(*args: object) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", _NO_TORCH, *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=120
        )

    trace = tmp_path / "zbv"
    assert_ok(run_no_torch("simulate", "--schedule", "ZBVZeroBubble", "--pp", 2, "--microbatches", 4, "--out", trace))
    assert_ok(run_no_torch("sweep", trace, "--r-max", "0,0.5", "--png", tmp_path / "s.png"))
    assert_ok(run_no_torch("gantt", trace, "--out", tmp_path / "g.png"))
    assert "rank 1:" in assert_ok(run_no_torch("orders", "--schedule", "LoopedBFS", "--pp", 2, "--microbatches", 2))
    assert (tmp_path / "s.png").exists() and (tmp_path / "g.png").exists()
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['torch'] = None; import torch"], capture_output=True, text=True
    )
    assert probe.returncode != 0  # the blocking above really blocks


# ----------------------------------------------------------------------------------- user errors


def _copy(trace_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(trace_dir, tmp_path / "bad"))


def _rewrite_records(path: Path, edit) -> None:
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(r) + "\n" for r in edit(recs)))


def test_missing_trace_dir_and_meta(trace_dir, tmp_path):
    assert_user_error(run("sweep", tmp_path / "nope", "--r-max", 0.5), "nope", "does not exist")
    bad = _copy(trace_dir, tmp_path)
    (bad / "meta.json").unlink()
    assert_user_error(run("sweep", bad, "--r-max", 0.5, "--csv", tmp_path / "s.csv"), "meta.json")
    assert not (tmp_path / "s.csv").exists()


def test_bad_json_line_names_file_and_line(trace_dir, tmp_path):
    bad = _copy(trace_dir, tmp_path)
    lines = (bad / "actions_rank1.jsonl").read_text().splitlines()
    lines[6] = '{"step": 1, "action": "1F3", '
    (bad / "actions_rank1.jsonl").write_text("\n".join(lines) + "\n")
    assert_user_error(run("sweep", bad, "--r-max", 0.5), "actions_rank1.jsonl:7")


@pytest.mark.parametrize(
    "rank, edit, needles",
    [
        (0, lambda rs: rs[:2] + [{**rs[2], "action": "0X2"}] + rs[3:], ("actions_rank0.jsonl:3", "0X2")),
        (2, lambda rs: rs[:4] + [{**rs[4], "action": "1F0"}] + rs[4:], ("actions_rank2.jsonl:5", "1F0")),
        (3, lambda rs: [{**r, "ms": -1.0} if i == 9 else r for i, r in enumerate(rs)], ("actions_rank3.jsonl:10",)),
        (
            3,
            lambda rs: [{**r, "ms": float("nan")} if i == 0 else r for i, r in enumerate(rs)],
            ("actions_rank3.jsonl:1", "ms"),
        ),
        (
            1,
            lambda rs: [r for r in rs if not (r["action"] == "1B2" and r["phase"] == "upper")],
            ("actions_rank1.jsonl", "1B2", "upper"),
        ),
    ],
    ids=["unknown-action", "action-not-in-rank-order", "negative-ms", "nan-ms", "missing-from-upper"],
)
def test_bad_records(trace_dir, tmp_path, rank, edit, needles):
    bad = _copy(trace_dir, tmp_path)
    _rewrite_records(bad / f"actions_rank{rank}.jsonl", edit)
    assert_user_error(run("sweep", bad, "--r-max", "0.2,0.5"), *needles)


def test_rank_orders_not_covering_every_pair(trace_dir, tmp_path):
    bad = _copy(trace_dir, tmp_path)
    meta = json.loads((bad / "meta.json").read_text())
    meta["rank_orders"]["1"].remove("1B3")
    (bad / "meta.json").write_text(json.dumps(meta))
    assert_user_error(
        run("gantt", bad, "--out", tmp_path / "g.png"), "meta.json", "rank_orders", "stage 1 microbatch 3"
    )


@pytest.mark.parametrize(
    "args, needles",
    [
        (("plan", "{trace}", "--r-max", "1.5", "--out", "{tmp}/p.json"), ("r_max", "1.5")),
        (("plan", "{trace}", "--r-max", "-0.1", "--out", "{tmp}/p.json"), ("r_max",)),
        (("plan", "{trace}", "--r-max", "nan", "--out", "{tmp}/p.json"), ("r_max",)),
        (("plan", "{trace}", "--r-max", "0.5,0.8,0.8", "--out", "{tmp}/p.json"), ("r_max: 3 values for 4 stages",)),
        (
            ("plan", "{trace}", "--r-max", "0.5,0.8,0.8,0.6,1", "--out", "{tmp}/p.json"),
            ("r_max: 5 values for 4 stages",),
        ),
        (("plan", "{trace}", "--r-max", "0.5,1.2,0.8,0.6", "--out", "{tmp}/p.json"), ("--r-max", "r_max[1]", "1.2")),
        (("plan", "{trace}", "--r-max", "0.5,,0.8,0.6", "--out", "{tmp}/p.json"), ("--r-max", "r_max[1]")),
        (("sweep", "{trace}", "--r-max", "0.1,x"), ("r_max", "x")),
        (("sweep", "{trace}", "--r-max", "0.1,,0.2"), ("r_max",)),
        (("sweep", "{trace}", "--r-max", "0.5", "--csv", "{tmp}/no/dir/s.csv"), ("s.csv",)),
        (("plan", "{trace}", "--r-max", "0.5", "--out", "{tmp}/no/dir/p.json"), ("p.json",)),
        (("plan", "{trace}", "--r-max", "0.5", "--out", "{tmp}/p.json", "--solver", "nope"), ("solver", "nope")),
        (("plan", "{trace}", "--r-max", "0.5", "--out", "{tmp}/p.json", "--estimator", "mean"), ("estimator", "mean")),
        (("sweep", "{trace}", "--r-max", "0.5", "--estimator", "Pooled"), ("estimator", "Pooled")),
        (("orders", "--schedule", "Nope", "--pp", "2", "--microbatches", "4"), ("unknown schedule",)),
        (("orders", "--schedule", "1F1B", "--pp", "4", "--microbatches", "2"), ("microbatches",)),
        (("orders", "--schedule", "1F1B", "--pp", "two", "--microbatches", "2"), ("--pp",)),
        (
            (
                "simulate",
                "--schedule",
                "GPipe",
                "--pp",
                "2",
                "--microbatches",
                "2",
                "--out",
                "{tmp}/t",
                "--w-share",
                "2",
            ),
            ("w_share",),
        ),
        (("gantt", "{trace}", "--plan", "{tmp}/missing.json", "--out", "{tmp}/g.png"), ("missing.json",)),
        (("frobnicate",), ("frobnicate",)),
        ((), ("COMMAND",)),
    ],
)
def test_bad_arguments(trace_dir, tmp_path, args, needles):
    args = [a.format(trace=trace_dir, tmp=tmp_path) for a in args]
    assert_user_error(run(*args), *needles)


def test_gantt_rejects_plan_for_another_trace(trace_dir, tmp_path):
    other = tmp_path / "other"
    assert_ok(run("simulate", "--schedule", "GPipe", "--pp", 4, "--microbatches", 8, "--out", other))
    plan_path = tmp_path / "other.json"
    assert_ok(run("plan", other, "--r-max", 0.3, "--out", plan_path))
    assert_user_error(
        run("gantt", trace_dir, "--plan", plan_path, "--out", tmp_path / "g.png"), "other.json", "schedule"
    )


def test_bench_planner_process_mode_times_the_whole_cli():
    """``scripts/bench_planner.py --process``: writes a simulated trace, runs ``planner plan`` on it and prints
    one table row with the method, the process's wall and CPU seconds, the LP seconds (median [min, max]) and the
    gap, under a header that states the load average."""
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/bench_planner.py",
            "--process",
            "--sizes",
            "2x4",
            "--schedules",
            "1F1B",
            "--repeats",
            "2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = assert_ok(proc)
    rows = [line for line in out.splitlines() if line.startswith("| 1F1B |")]
    assert len(rows) == 1 and "| 2 x 1 x 4 | 16 | highs-fast |" in rows[0], out
    assert rows[0].count("[") == 3, rows[0]  # wall, CPU and LP seconds: median [min, max] of the 2 runs
    assert "load average at the start" in out, out
