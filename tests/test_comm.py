"""Communication delays on cross-rank edges (``planner.timing.comm``): the estimation rule, the longest path and
the freeze LP with delays (against a plain reference LP), and plans made with and without them."""

from __future__ import annotations

import json
import math
import random

import networkx as nx
import numpy as np
import pytest
from scipy.optimize import linprog

from planner.errors import PlannerError
from planner.lp.solve import solve_freeze_lp
from planner.plan import load_plan, make_plan, plan_from_trace, write_plan
from planner.schedule.dag import SINK, SOURCE, build_dag, longest_path
from planner.schedule.orders import schedule_meta
from planner.timing.comm import cross_rank_edges, estimate_edge_delays, summarize, summary_line
from planner.trace.load import NodeWeights, Trace, TraceMeta, load_trace, trace_from_records, validate_meta
from planner.trace.simulate import simulate_batch, synthetic_trace, write_trace
from planner.trace.synthetic import synthetic_weights

SCHEDULES = ("1F1B", "GPipe", "Interleaved1F1B", "ZBVZeroBubble")


def timed_trace(
    schedule: str,
    pp: int,
    mb: int,
    delays,
    *,
    stage_scale=None,
    steps: int = 3,
    hosts: list[str] | None = None,
    seed: int = 0,
) -> Trace:
    """A synthetic trace whose records carry ``start_ms``: each batch runs as early as the DAG allows with the
    true delays ``delays(edges) -> EdgeDelays`` on its cross-rank edges (steps 1000 ms apart)."""
    base = synthetic_trace(schedule, pp, mb, jitter=0.1, seed=seed, steps=steps, stage_scale=stage_scale)
    dag = build_dag(base.meta)
    true = delays(cross_rank_edges(dag))
    by_step: dict[int, dict[str, float]] = {}
    for rec in base.records:
        by_step.setdefault(rec.step, {})[rec.action] = rec.ms
    starts = {step: longest_path(dag, durs, true)[1] for step, durs in by_step.items()}
    recs: dict[int, list[dict]] = {r: [] for r in range(pp)}
    for rec in base.records:
        recs[rec.rank].append(
            {
                "step": rec.step,
                "action": rec.action,
                "ms": rec.ms,
                "phase": rec.phase,
                "freeze_ratio": rec.freeze_ratio,
                "start_ms": 1000.0 * rec.step + starts[rec.step][rec.action],
            }
        )
    meta = base.meta.to_json() | ({"hosts": hosts} if hosts is not None else {})
    trace = trace_from_records(meta, recs, source=base.source)
    trace.true_delays = true  # type: ignore[attr-defined]
    return trace


# --- the estimation rule, by hand ----------------------------------------------------------------------

GPIPE_2X2 = {
    "format": "timelyfreeze-trace/1",
    "schedule": "GPipe",
    "pp_degree": 2,
    "num_stages": 2,
    "num_microbatches": 2,
    "stage_to_rank": [0, 1],
    "rank_orders": {"0": ["0F0", "0F1", "0B0", "0B1"], "1": ["1F0", "1F1", "1B0", "1B1"]},
}


def layout(o: float, d_fwd: float, d_bwd: float) -> dict[str, tuple[float, float]]:
    """One GPipe 2x2 batch from ``o`` (F: 1 ms, B: 2 ms): 1F0 starts ``d_fwd`` after 0F0 ends, 0B0 ``d_bwd``
    after 1B0 ends, every other action as soon as its rank is free.  1F1 and 0B1 then wait for their own
    rank (censored) while ``d_fwd, d_bwd > 0``."""
    t = {"0F0": (o, 1.0), "0F1": (o + 1, 1.0), "1F0": (o + 1 + d_fwd, 1.0)}
    t["1F1"] = (t["1F0"][0] + 1, 1.0)
    t["1B0"] = (t["1F1"][0] + 1, 2.0)
    t["1B1"] = (t["1B0"][0] + 2, 2.0)
    t["0B0"] = (t["1B0"][0] + 2 + d_bwd, 2.0)
    t["0B1"] = (t["0B0"][0] + 2, 2.0)
    return t


def hand_records(batches: list[tuple[int, str, dict[str, tuple[float, float]]]]) -> dict[int, list[dict]]:
    recs: dict[int, list[dict]] = {0: [], 1: []}
    for step, phase, t in batches:
        for r, order in GPIPE_2X2["rank_orders"].items():
            for a in order:
                start, ms = t[a]
                recs[int(r)].append(
                    {"step": step, "action": a, "ms": ms, "phase": phase, "freeze_ratio": 0.0, "start_ms": start}
                )
    return recs


