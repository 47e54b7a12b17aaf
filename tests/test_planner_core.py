"""DAG, longest path, freeze LP and plans: a hand-solved case, random properties, and a scipy cross-check."""

from __future__ import annotations

import json
import os
import random

import networkx as nx
import numpy as np
import pytest
from scipy.optimize import linprog

from planner.errors import PlannerError
from planner.lp.solve import solve_freeze_lp
from planner.plan import (
    PLAN_FORMAT,
    check_plan_matches,
    load_plan,
    make_plan,
    plan_summary,
    stage_mean_ratios,
    write_plan,
)
from planner.schedule.dag import SINK, SOURCE, build_dag, longest_path
from planner.trace.load import NodeWeights, TraceMeta
from planner.trace.synthetic import list_schedule_orders, placement, synthetic_meta, synthetic_weights


def gpipe_2x2() -> TraceMeta:
    return TraceMeta(
        "GPipe",
        2,
        2,
        2,
        [0, 1],
        {0: ["0F0", "0F1", "0B0", "0B1"], 1: ["1F0", "1F1", "1B0", "1B1"]},
    )


def weights_2x2(b00: tuple[float, float] = (2.0, 4.0)) -> NodeWeights:
    lo = {a: 1.0 for a in ("0F0", "0F1", "1F0", "1F1")} | {"0B1": 2.0, "1B0": 2.0, "1B1": 2.0, "0B0": b00[0]}
    hi = {a: 1.0 for a in ("0F0", "0F1", "1F0", "1F1")} | {"0B1": 4.0, "1B0": 4.0, "1B1": 4.0, "0B0": b00[1]}
    return NodeWeights(lo, hi)


# --- hand-solved ---------------------------------------------------------------------------------------
# Batch time T = 3 + b(1B0) + max(b(1B1), b(0B0)) + b(0B1) (F = 1 ms each).  With every B in [2, 4]:
# no-freeze 15, all-frozen 9.  r_max = 0.5: each stage may freeze one B-equivalent; the best use is
# r(1B0) = r(0B1) = 1 (they are on every path), giving T = 11 with 1B1 and 0B0 unfrozen.


def test_dag_edges_gpipe_2x2() -> None:
    g = build_dag(gpipe_2x2())
    expected = {
        ("0F0", "0F1"),
        ("0F1", "0B0"),
        ("0B0", "0B1"),
        ("1F0", "1F1"),
        ("1F1", "1B0"),
        ("1B0", "1B1"),
        ("0F0", "1F0"),
        ("0F1", "1F1"),
        ("1B0", "0B0"),
        ("1B1", "0B1"),
        ("0F0", "0B0"),
        ("0F1", "0B1"),
        ("1F0", "1B0"),
        ("1F1", "1B1"),
        (SOURCE, "0F0"),
        ("0B1", SINK),
    }
    assert set(g.edges) == expected
    assert g.nodes["1B0"] == {"stage": 1, "kind": "B", "microbatch": 0, "rank": 1}


def test_hand_solved_gpipe_2x2() -> None:
    meta, w = gpipe_2x2(), weights_2x2()
    plan = make_plan(meta, w, 0.5)
    assert plan.batch_time_ms["no_freeze"] == pytest.approx(15.0)
    assert plan.batch_time_ms["all_frozen"] == pytest.approx(9.0)
    assert plan.batch_time_ms["planned"] == pytest.approx(11.0, abs=1e-6)
    expect = {"1B0": (2.0, 1.0), "0B1": (2.0, 1.0), "1B1": (4.0, 0.0), "0B0": (4.0, 0.0), "0F0": (1.0, 0.0)}
    for a, (d, r) in expect.items():
        assert plan.actions[a].duration == pytest.approx(d, abs=1e-6), a
        assert plan.actions[a].freeze_ratio == pytest.approx(r, abs=1e-6), a
    assert plan.actions["0B1"].start == pytest.approx(9.0, abs=1e-6)


