"""Per-stage freeze budgets (``r_max`` one per stage) and the budget sensitivity from the LP duals."""

from __future__ import annotations

import csv
import json
import random

import pytest

from planner.errors import PlannerError
from planner.lp.budget import check_r_max, format_r_max, parse_r_max
from planner.lp.solve import solve_freeze_lp
from planner.plan import load_plan, make_plan, plan_from_trace, plan_summary, stage_mean_ratios, write_plan
from planner.rmax_sweep import format_table, plot_sweep, sweep, write_csv
from planner.schedule.dag import build_dag
from planner.schedule.orders import schedule_meta
from planner.trace.load import NodeWeights, TraceMeta, validate_meta
from planner.trace.simulate import synthetic_trace
from planner.trace.synthetic import synthetic_weights
from tests.test_planner_core import gpipe_2x2, scipy_lexicographic, weights_2x2

STEP = 0.01  # the sensitivity is quoted per +0.01 of r_max
H = 1e-3  # finite-difference step in r_max


def case(schedule: str, pp: int, mb: int, seed: int) -> tuple[TraceMeta, NodeWeights]:
    meta = validate_meta(schedule_meta(schedule, pp, mb), "meta")
    return meta, synthetic_weights(meta, seed=seed, lower_frac=(0.0, 1.0), jitter=0.5)


def total_freezing(plan) -> float:
    return sum(p.freeze_ratio for p in plan.actions.values())


@pytest.fixture
def region_always(monkeypatch):
    """The region method on small batches too (no fallback to the whole LP)."""
    import planner.lp.region as lp_region

    monkeypatch.setattr(lp_region, "_REGION_MAX_FRACTION", 1.0)


# --- hand-solved ---------------------------------------------------------------------------------------
# GPipe 2x2 (tests/test_planner_core.py): T = 3 + b(1B0) + max(b(1B1), b(0B0)) + b(0B1), every B in [2, 4],
# two freezable actions per stage.  r_max 0.25: each stage may freeze half a B; the best use is r(0B1) =
# r(1B0) = 0.5 (each on every path, 2 ms per unit of r), T = 13.  One more unit of stage s's budget b_s
# saves 2 ms (dual 2), so +0.01 of r_max_s (b_s + 0.02) saves 0.04 ms.


def test_hand_solved_sensitivity() -> None:
    plan = make_plan(gpipe_2x2(), weights_2x2(), 0.25)
    assert plan.batch_time_ms["planned"] == pytest.approx(13.0, abs=1e-9)
    assert plan.budget_sensitivity == pytest.approx({0: 0.04, 1: 0.04}, abs=1e-9)
    # Stage 1 at r_max 1 (both of its B at 2 ms): T = 3 + 2 + 4 + 3 = 12; stage 1 gives 0, stage 0 still 0.04
    # (0B1, or now equally 0B0, which has become the max).
    plan = make_plan(gpipe_2x2(), weights_2x2(), [0.25, 1.0])
    assert plan.r_max == [0.25, 1.0]
    assert plan.batch_time_ms["planned"] == pytest.approx(12.0, abs=1e-9)
    assert plan.budget_sensitivity == pytest.approx({0: 0.04, 1: 0.0}, abs=1e-9)
    assert plan.budget_sensitivity[1] == 0.0
    text = plan_summary(plan, gpipe_2x2())
    assert "r_max 0.25,1" in text
    assert (
        "budget sensitivity (ms of batch time saved per +0.01 of r_max): stage 0: 0.04, stage 1: 0 (r_max 1)"
        in text.splitlines()
    )


def test_everything_at_one_and_nothing_to_freeze() -> None:
    meta, w = case("1F1B", 3, 6, 1)
    assert set(make_plan(meta, w, 1.0).budget_sensitivity.values()) == {0.0}
    for a in w.w_min:  # stage 1 cannot shrink at all
        if a.startswith("1B"):
            w.w_min[a] = w.w_max[a]
    plan = make_plan(meta, w, 0.3)
    assert sorted(plan.budget_sensitivity) == [0, 1, 2] and plan.budget_sensitivity[1] == 0.0
    assert "stage 1: 0 (nothing to freeze)" in plan_summary(plan, meta)


