"""DualPipeV's ``OVERLAP_F_B`` pairs through the planner and the runtime's profiler, without torchrun.

A pair (``(0F3;3B1)OVERLAP_F_B``: forward of stage 0 microbatch 3 and full backward of stage 3
microbatch 1, one schedule action) is one action everywhere: one name, one DAG node with the edges of both
parts, one trace record, one planned freeze ratio, which applies to its backward part. The orders
themselves are checked against torch in ``tests/test_schedules.py``, gradient exactness in
``tests/test_freezing_exact.py``, a real run in ``tests/test_runtime_torchrun.py``.
"""

from __future__ import annotations

import random

import pytest

from planner.errors import PlannerError
from planner.plan import plan_from_trace, stage_mean_ratios
from planner.schedule.actions import FREEZABLE_KINDS, PAIR, Action, action_kind, pair_action, parse_action, part_owners
from planner.schedule.dag import build_dag
from planner.schedule.orders import rank_orders, schedule_meta
from planner.timing.comm import cross_rank_edges, estimate_edge_delays
from planner.trace.load import node_weights, validate_meta
from planner.trace.simulate import model_ms, simulate_batch, synthetic_trace
from tests.test_comm import timed_trace
from timelyfreeze.hooks import profiler as profiler_mod
from timelyfreeze.hooks.profiler import ActionProfiler

PAIR_NAME = "(0F3;3B1)OVERLAP_F_B"


def test_pair_names_parse_and_print_as_torch_spells_them():
    act = parse_action(PAIR_NAME)
    assert act == pair_action(0, 3, 3, 1) == Action(3, PAIR, 1, (0, 3))
    assert (act.stage, act.kind, act.microbatch) == (3, PAIR, 1)  # the backward part's: it carries the ratio
    assert str(act) == PAIR_NAME and action_kind(PAIR_NAME) == PAIR and PAIR in FREEZABLE_KINDS
    assert [str(p) for p in act.parts] == ["0F3", "3B1"]
    assert parse_action("2B5").parts == (Action(2, "B", 5),)
    for bad in (
        "(0F3;3I1)OVERLAP_F_B",
        "(0B3;3F1)OVERLAP_F_B",
        "(0F3,3B1)OVERLAP_F_B",
        "(0F3;3B1)",
        "3OVERLAP_F_B1",
        "(0F3;3B1)OVERLAP_F_B ",
        "2X5",
        7,
    ):
        with pytest.raises(ValueError, match="not an action name"):
            parse_action(bad)
        with pytest.raises(ValueError, match="not an action name"):
            action_kind(bad)
    assert part_owners(["0F0", PAIR_NAME, "3B2"]) == {"0F3": PAIR_NAME, "3B1": PAIR_NAME}


def test_meta_validation_counts_a_pairs_parts():
    meta = schedule_meta("DualPipeV", 2, 4)
    assert validate_meta(meta, "m").schedule == "DualPipeV"
    # the pair's forward part on a stage of another rank
    bad = dict(meta, rank_orders=dict(meta["rank_orders"]))
    bad["rank_orders"]["0"] = [a.replace("(0F3;3B1)", "(1F3;3B1)") for a in meta["rank_orders"]["0"]]
    with pytest.raises(PlannerError, match=r"is on rank 0, but stage_to_rank\[1\] = 1"):
        validate_meta(bad, "m")
    # a forward listed both inside a pair and on its own
    bad["rank_orders"]["0"] = meta["rank_orders"]["0"] + ["0F3"]
    with pytest.raises(PlannerError, match="stage 0 microbatch 3 must have F and B .* has 0F3, 0F3, 0I3, 0W3"):
        validate_meta(bad, "m")
    # microbatch out of range in the forward part
    bad["rank_orders"]["0"] = [a.replace("(0F3;", "(0F9;") for a in meta["rank_orders"]["0"]]
    with pytest.raises(PlannerError, match="has microbatch 9, but num_microbatches=4"):
        validate_meta(bad, "m")


def test_dag_gives_a_pair_the_edges_of_both_parts():
    meta = validate_meta(schedule_meta("DualPipeV", 2, 4), "m")
    g = build_dag(meta)
    pair = "(1F3;2B1)OVERLAP_F_B"  # rank 1
    assert g.nodes[pair] == {"stage": 2, "kind": PAIR, "microbatch": 1, "rank": 1}
    assert set(g.pred[pair]) == {
        "(0F3;3B1)OVERLAP_F_B",  # rank 0's pair: 0F3 feeds the forward part 1F3, 3B1 the backward part 2B1
        "2F1",  # the forward of the backward part's microbatch
        "(2F2;1B0)OVERLAP_F_B",  # the rank's previous action
    }
    assert set(g.succ[pair]) == {
        "(2F3;1B1)OVERLAP_F_B",  # next on the rank; also 1F3 -> 2F3 and 2B1 -> 1B1
        "1I3",  # the backward of the forward part's microbatch (1F3 -> 1I3)
    }
    assert "1F3" not in g and "2B1" not in g  # a part is no node of its own
    assert all(u != v for u, v in g.edges)