def test_hand_solved_second_stage_least_freezing() -> None:
    # 0B0 in [1, 2] never dominates 1B1 once 1B1 is frozen to 2, so with r_max = 1 the optimum T = 9 is
    # reached with 0B0 unfrozen: only the second (least-freezing) stage decides that.
    meta, w = gpipe_2x2(), weights_2x2(b00=(1.0, 2.0))
    plan = make_plan(meta, w, 1.0)
    assert plan.batch_time_ms["planned"] == pytest.approx(9.0, abs=1e-6)
    assert plan.actions["0B0"].freeze_ratio == pytest.approx(0.0, abs=1e-7)
    for a in ("1B0", "1B1", "0B1"):
        assert plan.actions[a].freeze_ratio == pytest.approx(1.0, abs=1e-7)


def test_longest_path_matches_networkx_and_critical_path() -> None:
    meta = synthetic_meta(4, 2, 6, True)
    g = build_dag(meta)
    w = synthetic_weights(meta, seed=7)
    t, starts, path = longest_path(g, w.w_max)
    h = nx.DiGraph()
    for u, v in g.edges:
        h.add_edge(u, v, weight=w.w_max.get(u, 0.0))
    assert t == pytest.approx(nx.dag_longest_path_length(h))
    assert sum(w.w_max[a] for a in path) == pytest.approx(t)
    assert starts[path[0]] == 0.0
    for a, b in zip(path, path[1:]):
        assert g.has_edge(a, b)
        assert starts[b] == pytest.approx(starts[a] + w.w_max[a])


def test_cycle_is_reported_with_actions() -> None:
    # rank 0 runs 0B0 before 0F0: contradicts F -> B.
    meta = TraceMeta("GPipe", 1, 1, 1, [0], {0: ["0B0", "0F0"]})
    with pytest.raises(PlannerError, match=r"cycle: .*0B0.*0F0|cycle: .*0F0.*0B0"):
        build_dag(meta)


@pytest.mark.parametrize("r_max", [-0.1, 1.5, float("nan"), "0.5"])
def test_r_max_out_of_range(r_max) -> None:
    with pytest.raises(PlannerError, match="r_max"):
        solve_freeze_lp(build_dag(gpipe_2x2()), weights_2x2(), r_max)


# --- random properties ---------------------------------------------------------------------------------


def random_case(seed: int) -> tuple[TraceMeta, NodeWeights]:
    rng = random.Random(seed)
    pp = rng.randint(1, 4)
    spr = rng.choice([1, 2]) if pp > 1 else rng.choice([1, 2, 3])
    n_mb = rng.randint(1, 6)
    split = rng.random() < 0.5
    kind = rng.choice(["looped", "v", "random"])
    if kind == "random":
        s2r = [rng.randrange(pp) for _ in range(pp * spr)]
        s2r[:pp] = range(pp)  # every rank holds a stage
        rng.shuffle(s2r)
    else:
        s2r = placement(pp, spr, kind)
    policy = rng.choice(["1f1b", "gpipe"])
    orders = list_schedule_orders(s2r, n_mb, split, policy)
    meta = TraceMeta(f"rand-{kind}-{policy}", max(s2r) + 1, len(s2r), n_mb, s2r, orders)
    w = synthetic_weights(meta, seed=seed, lower_frac=(0.0, 1.0), jitter=0.5)
    if rng.random() < 0.3:  # some B/W that do not shrink at all
        for a in list(w.w_min):
            if a[len(a.rstrip("0123456789")) - 1] in "BW" and rng.random() < 0.3:
                w.w_min[a] = w.w_max[a]
    return meta, w


def check_plan_properties(meta: TraceMeta, w: NodeWeights, r_max: float) -> None:
    plan = make_plan(meta, w, r_max)
    bt = plan.batch_time_ms
    tol = 1e-6 * max(1.0, bt["no_freeze"])
    assert bt["all_frozen"] - tol <= bt["planned"] <= bt["no_freeze"] + tol
    g = build_dag(meta)
    durs = {a: p.duration for a, p in plan.actions.items()}
    t, starts, _ = longest_path(g, durs)
    assert t == pytest.approx(bt["planned"], rel=1e-6, abs=1e-6)
    for a, p in plan.actions.items():
        assert p.w_min - 1e-9 <= p.duration <= p.w_max + 1e-9
        assert p.start == pytest.approx(starts[a])
        if a in w.freezable:
            assert p.freeze_ratio == pytest.approx((p.w_max - p.duration) / (p.w_max - p.w_min), abs=1e-9)
        else:
            assert p.freeze_ratio == 0.0 and p.duration == p.w_max
    for s, mean in stage_mean_ratios(plan).items():
        assert mean <= r_max + 1e-7, s
    if r_max == 0.0:
        assert bt["planned"] == pytest.approx(bt["no_freeze"], rel=1e-9, abs=1e-9)
        assert all(p.freeze_ratio < 1e-9 for p in plan.actions.values())
    if r_max == 1.0:
        assert bt["planned"] == pytest.approx(bt["all_frozen"], rel=1e-7, abs=1e-7)
    # Least freezing: un-freezing any frozen action a little must make the batch slower.
    for a, p in plan.actions.items():
        if p.freeze_ratio > 1e-6:
            step = min(1e-3 * (p.w_max - p.w_min), p.w_max - p.duration)
            t2 = longest_path(g, durs | {a: p.duration + step})[0]
            assert t2 > bt["planned"] + 0.5 * step - 1e-7, a