# --- sensitivity vs finite differences -------------------------------------------------------------------


def check_against_finite_differences(meta: TraceMeta, w: NodeWeights, r: list[float], solver: str) -> int:
    """For every stage s with 0 < r_s < 1: the LP's slope g_s = dT*/d r_max_s = -sensitivity_s / 0.01 (ms per
    unit of r_max, <= 0) must lie between the finite-difference slopes

        left  = (T*(r_s) - T*(r_s - H)) / H        right = (T*(r_s + H) - T*(r_s)) / H

    T* is convex in the budget, so left <= (left derivative) <= g_s <= (right derivative) <= right holds for
    any valid dual, degenerate or not; where left == right (no kink within H) g_s must equal them.
    Returns how many stages had a nonzero, non-degenerate slope (so the check is not vacuous)."""
    g = build_dag(meta)
    base = solve_freeze_lp(g, w, r, solver=solver)

    def t_star(s: int, delta: float) -> float:
        rs = list(r)
        rs[s] += delta
        return solve_freeze_lp(g, w, rs, solver="whole").makespan

    informative = 0
    for s in range(meta.num_stages):
        if not 0.0 < r[s] < 1.0:
            continue
        left = (base.makespan - t_star(s, -H)) / H
        right = (t_star(s, +H) - base.makespan) / H
        slope = -base.budget_sensitivity[s] / STEP
        tol = 1e-6 * max(1.0, abs(left))
        assert left - tol <= slope <= right + tol, (s, left, slope, right)
        if right - left <= tol:
            assert slope == pytest.approx(right, rel=1e-6, abs=1e-6), (s, left, slope, right)
            informative += slope < -1e-3
    return informative


@pytest.mark.parametrize("schedule", ["1F1B", "GPipe", "Interleaved1F1B", "ZBVZeroBubble"])
@pytest.mark.parametrize("r_max", [0.3, 0.5, 0.8])
def test_sensitivity_matches_finite_differences(schedule: str, r_max: float, region_always) -> None:
    informative = 0
    for pp, seed in ((2, 0), (3, 1), (4, 2)):
        meta, w = case(schedule, pp, 2 * pp, seed)
        uniform = [r_max] * meta.num_stages
        rng = random.Random(seed)
        mixed = [min(0.95, max(0.05, r_max + rng.uniform(-0.2, 0.2))) for _ in range(meta.num_stages)]
        for r in (uniform, mixed):
            for solver in ("whole", "region"):
                informative += check_against_finite_differences(meta, w, r, solver)
    assert informative >= 3  # some stages' budgets bind with a unique slope


def test_region_sensitivity_after_several_rounds_matches_whole(region_always) -> None:
    """Cases where the region grows over rounds: its duals (a subgradient of the whole LP's T*) agree
    with the whole LP's wherever the slope is unique, and bracket-check against finite differences."""
    rounds = []
    for seed in range(6):
        meta, w = case(["ZBVZeroBubble", "1F1B", "GPipe"][seed % 3], 4, 8, seed)
        r = [0.3 + 0.1 * (s % 4) for s in range(meta.num_stages)]
        stats: dict = {}
        reg = solve_freeze_lp(build_dag(meta), w, r, solver="region", stats=stats)
        rounds.append(stats["rounds"])
        assert "budget_duals" not in stats
        check_against_finite_differences(meta, w, r, "region")
    assert max(rounds) >= 2, rounds
    assert sorted(reg.budget_sensitivity) == list(range(meta.num_stages))


# --- per-stage budgets ----------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["1F1B", "ZBVZeroBubble", "Interleaved1F1B"])
@pytest.mark.parametrize("solver", ["whole", "region"])
def test_equal_list_is_the_scalar_plan(schedule: str, solver: str, region_always) -> None:
    meta, w = case(schedule, 4, 8, 3)
    for r in (0.0, 0.3, 0.8, 1.0):
        scalar = make_plan(meta, w, r, solver=solver).to_json()
        per_stage = make_plan(meta, w, [r] * meta.num_stages, solver=solver).to_json()
        assert scalar["r_max"] == r and per_stage["r_max"] == [r] * meta.num_stages
        for d in (scalar, per_stage):
            d.pop("r_max")
            d["solver"].pop("seconds")
        assert json.dumps(scalar) == json.dumps(per_stage)  # bit for bit