def test_rule_by_hand_censoring_median_and_link() -> None:
    batches = [
        (1, "warmup", layout(0, 50.0, 50.0)),  # other phases are ignored
        (2, "upper", layout(100, 0.5, 0.5)),
        (3, "lower", layout(200, 0.9, 1.0)),
        (4, "upper", layout(300, 0.3, 0.8)),
    ]
    got = estimate_edge_delays(trace_from_records(GPIPE_2X2, hand_records(batches)))
    # 1F0 is its rank's first action (end_p = -inf): samples 0.5, 0.9, 0.3; 0B0's rank predecessor 0F1 ended
    # long before 1B0: samples 0.5, 1.0, 0.8.  1F1 and 0B1 always waited for their own rank: censored, so
    # they get the link value, the median of all six uncensored samples (0.5 + 0.8) / 2.
    assert got == pytest.approx(
        {("0F0", "1F0"): 0.5, ("1B0", "0B0"): 0.8, ("0F1", "1F1"): 0.65, ("1B1", "0B1"): 0.65}, abs=1e-9
    )


def test_rule_clamps_negative_medians() -> None:
    # 0B0 starts before 1B0's end (a negative gap): then 0B1's rank predecessor 0B0 ends before 1B1, so
    # 0B1's samples are uncensored and negative too.  Clamped to 0; the link (median -0.1) as well.
    batches = [
        (2, "upper", layout(100, 0.5, -0.2)),
        (3, "upper", layout(200, 0.9, -0.1)),
        (4, "lower", layout(300, 0.3, -0.3)),
    ]
    got = estimate_edge_delays(trace_from_records(GPIPE_2X2, hand_records(batches)))
    assert got == pytest.approx(
        {("0F0", "1F0"): 0.5, ("1B0", "0B0"): 0.0, ("0F1", "1F1"): 0.0, ("1B1", "0B1"): 0.0}, abs=1e-9
    )


def test_rule_accumulation_batches_missing_records_and_other_replicas() -> None:
    # Two accumulation batches per step: the k-th record of an action in a step belongs to batch k.
    recs = hand_records(
        [(2, "upper", layout(100, 0.5, 0.5)), (2, "upper", layout(150, 0.7, 0.7)), (3, "upper", layout(200, 0.6, 0.6))]
    )
    # Step 4 lacks 0F0 (edge 0F0->1F0 skips it) and 0F1 (0B0's rank predecessor: edge 1B0->0B0 skips it).
    extra = hand_records([(4, "upper", layout(300, 9.0, 9.0))])
    recs[0] += [x for x in extra[0] if x["action"] not in ("0F0", "0F1")]
    recs[1] += extra[1]
    meta = GPIPE_2X2 | {"replicas": 2}
    wild = hand_records([(2, "upper", layout(100, 40.0, 40.0))])  # replica 1 is never sampled
    trace = trace_from_records(meta, {**recs, (1, 0): wild[0], (1, 1): wild[1]})
    got = estimate_edge_delays(trace)
    assert got[("0F0", "1F0")] == pytest.approx(0.6) and got[("1B0", "0B0")] == pytest.approx(0.6)


def test_hosts_limit_samples_to_one_host() -> None:
    recs = hand_records([(2, "upper", layout(100, 0.5, 0.5))])
    one = estimate_edge_delays(trace_from_records(GPIPE_2X2 | {"hosts": ["a", "a"]}, recs))
    assert one == estimate_edge_delays(trace_from_records(GPIPE_2X2, recs))  # no hosts: one host
    two = estimate_edge_delays(trace_from_records(GPIPE_2X2 | {"hosts": ["a", "b"]}, recs))
    assert two == {e: 0.0 for e in one}  # no sample at all: every edge 0
    # 4 ranks on two hosts: the edge between hosts (rank 1 -> 2) gets the link value of the others.
    tr = timed_trace("GPipe", 4, 4, lambda es: {e: 0.25 for e in es}, hosts=["a", "a", "b", "b"])
    got = estimate_edge_delays(tr)
    assert got == pytest.approx({e: 0.25 for e in cross_rank_edges(build_dag(tr.meta))}, abs=1e-9)


def test_no_start_ms_means_no_delays_and_the_same_plan() -> None:
    tr = synthetic_trace("1F1B", 4, 8, jitter=0.05)
    assert estimate_edge_delays(tr) == {}
    with_comm, without = plan_from_trace(tr, 0.5), plan_from_trace(tr, 0.5, comm=False)
    assert "comm" not in with_comm.extra and with_comm.actions == without.actions
    assert with_comm.batch_time_ms == without.batch_time_ms