@pytest.mark.parametrize("seed", range(40))
def test_random_plan_properties(seed: int) -> None:
    meta, w = random_case(seed)
    r_max = [0.0, 1.0, 0.3, 0.5, 0.8][seed % 5]
    check_plan_properties(meta, w, r_max)


def scipy_lexicographic(
    meta: TraceMeta,
    w: NodeWeights,
    r_max: float | list[float],
    slack: float = 1e-9,
) -> tuple[float, float]:
    """Independent straightforward model: a start and a duration for every node, every DAG edge a row.

    ``r_max``: one budget, or a list of one per stage.  Stage 2 bounds the batch time by
    ``T* (1 + slack) + slack``."""
    g = build_dag(meta)
    nodes = list(g.nodes)
    idx = {a: i for i, a in enumerate(nodes)}
    n = len(nodes)
    nv = 2 * n  # s_0..s_{n-1}, d_0..d_{n-1}
    rows, rhs = [], []
    for u, v in g.edges:  # s_u + d_u - s_v <= 0
        r = np.zeros(nv)
        r[idx[u]] += 1
        r[n + idx[u]] += 1
        r[idx[v]] -= 1
        rows.append(r)
        rhs.append(0.0)
    frz = sorted(w.freezable)
    by_stage: dict[int, list[str]] = {}
    for a in frz:
        by_stage.setdefault(g.nodes[a]["stage"], []).append(a)
    for stage, acts in by_stage.items():  # sum (w_max - d)/delta <= r k  <=>  -sum d/delta <= r k - sum w_max/delta
        r = np.zeros(nv)
        c = 0.0
        for a in acts:
            dlt = w.w_max[a] - w.w_min[a]
            r[n + idx[a]] = -1.0 / dlt
            c += w.w_max[a] / dlt
        rows.append(r)
        rhs.append((r_max[stage] if isinstance(r_max, list) else r_max) * len(acts) - c)
    bounds = [(0, None)] * n
    for a in nodes:
        if a in (SOURCE, SINK):
            bounds.append((0, 0))
        else:
            bounds.append((w.w_min[a], w.w_max[a]))
    bounds[idx[SOURCE]] = (0, 0)
    c1 = np.zeros(nv)
    c1[idx[SINK]] = 1
    A, b = np.array(rows), np.array(rhs)
    r1 = linprog(c1, A_ub=A, b_ub=b, bounds=bounds, method="highs")
    assert r1.status == 0
    t_star = r1.fun
    bounds2 = list(bounds)
    bounds2[idx[SINK]] = (0, t_star * (1 + slack) + slack)
    c2 = np.zeros(nv)
    const = 0.0
    for a in frz:
        dlt = w.w_max[a] - w.w_min[a]
        c2[n + idx[a]] = -1.0 / dlt
        const += w.w_max[a] / dlt
    r2 = linprog(c2, A_ub=A, b_ub=b, bounds=bounds2, method="highs")
    assert r2.status == 0
    return t_star, r2.fun + const


@pytest.mark.parametrize("seed", range(100, 116))
def test_matches_straightforward_scipy_model(seed: int) -> None:
    meta, w = random_case(seed)
    r_max = [0.2, 0.5, 0.7, 0.9][seed % 4]
    plan = make_plan(meta, w, r_max)
    t_star, total = scipy_lexicographic(meta, w, r_max)
    assert plan.batch_time_ms["planned"] == pytest.approx(t_star, rel=1e-6, abs=1e-6)
    ours = sum(p.freeze_ratio for p in plan.actions.values())
    assert ours == pytest.approx(total, rel=1e-5, abs=1e-5)