@pytest.mark.parametrize("seed", range(8))
def test_per_stage_budgets_are_respected_and_exact(seed: int, region_always) -> None:
    rng = random.Random(seed)
    schedule = ["1F1B", "GPipe", "Interleaved1F1B", "ZBVZeroBubble"][seed % 4]
    meta, w = case(schedule, rng.randint(2, 4), 8, seed)
    r = [rng.choice([0.0, 0.2, 0.5, 0.9, 1.0]) for _ in range(meta.num_stages)]
    whole = make_plan(meta, w, r, solver="whole")
    region = make_plan(meta, w, r, solver="region")
    assert region.solver["method"] == "highs-region"
    t_star, least = scipy_lexicographic(meta, w, r, slack=0.0)
    for plan in (whole, region):
        assert plan.r_max == r
        assert plan.batch_time_ms["planned"] == pytest.approx(t_star, rel=1e-6, abs=1e-6)
        assert total_freezing(plan) == pytest.approx(least, rel=1e-6, abs=1e-6)
        for s, mean in stage_mean_ratios(plan).items():
            assert mean <= r[s] + 1e-7, (s, mean, r[s])
    scalar = make_plan(meta, w, max(r))
    assert whole.batch_time_ms["planned"] >= scalar.batch_time_ms["planned"] - 1e-9


def test_per_stage_plan_file_round_trip_and_checks(tmp_path) -> None:
    meta, w = case("1F1B", 4, 8, 5)
    plan = make_plan(meta, w, (0.2, 0.9, 0.5, 0.0))
    path = tmp_path / "plan.json"
    write_plan(plan, path)
    d = json.loads(path.read_text())
    assert d["r_max"] == [0.2, 0.9, 0.5, 0.0]
    assert set(d["budget_sensitivity"]) == {"0", "1", "2", "3"}
    back = load_plan(path)
    assert back.r_max == plan.r_max and back.budget_sensitivity == plan.budget_sensitivity and back.extra == {}

    def broken(**kw) -> str:
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(d | kw))
        with pytest.raises(PlannerError) as e:
            load_plan(bad)
        msg = str(e.value)
        assert msg.startswith(f"{bad}: ") and "\n" not in msg
        return msg

    assert "field 'r_max': 3 values for 4 stages" in broken(r_max=[0.2, 0.9, 0.5])
    assert "field 'r_max'[1] must be a number in [0, 1], got 1.5" in broken(r_max=[0.2, 1.5, 0.5, 0.0])
    assert "field 'r_max'[0] must be" in broken(r_max=[True, 0.9, 0.5, 0.0])
    assert "field 'r_max' must be a number in [0, 1]" in broken(r_max="0.5")
    # The budget check is per stage: stage 0's mean (about 0.2) exceeds a budget of 0.1 at index 0 only.
    assert stage_mean_ratios(plan)[0] == pytest.approx(0.2, abs=1e-6)
    assert "stage 0: mean freeze ratio" in broken(r_max=[0.1, 0.9, 0.5, 0.0])
    assert "r_max[0]" in broken(r_max=[0.1, 0.9, 0.5, 0.0])
    load_plan_ok = tmp_path / "ok.json"
    load_plan_ok.write_text(json.dumps(d | {"r_max": [0.2, 0.9, 0.9, 0.0]}))
    assert load_plan(load_plan_ok).r_max == [0.2, 0.9, 0.9, 0.0]
    # An ill-formed sensitivity is not checked: it stays an unknown field, kept as is.
    load_plan_ok.write_text(json.dumps(d | {"budget_sensitivity": {"x": 1}}))
    odd = load_plan(load_plan_ok)
    assert odd.budget_sensitivity is None and odd.extra == {"budget_sensitivity": {"x": 1}}
    assert odd.to_json()["budget_sensitivity"] == {"x": 1}


def test_scalar_plan_file_keeps_a_number(tmp_path) -> None:
    meta, w = case("GPipe", 2, 4, 1)
    write_plan(make_plan(meta, w, 0.5), tmp_path / "p.json")
    d = json.loads((tmp_path / "p.json").read_text())
    assert d["r_max"] == 0.5 and isinstance(d["r_max"], float)
    back = load_plan(tmp_path / "p.json")
    assert back.r_max == 0.5 and isinstance(back.r_max, float)