def test_pp1_has_no_cross_rank_edges() -> None:
    tr = timed_trace("1F1B", 1, 4, lambda es: {e: 1.0 for e in es})
    assert cross_rank_edges(build_dag(tr.meta)) == [] and estimate_edge_delays(tr) == {}


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_recovers_the_true_delays_of_a_simulated_run(schedule: str) -> None:
    """Actions start as early as the DAG with the true delays allows: every edge with an uncensored sample
    gets exactly its delay, every other edge one common link value within the range of the true ones."""
    rng = random.Random(len(schedule))
    pp = 3
    tr = timed_trace(
        schedule,
        pp,
        2 * pp,
        lambda es: {e: rng.uniform(0.1, 3.0) for e in es},
        stage_scale=[rng.uniform(0.5, 2.0) for _ in range(len(schedule_meta(schedule, pp, 2 * pp)["stage_to_rank"]))],
    )
    true = tr.true_delays  # type: ignore[attr-defined]
    got = estimate_edge_delays(tr)
    assert set(got) == set(true)
    exact = {e for e in got if got[e] == pytest.approx(true[e], abs=1e-9)}
    rest = {got[e] for e in set(got) - exact}
    assert exact and len({round(x, 9) for x in rest}) <= 1
    assert all(min(true.values()) <= x <= max(true.values()) for x in rest)


def test_uniform_delay_plans_like_the_true_delays(tmp_path) -> None:
    tr = timed_trace("1F1B", 4, 8, lambda es: {e: 2.0 for e in es})
    delays = estimate_edge_delays(tr)
    assert delays == pytest.approx(tr.true_delays, abs=1e-9)  # type: ignore[attr-defined]
    plan = plan_from_trace(tr, 0.5)
    assert plan.extra["comm"] == {"edges": len(delays), "median_ms": 2.0, "max_ms": 2.0}
    plain = plan_from_trace(tr, 0.5, comm=False)
    assert "comm" not in plain.extra
    # 1F1B with pp 4: the fill and drain cross 3 rank boundaries each way, every one 2 ms longer.
    assert plan.batch_time_ms["no_freeze"] >= plain.batch_time_ms["no_freeze"] + 6 * 2.0 - 1e-9
    w = {a: ap.w_max for a, ap in plan.actions.items()}
    assert plan.batch_time_ms["no_freeze"] == pytest.approx(simulate_batch(tr.meta, w, delays), rel=1e-12)
    from planner.plan import _abbrev, plan_summary

    critical = longest_path(build_dag(tr.meta), {a: ap.duration for a, ap in plan.actions.items()}, delays)[2]
    assert _abbrev(critical) in plan_summary(plan, tr.meta, delays)
    write_plan(plan, tmp_path / "plan.json")
    assert load_plan(tmp_path / "plan.json").extra["comm"] == plan.extra["comm"]
    root = write_trace(tr, tmp_path / "trace")  # start_ms round-trips through the files
    again = load_trace(root)
    assert [r.start_ms for r in again.records] == [r.start_ms for r in tr.records]
    assert estimate_edge_delays(again) == delays


def test_summarize_and_line() -> None:
    s = summarize({("a", "b"): 0.5, ("b", "c"): 0.25, ("c", "d"): 1.3})
    assert s == {"edges": 3, "median_ms": 0.5, "max_ms": 1.3}
    assert summary_line(s) == "communication: 3 cross-rank edges, median 0.5 ms, max 1.3 ms"
    assert summarize({}) == {"edges": 0, "median_ms": 0.0, "max_ms": 0.0}


# --- the longest path with delays ----------------------------------------------------------------------


def test_longest_path_with_delays_matches_networkx() -> None:
    meta = validate_meta(schedule_meta("Interleaved1F1B", 3, 6), "m")
    g = build_dag(meta)
    w = synthetic_weights(meta, seed=2)
    rng = random.Random(2)
    delays = {e: rng.uniform(0.0, 4.0) for e in cross_rank_edges(g)}
    t, starts, path = longest_path(g, w.w_max, delays)
    h = nx.DiGraph()
    for u, v in g.edges:
        h.add_edge(u, v, weight=w.w_max.get(u, 0.0) + delays.get((u, v), 0.0))
    assert t == pytest.approx(nx.dag_longest_path_length(h))
    assert t == pytest.approx(sum(w.w_max[a] for a in path) + sum(delays.get(e, 0.0) for e in zip(path, path[1:])))
    for a, b in zip(path, path[1:]):
        assert starts[b] == pytest.approx(starts[a] + w.w_max[a] + delays.get((a, b), 0.0))
    assert longest_path(g, w.w_max, {}) == longest_path(g, w.w_max) == longest_path(g, w.w_max, None)