def test_medium_schedule_lp_stays_small() -> None:
    meta = synthetic_meta(8, 2, 32, True)
    w = synthetic_weights(meta, seed=3)
    stats: dict = {}
    sol = solve_freeze_lp(build_dag(meta), w, 0.5, stats=stats)
    assert stats["cols"] < 2 * len(sol.durations)  # reductions: far fewer than start+duration per node
    # no wall-clock bound on sol.seconds: a loaded machine may take as long as it likes; the column count above
    # is what keeps the LP small


# --- plan files ----------------------------------------------------------------------------------------


def test_plan_round_trip_and_atomic_write(tmp_path) -> None:
    meta, w = gpipe_2x2(), weights_2x2()
    plan = make_plan(meta, w, 0.5)
    plan.extra["note"] = "kept"
    path = tmp_path / "plan.json"
    write_plan(plan, path)
    assert os.listdir(tmp_path) == ["plan.json"]
    d = json.loads(path.read_text())
    assert d["format"] == PLAN_FORMAT and set(d["solver"]) >= {"name", "status", "seconds"}
    back = load_plan(path)
    assert back.actions == plan.actions
    assert back.batch_time_ms == plan.batch_time_ms
    assert back.extra == {"note": "kept"}
    check_plan_matches(back, "GPipe", 2, 2, str(path))
    with pytest.raises(PlannerError, match="num_microbatches"):
        check_plan_matches(back, "GPipe", 2, 4, str(path))
    text = plan_summary(plan, meta)
    for s in ("no-freeze 15.000", "all-frozen 9.000", "planned 11.000", "critical path", "0: 0.500"):
        assert s in text


def _broken(d: dict, how: str) -> dict:
    d = json.loads(json.dumps(d))
    if how == "format":
        d["format"] = "timelyfreeze-plan/0"
    elif how == "missing":
        del d["r_max"]
    elif how == "duration":
        d["actions"]["1B1"]["duration"] = 5.0
    elif how == "ratio":
        d["actions"]["1B1"]["freeze_ratio"] = 0.5
    elif how == "budget":
        a = d["actions"]["1B1"]
        a["duration"], a["freeze_ratio"] = 2.0, 1.0
    elif how == "type":
        d["actions"]["0F0"]["start"] = "0"
    elif how == "action":
        d["actions"]["9F0"] = d["actions"]["0F0"]
    return d


@pytest.mark.parametrize(
    "how,msg",
    [
        ("format", "format"),
        ("missing", "r_max"),
        ("duration", "outside"),
        ("ratio", "freeze_ratio"),
        ("budget", "exceeds r_max"),
        ("type", "start"),
        ("action", "9F0"),
    ],
)
def test_load_plan_rejects_broken(tmp_path, how: str, msg: str) -> None:
    plan = make_plan(gpipe_2x2(), weights_2x2(), 0.5)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_broken(plan.to_json(), how)))
    with pytest.raises(PlannerError, match=msg) as e:
        load_plan(path)
    assert "bad.json" in str(e.value) and "\n" not in str(e.value)


def test_load_plan_bad_json(tmp_path) -> None:
    path = tmp_path / "p.json"
    path.write_text("{\n oops")
    with pytest.raises(PlannerError, match=r"p\.json:2: invalid JSON"):
        load_plan(path)