@pytest.mark.parametrize(
    "r_max, msg",
    [
        ([0.5, 0.5, 0.5], "r_max: 3 values for 4 stages"),
        ([0.5] * 5, "r_max: 5 values for 4 stages"),
        ([], "r_max: 0 values for 4 stages"),
        ([0.5, 1.5, 0.5, 0.5], "r_max[1] must be a number in [0, 1], got 1.5"),
        ([0.5, 0.5, -0.1, 0.5], "r_max[2] must be a number in [0, 1], got -0.1"),
        ([0.5, 0.5, 0.5, float("nan")], "r_max[3] must be a number in [0, 1], got nan"),
        ([0.5, "0.5", 0.5, 0.5], "r_max[1] must be a number in [0, 1], got '0.5'"),
        ([0.5, None, 0.5, 0.5], "r_max[1] must be a number in [0, 1], got None"),
        ([False, 0.5, 0.5, 0.5], "r_max[0] must be a number in [0, 1], got False"),
        ("0.5", "r_max must be a number in [0, 1], got '0.5'"),
    ],
)
def test_bad_per_stage_budgets(r_max, msg: str) -> None:
    meta, w = case("1F1B", 4, 4, 0)
    tr = synthetic_trace("1F1B", 4, 4)
    calls = [
        lambda: solve_freeze_lp(build_dag(meta), w, r_max),
        lambda: make_plan(meta, w, r_max),
        lambda: plan_from_trace(tr, r_max),
        lambda: sweep(meta, w, [0.5, r_max]),
    ]
    for call in calls:
        with pytest.raises(PlannerError) as e:
            call()
        assert str(e.value) == msg


def test_budget_helpers() -> None:
    import numpy as np

    assert check_r_max(0.5) == 0.5 and isinstance(check_r_max(1), float)
    assert check_r_max(np.array([0.5, 1])) == (0.5, 1.0) and check_r_max(np.float64(0.3)) == 0.3
    assert check_r_max(np.array(0.25)) == 0.25
    assert check_r_max([0, 1], 2) == (0.0, 1.0) and check_r_max([0.5], None) == (0.5,)
    assert format_r_max(0.5) == "0.5" and format_r_max([0.5, 1.0]) == "0.5,1"
    assert parse_r_max("0.8") == 0.8 and parse_r_max(" 0.5, 0.8 ,1") == (0.5, 0.8, 1.0)
    for text, msg in (
        ("1.5", "r_max must be"),
        ("0.5,x", "r_max[1] must be"),
        ("0.5,,1", "r_max[1]"),
        ("nan", "r_max must be"),
        ("", "r_max must be"),
    ):
        with pytest.raises(PlannerError, match=msg.replace("[", r"\[")):
            parse_r_max(text)


def test_sweep_with_per_stage_values(tmp_path) -> None:
    tr = synthetic_trace("1F1B", 4, 8, stage_scale=[1.0, 1.3, 0.8, 1.1], jitter=0.05, seed=3)
    from planner.trace.load import node_weights

    w = node_weights(tr)
    rows = sweep(tr.meta, w, [0.5, (0.5, 0.5, 0.5, 0.5), [0.2, 0.8, 0.4, 0.6]])
    assert rows[0].r_max == 0.5 and rows[1].r_max == (0.5,) * 4 and rows[2].r_max == (0.2, 0.8, 0.4, 0.6)
    assert rows[0].batch_ms == rows[1].batch_ms
    plan = make_plan(tr.meta, w, [0.2, 0.8, 0.4, 0.6])
    assert rows[2].batch_ms == pytest.approx(plan.batch_time_ms["planned"], rel=1e-12)
    assert "| 0.2,0.8,0.4,0.6 |" in format_table(rows)
    write_csv(rows, tmp_path / "s.csv")
    with open(tmp_path / "s.csv", newline="") as f:
        got = [r["r_max"] for r in csv.DictReader(f)]
    assert got == ["0.5", "0.5,0.5,0.5,0.5", "0.2,0.8,0.4,0.6"]
    plot_sweep(rows, tmp_path / "s.png")
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