def test_pair_freezes_through_its_backward_part_in_the_plan():
    """Synthetic DualPipeV: a pair takes F + B, freezing shrinks its B part only; the LP plans pairs like any
    freezable action and a stage's budget counts its pairs by their backward stage."""
    tr = synthetic_trace("DualPipeV", 2, 8, stage_scale=[1.0, 1.5, 0.8, 1.2])
    w = node_weights(tr)
    common = dict(f_ms=1.0, b_ms=2.0, w_share=0.5, lower_share=0.3)
    assert w.w_max[PAIR_NAME] == pytest.approx(
        model_ms("0F3", **common, scale=1.0, freeze_ratio=0) + model_ms("3B1", **common, scale=1.2, freeze_ratio=0)
    )
    assert w.w_max[PAIR_NAME] - w.w_min[PAIR_NAME] == pytest.approx(w.w_max["3B6"] - w.w_min["3B6"])
    plan = plan_from_trace(tr, 0.5)
    pairs = [a for a in plan.actions if parse_action(a).kind == PAIR]
    assert len(pairs) >= 8 and any(plan.actions[a].freeze_ratio > 0 for a in pairs)
    assert all(m <= 0.5 + 1e-6 for m in stage_mean_ratios(plan).values())
    # every (stage, microbatch) has exactly one freezable action: B, W or a pair's backward part
    owners = [
        (parse_action(a).stage, parse_action(a).microbatch)
        for a in plan.actions
        if parse_action(a).kind in FREEZABLE_KINDS
    ]
    assert sorted(owners) == [(s, m) for s in range(4) for m in range(8)]
    durations = {a: ap.duration for a, ap in plan.actions.items()}
    assert simulate_batch(tr.meta, durations) == pytest.approx(plan.batch_time_ms["planned"], rel=1e-9)


def test_comm_delays_of_a_simulated_dualpipev_run():
    """The estimation rule on a DualPipeV run simulated with known delays: exact where observed, one link
    value elsewhere (as for the other schedules in ``tests/test_comm.py``)."""
    rng = random.Random(5)
    tr = timed_trace(
        "DualPipeV",
        3,
        6,
        lambda es: {e: rng.uniform(0.1, 3.0) for e in es},
        stage_scale=[rng.uniform(0.5, 2.0) for _ in range(6)],
    )
    true = tr.true_delays  # type: ignore[attr-defined]
    got = estimate_edge_delays(tr)
    assert set(got) == set(true)
    exact = {e for e in got if got[e] == pytest.approx(true[e], abs=1e-9)}
    rest = {round(got[e], 9) for e in set(got) - exact}
    assert exact and len(rest) <= 1
    assert all(min(true.values()) <= x <= max(true.values()) for x in rest)


def test_comm_sample_waits_for_a_pairs_other_cross_rank_predecessor():
    """A pair is fed from another rank for each of its parts. When its forward part's input (0F4) ended
    before its backward part's (5I1), the pair's start says nothing about 0F4's link: no sample (taking
    one would give that edge about 7 ms here instead of the 0.5 ms every edge has)."""
    pair = "(1F4;4B1)OVERLAP_F_B"
    tr = timed_trace("DualPipeV", 3, 6, lambda es: {e: 0.5 for e in es})
    g = build_dag(tr.meta)
    assert sorted(u for u, v in cross_rank_edges(g) if v == pair) == ["0F4", "5I1"]
    order = tr.meta.rank_orders[1]
    before = order[order.index(pair) - 1]
    for rec in tr.records:  # the pair's rank is free early: only its inputs can hold it
        if rec.action == before:
            rec.start_ms -= 20.0
    got = estimate_edge_delays(tr)
    assert got[("0F4", pair)] == pytest.approx(0.5, abs=0.2)


def profiled(monkeypatch, calls: list[tuple[str, int, str, int]]) -> list[tuple[str, float, float | None]]:
    """Feed ``(event, stage, kind, microbatch)`` calls to a pair-aware profiler whose clock reads 0, 1, 2, ...
    ms at successive events; its records."""
    prof = ActionProfiler(0, use_cuda=False, pairs=part_owners([PAIR_NAME]))
    ticks = iter(range(100))
    monkeypatch.setattr(profiler_mod.time, "perf_counter", lambda: next(ticks) / 1e3)
    for event, *key in calls:
        getattr(prof, f"{event}_action")(*key)
    assert prof.order == [PAIR_NAME]
    return prof.collect()


def test_profiler_times_a_pair_run_part_by_part(monkeypatch):
    """torch's own loop: F [0, 1] ms, then B [2, 3] ms (its receive between them is no compute)."""
    calls = [("before", 0, "F", 3), ("after", 0, "F", 3), ("before", 3, "B", 1), ("after", 3, "B", 1)]
    assert profiled(monkeypatch, calls) == [(PAIR_NAME, pytest.approx(2.0), 0.0)]


def test_profiler_times_a_pair_run_in_two_threads(monkeypatch):
    """TorchTitan's overlap callback: B [0, 2] ms in a thread beside F [1, 3] ms: the span, 3 ms."""
    calls = [("before", 3, "B", 1), ("before", 0, "F", 3), ("after", 3, "B", 1), ("after", 0, "F", 3)]
    assert profiled(monkeypatch, calls) == [(PAIR_NAME, pytest.approx(3.0), 0.0)]


def test_union_of_intervals():
    assert profiler_mod._union([(1.0, 2.0)]) == 1.0
    assert profiler_mod._union([(0.0, 1.0), (1.5, 3.5)]) == 3.0
    assert profiler_mod._union([(1.0, 3.0), (0.0, 2.0)]) == 3.0
    assert profiler_mod._union([(0.0, 4.0), (1.0, 2.0)]) == 4.0


def test_orders_of_every_size_build_acyclic_dags():
    for pp in (1, 2, 3, 4):
        for n in (2 * pp, 2 * pp + 1, 3 * pp + 2):
            meta = validate_meta(schedule_meta("DualPipeV", pp, n), "m")
            build_dag(meta)  # raises on a cycle
            assert sum(PAIR in a for o in rank_orders("DualPipeV", pp, n).values() for a in o) > 0