# --- fast path vs the plain reference LP on the real schedule orders ----------------------------------


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize(
    "schedule", ["GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble"]
)
def test_fast_path_matches_plain_lp_on_schedules(schedule: str, seed: int) -> None:
    from planner.schedule import orders as schedules

    rng = random.Random(seed * 7919 + len(schedule))
    pp = rng.randint(2, 4)
    spr = schedules.stages_per_rank(schedule)
    n_mb = pp * rng.randint(1, 3)
    s2r = schedules.stage_to_rank(schedule, pp, spr)
    meta = TraceMeta(schedule, pp, len(s2r), n_mb, s2r, schedules.rank_orders(schedule, pp, n_mb, spr))
    w = synthetic_weights(meta, seed=seed, lower_frac=(0.0, 1.0), jitter=0.5)
    r_max = [0.2, 0.5, 0.8][seed % 3]
    stats: dict = {}
    sol = solve_freeze_lp(build_dag(meta), w, r_max, stats=stats)
    assert sol.solver == "highs-fast"
    # T <= T* exactly: the fast path's stage 2 works on the stage-1 optimal face, so a slack on T (as the
    # previous default used) would let the reference freeze up to ~1e-5 relative less.
    t_star, total = scipy_lexicographic(meta, w, r_max, slack=0.0)
    assert sol.makespan == pytest.approx(t_star, rel=1e-6, abs=1e-6)
    ratios = {a: (w.w_max[a] - d) / (w.w_max[a] - w.w_min[a]) for a, d in sol.durations.items() if a in w.freezable}
    assert sum(ratios.values()) == pytest.approx(total, rel=1e-6, abs=1e-6)
    by_stage: dict[int, list[float]] = {}
    for a, r in ratios.items():
        by_stage.setdefault(int(a[: len(a.rstrip("0123456789")) - 1]), []).append(r)
    for s, rs in by_stage.items():
        assert sum(rs) <= r_max * len(rs) + 1e-7, s
    old = solve_freeze_lp(build_dag(meta), w, r_max, solver="whole", _config="dual")  # the previous default agrees too
    assert old.makespan == pytest.approx(sol.makespan, rel=1e-6, abs=1e-6)


# --- region solve (auto from 20k actions) vs the plain reference LP --------------------------------------


def _region_case(seed: int) -> tuple[TraceMeta, NodeWeights, float]:
    from planner.schedule import orders as schedules

    rng = random.Random(seed)
    schedule = ["GPipe", "1F1B", "Interleaved1F1B", "ZBVZeroBubble", "InterleavedZeroBubble"][seed % 5]
    pp = rng.randint(2, 5)
    spr = schedules.stages_per_rank(schedule)
    n_mb = pp * rng.randint(1, 4)
    s2r = schedules.stage_to_rank(schedule, pp, spr)
    meta = TraceMeta(schedule, pp, len(s2r), n_mb, s2r, schedules.rank_orders(schedule, pp, n_mb, spr))
    w = synthetic_weights(meta, seed=seed, lower_frac=(0.0, 1.0), jitter=rng.choice([0.05, 0.5]))
    return meta, w, [0.1, 0.3, 0.5, 0.8, 1.0][seed % 5]


def test_region_solve_is_exact_and_grows(monkeypatch) -> None:
    """The region loop (forced on small batches: no fallback to the whole LP) reaches the plain LP's
    lexicographic optimum; several cases need more than one round, so the growth path is exercised."""
    import planner.lp.region as lp

    monkeypatch.setattr(lp, "_REGION_MAX_FRACTION", 1.0)
    rounds = []
    for seed in range(30):
        meta, w, r_max = _region_case(seed)
        stats: dict = {}
        sol = solve_freeze_lp(build_dag(meta), w, r_max, solver="region", stats=stats)
        assert sol.solver == "highs-region"
        rounds.append(stats["rounds"])
        t_star, total = scipy_lexicographic(meta, w, r_max, slack=0.0)
        assert sol.makespan == pytest.approx(t_star, rel=1e-6, abs=1e-6), seed
        ratios = [(w.w_max[a] - d) / (w.w_max[a] - w.w_min[a]) for a, d in sol.durations.items() if a in w.freezable]
        assert sum(ratios) == pytest.approx(total, rel=1e-6, abs=1e-6), seed
    assert max(rounds) >= 3 and sum(r > 1 for r in rounds) >= 5, rounds


def test_region_falls_back_to_the_whole_lp_when_it_grows_too_large() -> None:
    meta = synthetic_meta(4, 1, 8, False)
    w = synthetic_weights(meta, seed=1)
    sol = solve_freeze_lp(build_dag(meta), w, 0.5, solver="region")
    assert sol.solver == "highs-fast"
    ref = solve_freeze_lp(build_dag(meta), w, 0.5, solver="whole")
    assert sol.makespan == ref.makespan and sol.durations == ref.durations