@pytest.mark.parametrize(
    "bad,msg",
    [
        ({("0F0", "2F0"): 1.0}, "not an edge of the DAG"),
        ({("0F0", "9F9"): 1.0}, "not an edge between two actions"),
        ({(SOURCE, "0F0"): 1.0}, "not an edge between two actions"),
        ({("0F0", "1F0"): -1.0}, ">= 0"),
        ({("0F0", "1F0"): math.nan}, ">= 0"),
        ({("0F0", "1F0"): "1"}, ">= 0"),
    ],
)
def test_bad_delays_are_one_line_errors(bad, msg: str) -> None:
    meta = validate_meta(schedule_meta("GPipe", 3, 2), "m")
    g = build_dag(meta)
    w = synthetic_weights(meta)
    with pytest.raises(PlannerError, match=msg):
        longest_path(g, w.w_max, bad)
    with pytest.raises(PlannerError, match=msg):
        solve_freeze_lp(g, w, 0.5, edge_ms=bad)


# --- the freeze LP with delays --------------------------------------------------------------------------


def reference_lp(dag: nx.DiGraph, w: NodeWeights, r_max: float, delays: dict) -> tuple[float, float]:
    """Plain LP, no reductions: one variable per start and per freeze ratio, one row per DAG edge
    (``s_u + w_max_u - delta_u r_u + c_uv <= s_v``), one budget row per stage.  Returns ``T*`` and the
    least total freezing at ``T <= T*``."""
    nodes = list(dag.nodes)
    idx = {a: i for i, a in enumerate(nodes)}
    n = len(nodes)
    frz = sorted(w.freezable)
    ridx = {a: n + j for j, a in enumerate(frz)}
    nv = n + len(frz)
    rows, rhs = [], []
    for u, v in dag.edges:
        r = np.zeros(nv)
        r[idx[u]] += 1
        r[idx[v]] -= 1
        const = delays.get((u, v), 0.0)
        if u not in (SOURCE, SINK):
            const += w.w_max[u]
            if u in ridx:
                r[ridx[u]] = -(w.w_max[u] - w.w_min[u])
        rows.append(r)
        rhs.append(-const)
    by_stage: dict[int, list[str]] = {}
    for a in frz:
        by_stage.setdefault(dag.nodes[a]["stage"], []).append(a)
    for acts in by_stage.values():
        r = np.zeros(nv)
        r[[ridx[a] for a in acts]] = 1.0
        rows.append(r)
        rhs.append(r_max * len(acts))
    bounds = [(0, None)] * n + [(0, 1)] * len(frz)
    bounds[idx[SOURCE]] = (0, 0)
    a_ub, b_ub = np.array(rows), np.array(rhs)
    c1 = np.zeros(nv)
    c1[idx[SINK]] = 1
    r1 = linprog(c1, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
    assert r1.status == 0
    bounds[idx[SINK]] = (0, r1.fun)
    c2 = np.zeros(nv)
    c2[n:] = 1
    r2 = linprog(c2, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
    assert r2.status == 0
    return r1.fun, r2.fun


def lp_case(seed: int) -> tuple[TraceMeta, nx.DiGraph, NodeWeights, float, dict]:
    rng = random.Random(seed)
    schedule = SCHEDULES[seed % len(SCHEDULES)]
    pp = rng.randint(2, 4)
    meta = validate_meta(schedule_meta(schedule, pp, pp * rng.randint(1, 2)), "m")
    g = build_dag(meta)
    w = synthetic_weights(meta, seed=seed, lower_frac=(0.0, 1.0), jitter=0.5)
    scale = rng.choice([0.5, 3.0, 15.0])  # small to larger than an action
    delays = {e: rng.choice([0.0, rng.uniform(0.0, scale)]) for e in cross_rank_edges(g)}
    return meta, g, w, [0.2, 0.5, 0.8, 1.0][seed % 4], delays


def total_freezing(sol, w: NodeWeights) -> float:
    return sum((w.w_max[a] - d) / (w.w_max[a] - w.w_min[a]) for a, d in sol.durations.items() if a in w.freezable)


@pytest.mark.parametrize("seed", range(16))
def test_lp_with_delays_is_exact(seed: int, monkeypatch) -> None:
    """(a) the LP's batch time is the longest path of its durations with the delays; (b) it and the least
    freezing equal the plain reference LP's; (c) whole, region (forced) and the non-face stage 2 agree."""
    import planner.lp.region as lp_region

    monkeypatch.setattr(lp_region, "_REGION_MAX_FRACTION", 1.0)  # no fallback: the region loop runs
    _, g, w, r_max, delays = lp_case(seed)
    whole = solve_freeze_lp(g, w, r_max, solver="whole", edge_ms=delays)
    assert whole.makespan == pytest.approx(longest_path(g, whole.durations, delays)[0], rel=1e-6)
    assert whole.starts == longest_path(g, whole.durations, delays)[1]
    t_star, least = reference_lp(g, w, r_max, delays)
    assert whole.makespan == pytest.approx(t_star, rel=1e-6, abs=1e-6)
    assert total_freezing(whole, w) == pytest.approx(least, rel=1e-6, abs=1e-6)
    stats: dict = {}
    region = solve_freeze_lp(g, w, r_max, solver="region", edge_ms=delays, stats=stats)
    if any(w.w_max[a] > w.w_min[a] for a in w.freezable):
        assert region.solver == "highs-region"
    assert region.makespan == pytest.approx(whole.makespan, rel=1e-6, abs=1e-6)
    assert total_freezing(region, w) == pytest.approx(least, rel=1e-6, abs=1e-6)
    fresh = solve_freeze_lp(g, w, r_max, solver="whole", edge_ms=delays, _config="dual")  # pruned stage 2
    assert fresh.makespan == pytest.approx(t_star, rel=1e-6, abs=1e-6)
    assert total_freezing(fresh, w) == pytest.approx(least, rel=1e-5, abs=1e-5)
    assert solve_freeze_lp(g, w, r_max, solver="auto", edge_ms=delays).makespan == whole.makespan


def test_lp_with_delays_on_same_rank_edges_is_exact() -> None:
    """Delays are allowed on any edge between actions: a same-rank edge with a delay is not implied by the
    rank chain, so the model keeps it (the estimator never puts one there)."""
    for seed in range(4):
        _, g, w, r_max, delays = lp_case(seed)
        rng = random.Random(seed)
        same = [
            (u, v)
            for u, v in g.edges
            if u not in (SOURCE, SINK) and v not in (SOURCE, SINK) and g.nodes[u]["rank"] == g.nodes[v]["rank"]
        ]
        delays |= {e: rng.uniform(0.0, 20.0) for e in rng.sample(same, min(6, len(same)))}
        sol = solve_freeze_lp(g, w, r_max, solver="whole", edge_ms=delays)
        t_star, least = reference_lp(g, w, r_max, delays)
        assert sol.makespan == pytest.approx(t_star, rel=1e-6, abs=1e-6)
        assert total_freezing(sol, w) == pytest.approx(least, rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("seed", range(8))
def test_no_delays_is_bit_for_bit_the_delay_free_solve(seed: int) -> None:
    """(d) ``edge_ms`` None or {} changes nothing, to the bit."""
    meta, g, w, r_max, _ = lp_case(seed)
    for solver in ("whole", "region"):
        ref = solve_freeze_lp(g, w, r_max, solver=solver)
        for none in (None, {}):
            sol = solve_freeze_lp(g, w, r_max, solver=solver, edge_ms=none)
            assert (sol.durations, sol.starts, sol.makespan, sol.solver) == (
                ref.durations,
                ref.starts,
                ref.makespan,
                ref.solver,
            )
    a, b = make_plan(meta, w, r_max), make_plan(meta, w, r_max, edge_ms={})
    for p in (a, b):
        p.solver.pop("seconds")
    assert json.dumps(a.to_json()) == json.dumps(b.to_json())


def test_make_plan_with_delays() -> None:
    meta, g, w, r_max, delays = lp_case(3)
    plan = make_plan(meta, w, r_max, edge_ms=delays)
    plain = make_plan(meta, w, r_max)
    assert plan.extra["comm"] == summarize(delays) and "comm" not in plain.extra
    bt = plan.batch_time_ms
    assert bt["no_freeze"] == longest_path(g, w.w_max, delays)[0]
    assert bt["all_frozen"] == longest_path(g, w.w_min, delays)[0]
    assert bt["all_frozen"] - 1e-9 <= bt["planned"] <= bt["no_freeze"] + 1e-9
    assert bt["planned"] >= plain.batch_time_ms["planned"] - 1e-9
    durs = {a: ap.duration for a, ap in plan.actions.items()}
    t, starts, _ = longest_path(g, durs, delays)
    assert t == pytest.approx(bt["planned"], rel=1e-6)
    assert all(plan.actions[a].start == pytest.approx(starts[a]) for a in plan.actions)