def test_region_matches_whole_lp_on_a_long_pipeline() -> None:
    from planner.schedule import orders as schedules

    meta = TraceMeta(
        "ZBVZeroBubble",
        8,
        16,
        128,
        schedules.stage_to_rank("ZBVZeroBubble", 8, 2),
        schedules.rank_orders("ZBVZeroBubble", 8, 128, 2),
    )
    w = synthetic_weights(meta, seed=5)
    g = build_dag(meta)
    stats: dict = {}
    reg = solve_freeze_lp(g, w, 0.5, solver="region", stats=stats)
    whole = solve_freeze_lp(g, w, 0.5, solver="whole")
    assert reg.solver == "highs-region" and stats["region_actions"] < 0.6 * len(reg.durations)
    assert reg.makespan == pytest.approx(whole.makespan, rel=1e-9)
    fz = w.freezable

    def total(sol):
        return sum((w.w_max[a] - d) / (w.w_max[a] - w.w_min[a]) for a, d in sol.durations.items() if a in fz)

    assert total(reg) == pytest.approx(total(whole), rel=1e-6)


@pytest.mark.parametrize("schedule", ["Interleaved1F1B", "ZBVZeroBubble", "1F1B", "DualPipeV"])
def test_bounded_region_is_certified_against_the_exact_lp(schedule: str, monkeypatch) -> None:
    """The bounded region method (gap > 0): its lower bound is at most the exact optimum, its batch time at
    most the lower bound times (1 + gap), it respects every stage's budget, and its durations are its batch
    time's longest path.  Forced on small real-like batches (no fallback); several r_max and seeds."""
    import planner.lp.region as lp_region
    from planner.schedule import orders as schedules
    from planner.trace.synthetic import real_like_weights

    monkeypatch.setattr(lp_region, "_REGION_MAX_FRACTION", 1.0)
    pp, spr = 4, schedules.stages_per_rank(schedule)
    meta = TraceMeta(
        schedule,
        pp,
        pp * spr,
        16,
        schedules.stage_to_rank(schedule, pp, spr),
        schedules.rank_orders(schedule, pp, 16, spr),
    )
    g = build_dag(meta)
    bounded = 0
    for seed, r_max in [(0, 0.2), (1, 0.5), (2, 0.8), (3, [0.3, 0.9] * (pp * spr // 2))]:
        w = real_like_weights(meta, seed=seed)
        gap = 0.01
        sol = solve_freeze_lp(g, w, r_max, solver="region", gap=gap)
        exact = solve_freeze_lp(g, w, r_max, solver="whole")
        assert sol.lower_bound <= exact.makespan * (1 + 1e-9)
        assert exact.makespan <= sol.makespan * (1 + 1e-9)
        assert sol.makespan <= sol.lower_bound * (1 + gap) * (1 + 1e-9)
        assert sol.gap == pytest.approx((sol.makespan - sol.lower_bound) / sol.lower_bound, abs=1e-12)
        assert longest_path(g, sol.durations)[0] == pytest.approx(sol.makespan, rel=1e-9)
        per_stage = {}
        for a, d in sol.durations.items():
            if a in w.freezable:
                per_stage.setdefault(g.nodes[a]["stage"], []).append((w.w_max[a] - d) / (w.w_max[a] - w.w_min[a]))
        for s, rs in per_stage.items():
            cap = r_max if isinstance(r_max, float) else r_max[s]
            assert sum(rs) <= cap * len(rs) + 1e-6, (seed, s)
        if sol.solver == "highs-region-bounded":
            bounded += 1
        else:  # the region became exact first: the exact optimum
            assert sol.solver == "highs-region" and sol.makespan == pytest.approx(exact.makespan, rel=1e-6)


def test_rebalance_certifies_a_nearly_balanced_pipeline(monkeypatch) -> None:
    """Nearly balanced stages (+-5 %): the even spread of the leftover budget stays above the gap and the
    region outgrows its limit (the whole LP ran); the rebalance passes reach a plan certified within the gap
    in a small region.  Deterministic (seeded timings, HiGHS single-threaded); checked against the exact LP."""
    import planner.lp.region as lp_region
    from planner.lp.arrays import Paths, dag_arrays, stage_counts
    from planner.schedule import orders as schedules
    from planner.trace.synthetic import real_like_weights

    meta = TraceMeta(
        "ZBVZeroBubble",
        4,
        8,
        16,
        schedules.stage_to_rank("ZBVZeroBubble", 4, 2),
        schedules.rank_orders("ZBVZeroBubble", 4, 16, 2),
    )
    g = build_dag(meta)
    w = real_like_weights(meta, seed=1, spread=0.05)
    exact = solve_freeze_lp(g, w, 0.5, solver="whole")
    stats: dict = {}
    sol = solve_freeze_lp(g, w, 0.5, solver="region", gap=0.001, stats=stats)
    assert sol.solver == "highs-region-bounded" and stats["rebalance_passes"] >= 1
    assert stats["region_actions"] < 0.6 * len(sol.durations)
    assert sol.lower_bound <= exact.makespan * (1 + 1e-9) <= sol.makespan * (1 + 1e-9)
    assert sol.makespan <= sol.lower_bound * 1.001 * (1 + 1e-9)
    per_stage: dict[int, list[float]] = {}
    for a, d in sol.durations.items():
        if a in w.freezable:
            per_stage.setdefault(g.nodes[a]["stage"], []).append((w.w_max[a] - d) / (w.w_max[a] - w.w_min[a]))
    assert all(sum(rs) <= 0.5 * len(rs) + 1e-6 for rs in per_stage.values())

    # rebalance itself: never worse than its input, its time is its plan's longest path, budgets held
    arrays = dag_arrays(g, w)
    paths = Paths(arrays)
    r0 = np.where(arrays.delta > 0, 0.5, 0.0)
    t0 = lp_region._longest(arrays, paths, r0)[0]
    r1, t1, passes = lp_region.rebalance(arrays, paths, r0, 0.5, exact.makespan, 0.001)
    assert passes >= 1 and t1 <= t0 and t1 == pytest.approx(lp_region._longest(arrays, paths, r1)[0], rel=1e-12)
    used = np.bincount(arrays.stage[arrays.delta > 0], weights=r1[arrays.delta > 0])
    for s_, c in stage_counts(arrays).items():
        assert used[s_] <= 0.5 * c + 1e-9

    monkeypatch.setattr(lp_region, "_REBALANCE_PASSES", 0)  # without it: the region gives up
    assert solve_freeze_lp(g, w, 0.5, solver="region", gap=0.001).solver == "highs-fast"


def test_gap_is_validated_and_auto_uses_it_only_on_large_batches() -> None:
    meta = synthetic_meta(4, 1, 8, False)
    w = synthetic_weights(meta, seed=1)
    g = build_dag(meta)
    for bad in (-0.1, 1.0, True, "0.1"):
        with pytest.raises(PlannerError, match="gap must be a number in"):
            solve_freeze_lp(g, w, 0.5, gap=bad)
    with pytest.raises(PlannerError, match="fallback_gap must be a number in"):
        solve_freeze_lp(g, w, 0.5, fallback_gap=1.5)
    sol = solve_freeze_lp(g, w, 0.5)  # small: the exact whole LP, whatever the default gap
    assert sol.solver == "highs-fast" and sol.gap == 0.0 and sol.lower_bound == sol.makespan
    assert sol.gap_target is None


def _freeze_ratios(g, w, sol) -> dict[int, list[float]]:
    per_stage: dict[int, list[float]] = {}
    for a, d in sol.durations.items():
        if a in w.freezable:
            per_stage.setdefault(g.nodes[a]["stage"], []).append((w.w_max[a] - d) / (w.w_max[a] - w.w_min[a]))
    return per_stage


def test_fallback_gap_returns_the_best_certified_plan_where_the_gap_is_not_reached(monkeypatch) -> None:
    """Nearly balanced stages, where the region method cannot certify a tight gap: with ``fallback_gap`` the
    best plan of its rounds comes back (not the whole LP), its lower bound at most the exact optimum, its batch
    time within ``fallback_gap`` of that bound, every budget held, the missed target recorded.  Deterministic
    (seeded timings, HiGHS single-threaded); the invariants are checked on every case, the fallback must occur."""
    import planner.lp.region as lp_region
    from planner.schedule import orders as schedules
    from planner.trace.synthetic import real_like_weights

    monkeypatch.setattr(lp_region, "_REBALANCE_PASSES", 0)  # the region method alone gives up on these
    used = 0
    for schedule in ("ZBVZeroBubble", "Interleaved1F1B"):
        meta = TraceMeta(
            schedule, 4, 8, 16, schedules.stage_to_rank(schedule, 4, 2), schedules.rank_orders(schedule, 4, 16, 2)
        )
        g = build_dag(meta)
        for seed in (1, 2):
            w = real_like_weights(meta, seed=seed, spread=0.05)
            exact = solve_freeze_lp(g, w, 0.5, solver="whole")
            sol = solve_freeze_lp(g, w, 0.5, solver="region", gap=0.0001, fallback_gap=0.05)
            assert sol.lower_bound <= exact.makespan * (1 + 1e-9) <= sol.makespan * (1 + 1e-9)
            assert longest_path(g, sol.durations)[0] == pytest.approx(sol.makespan, rel=1e-9)
            assert all(sum(rs) <= 0.5 * len(rs) + 1e-6 for rs in _freeze_ratios(g, w, sol).values())
            if sol.gap_target is not None:
                used += 1
                assert sol.solver == "highs-region-bounded" and sol.gap_target == 0.0001
                assert 0.0001 < sol.gap <= 0.05
            else:
                assert sol.gap <= 0.0001 + 1e-12
            strict = solve_freeze_lp(g, w, 0.5, solver="region", gap=0.0001)  # no fallback: the gap holds
            assert strict.gap_target is None and strict.gap <= 0.0001 + 1e-12
    assert used >= 1


def test_freeze_and_give_back_holds_every_budget_and_meets_its_target_where_no_stage_is_scaled() -> None:
    import planner.lp.region as lp_region
    from planner.lp.arrays import Paths, dag_arrays, stage_counts
    from planner.schedule import orders as schedules
    from planner.trace.synthetic import real_like_weights

    meta = TraceMeta(
        "ZBVZeroBubble",
        4,
        8,
        16,
        schedules.stage_to_rank("ZBVZeroBubble", 4, 2),
        schedules.rank_orders("ZBVZeroBubble", 4, 16, 2),
    )
    g = build_dag(meta)
    for r_max in (0.3, 0.5, [0.2, 0.9] * 4):
        w = real_like_weights(meta, seed=3, spread=0.05)
        exact = solve_freeze_lp(g, w, r_max, solver="whole")
        arrays = dag_arrays(g, w)
        paths = Paths(arrays)
        frz = arrays.delta > 0
        for target in (exact.makespan, exact.makespan * 1.01):
            r = lp_region.freeze_and_give_back(arrays, paths, r_max, target)
            assert ((r >= 0) & (r <= 1)).all() and (r[~frz] == 0).all()
            used = np.bincount(arrays.stage[frz], weights=r[frz])
            tight = False
            for s_, c in stage_counts(arrays).items():
                cap = r_max if isinstance(r_max, float) else r_max[s_]
                assert used[s_] <= cap * c + 1e-9
                tight |= used[s_] >= cap * c - 1e-9
            t = lp_region._longest(arrays, paths, r)[0]
            assert t >= exact.makespan * (1 - 1e-9)  # a feasible plan: never below the optimum
            if not tight:  # nothing scaled down: the give-back kept the target
                assert t <= target * (1 + 1e-9)


def test_replay_weights_resample_a_measured_trace_onto_a_larger_pipeline() -> None:
    from planner.schedule import orders as schedules
    from planner.trace.load import node_weights
    from planner.trace.simulate import synthetic_trace
    from planner.trace.synthetic import replay_weights

    src = synthetic_trace("ZBVZeroBubble", 2, 4, stage_scale=[1.0, 1.5, 0.7, 1.2], jitter=0.1, seed=3)
    sw = node_weights(src)
    meta = TraceMeta(
        "ZBVZeroBubble",
        4,
        8,
        16,
        schedules.stage_to_rank("ZBVZeroBubble", 4, 2),
        schedules.rank_orders("ZBVZeroBubble", 4, 16, 2),
    )
    w = replay_weights(sw, src.meta, meta, seed=1)
    assert set(w.w_max) == set(meta.all_actions())
    for a, hi in w.w_max.items():  # every pair is one measured pair of the same kind of stage % 4
        act = a[:1] if a[1].isalpha() else a[:2]
        stage, kind = int(act), a[len(act)]
        pairs = {(sw.w_min[b], sw.w_max[b]) for b in sw.w_max if b.startswith(f"{stage % 4}{kind}")}
        assert (w.w_min[a], hi) in pairs
    with pytest.raises(PlannerError, match="same schedule"):
        replay_weights(sw, src.meta, synthetic_meta(4, 1, 8, False), seed=0)
