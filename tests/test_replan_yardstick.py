"""Re-planning that holds still on a noisy host (issue 40 item 1), with synthetic scales only: each pipeline
rank is its own yardstick (its F/I groups' scale), a rank's speed change against the others re-plans only when
it holds beyond the monitoring windows' swings in every step of the window (``planner.timing.drift``,
``planner.timing.monitor.rank_noise``, ``timelyfreeze.plan.replan``)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from planner.timing import drift, monitor
from planner.trace.load import Trace
from planner.trace.simulate import synthetic_trace
from tests.test_replan import as_lists, setup
from timelyfreeze.plan.replan import Replanner
from timelyfreeze.runtime import state_codec

ONE = {"0F": 1.0, "0B": 1.0, "1F": 1.0, "1B": 1.0}


def replanner(schedule: str = "1F1B", rank_noise: dict | None = None, noise: dict | None = None) -> Replanner:
    meta, weights, plan, ratios = setup(schedule)
    rp = Replanner(meta, threshold=0.05, patience=3, noise_k=3.0)
    rp.install(as_lists(weights), ratios, plan.batch_time_ms, noise=noise, rank_noise=rank_noise)
    return rp


def rank_scaled(scales: dict[str, float], rank_of: dict[str, int], factor: dict[int, float]) -> dict[str, float]:
    """``scales`` with every group of rank ``r`` times ``factor[r]`` (a core's slowdown: all its actions alike)."""
    return {g: s * factor.get(rank_of[g], 1.0) for g, s in scales.items()}


def test_rank_factors_and_corrected_scales_use_each_ranks_own_f_and_i():
    meta, _, _, _ = setup("ZBVZeroBubble")
    ranks = drift.group_ranks(meta)
    assert ranks["0F"] == ranks["3W"] == 0 and ranks["1I"] == ranks["2F"] == 1  # the V: stages 0, 3 on rank 0
    scales = {"0F": 1.2, "0I": 1.2, "3F": 1.2, "3I": 1.2, "0W": 1.5, "1F": 0.9, "1I": 0.9, "2F": 0.9, "2I": 0.9}
    assert drift.rank_factors(scales, ranks) == {0: pytest.approx(1.2), 1: pytest.approx(0.9)}
    corrected = drift.corrected_scales(scales, ranks)
    assert corrected["0W"] == pytest.approx(1.25) and corrected["2F"] == pytest.approx(1.0)
    assert drift.rank_speeds({0: 1.2, 1: 0.9}) == {0: pytest.approx(1.2 / 0.9), 1: pytest.approx(0.9 / 1.2)}
    assert drift.rank_speeds({0: 1.2}) == {}
    # three ranks: each against the median of the other two
    assert drift.rank_speeds({0: 1.0, 1: 2.0, 2: 3.0})[1] == pytest.approx(1.0)


@pytest.mark.parametrize("schedule", ["1F1B", "ZBVZeroBubble"])
def test_a_stage_wide_swing_of_20_percent_does_not_replan(schedule):
    rp = replanner(schedule)
    groups = {drift.group_of(a): 1.0 for a in rp.weights.w_max}
    for k in range(12):  # rank 1's core comes and goes: +20 %, -20 %, +20 %, ... every action of the rank alike
        rp.observe(rank_scaled(groups, rp.ranks, {1: 1.2 if k % 2 == 0 else 0.8}))
        verdict = rp.assess()
        assert verdict is None or (not rp.due() and verdict["moved"] == {} and verdict["ranks_moved"] == {})
    # held +20 % for a whole window against the monitoring windows' swings of that size: still no re-plan
    rp = replanner(schedule, rank_noise={0: 0.1, 1: 0.1})  # limit 3 x 10 % = 30 %
    for _ in range(3):
        rp.observe(rank_scaled(groups, rp.ranks, {1: 1.2}))
    assert not rp.due() and rp.assess()["factors"][1] == pytest.approx(1.2)


@pytest.mark.parametrize("schedule", ["1F1B", "ZBVZeroBubble"])
def test_two_ranks_swinging_in_opposite_directions_do_not_replan(schedule):
    rp = replanner(schedule)
    groups = {drift.group_of(a): 1.0 for a in rp.weights.w_max}
    for k in range(12):
        up = 1.2 if k % 2 == 0 else 0.8
        rp.observe(rank_scaled(groups, rp.ranks, {0: up, 1: 2.0 - up}))
        assert not rp.due()
    # and within the monitoring windows' swing, the same held for a whole window
    rp = replanner(schedule, rank_noise={0: 0.2, 1: 0.2})
    for _ in range(3):
        rp.observe(rank_scaled(groups, rp.ranks, {0: 1.2, 1: 0.8}))
    assert not rp.due()


def test_a_b_only_change_of_30_percent_on_one_stage_replans():
    rp = replanner(noise={g: 0.02 for g in ONE})
    for k in range(3):  # on a machine whose rank 1 also swings by 20 %: the yardstick takes it out
        f = 1.2 if k % 2 == 0 else 1.0
        rp.observe({"0F": 1.0, "0B": 1.0, "1F": f, "1B": 1.3 * f})
    verdict = rp.assess()
    assert rp.due() and verdict["moved"] == {"1B": pytest.approx(1.3)} and verdict["ranks_moved"] == {}
    assert rp.reason().startswith("1B x1.30 (limit 6%) against the machine factor x1.20 of rank 1")
    _, scales = rp.proposed_weights()  # the re-plan starts from the measured scales, the rank's speed included
    assert scales["1B"] == pytest.approx(1.56) and scales["1F"] == pytest.approx(1.2)


def test_a_group_swinging_against_its_rank_from_step_to_step_does_not_replan():
    # a co-tenant switching on in the middle of a step slows rank 1's later actions (more B than F), and
    # switching off the other way: each step's corrected 1B is far from 1, never on one side for a whole window
    rp = replanner(noise={g: 0.01 for g in ONE}, rank_noise={0: 0.2, 1: 0.2})  # rank 1 x1.5 within its swings
    for k in range(12):
        rp.observe({**ONE, "1F": 1.5, "1B": 1.5 * (1.3, 1.0, 0.7)[k % 3]})
        assert not rp.due()
    for _ in range(3):
        rp.observe({**ONE, "1F": 1.5, "1B": 1.5 * 1.3})
    assert rp.due() and rp.assess()["moved"] == {"1B": pytest.approx(1.3)}  # held in every step: a change


def test_a_rank_slowed_in_every_step_beyond_its_swings_replans():
    rp = replanner(rank_noise={0: 0.01, 1: 0.01})  # quiet monitoring windows: limit max(3 %, 5 %) = 5 %
    for k in range(2):
        rp.observe(rank_scaled(ONE, rp.ranks, {1: 2.0}))
    assert rp.assess() is None
    rp.observe(rank_scaled(ONE, rp.ranks, {1: 1.9}))
    verdict = rp.assess()
    assert rp.due() and verdict["moved"] == {} and set(verdict["ranks_moved"]) == {0, 1}
    assert verdict["ranks_moved"][1] == pytest.approx(2.0) and verdict["ranks_moved"][0] == pytest.approx(0.5)
    assert "rank 1 x2.00 against the other ranks (limit 5%, in every step)" in rp.reason()
    assert rp.rescale(9) is None  # a re-plan is due: no rescale
    # one step of the window back at the others' speed: not every step beyond the limit, no re-plan
    rp.observe(ONE)
    assert not rp.due()


def test_a_rank_slowed_alone_rescales_the_prediction_through_the_dag():
    _, _, plan, _ = setup()
    rp = replanner(rank_noise={0: 0.2, 1: 0.2})  # a noisy host: 60 % swings seen in monitoring
    for _ in range(3):
        rp.observe(rank_scaled(ONE, rp.ranks, {1: 1.3}))
    verdict = rp.assess()
    assert not rp.due()
    per_group = {g: 1.3 if rp.ranks[g] == 1 else 1.0 for g in ONE}
    expected = 1.0 + drift.drift(rp._dag, rp.weights, rp.ratios, per_group)
    assert verdict["machine"] == pytest.approx(expected) and 1.0 < expected <= 1.3 + 1e-12
    event = rp.rescale(20)
    assert event["machine_factor"] == pytest.approx(expected)
    assert rp.predicted_ms() == pytest.approx(expected * plan.batch_time_ms["planned"])


def test_rank_noise_is_the_rms_swing_of_a_ranks_speed_in_the_monitoring_windows():
    quiet = synthetic_trace("1F1B", 2, 4, steps=4)
    assert monitor.rank_noise(quiet) == {0: 0.0, 1: 0.0}
    # every action of a step 30 % slower (the machine): no rank swings against the other
    recs = [replace(r, ms=r.ms * 1.3) if r.step == 2 else r for r in quiet.records]
    assert monitor.rank_noise(Trace(quiet.meta, recs, "t")) == {0: 0.0, 1: 0.0}
    # rank 1 twice as slow in one step of eight (a co-tenant on its core): v_1 = 1.0 in that step, 0 elsewhere
    steps = sorted({(r.phase, r.step) for r in quiet.records if r.phase in ("upper", "lower")})
    assert len(steps) == 8
    one = steps[1]
    recs = [replace(r, ms=r.ms * 2.0) if (r.phase, r.step) == one and r.rank == 1 else r for r in quiet.records]
    trace = Trace(quiet.meta, recs, "t")
    noise = monitor.rank_noise(trace)
    assert noise == {0: pytest.approx(0.5 * math.sqrt(1 / 8)), 1: pytest.approx(math.sqrt(1 / 8))}
    assert 3.0 * noise[1] > 1.0  # the limit it gives covers the swing seen once
    # the groups' floors against their rank's own F do not move: every action of the rank slowed alike
    assert set(monitor.noise_floors(trace).values()) == {0.0}
    summary = monitor.monitoring_summary(trace, True)["rank_noise"]
    assert summary == {str(r): pytest.approx(v, abs=1e-6) for r, v in noise.items()}


def test_rank_noise_travels_with_the_state_and_older_states_load():
    rp = replanner(rank_noise={"0": 0.1, "1": 0.2})
    assert rp.rank_noise == {0: 0.1, 1: 0.2} and rp.rank_limit(1) == pytest.approx(0.6)
    st = state_codec.decode(state_codec.encode(rp.state_dict()))
    again = Replanner(rp.meta, 0.05, 3)
    again.load_state_dict(st)
    assert again.rank_noise == {0: 0.1, 1: 0.2} and again.state_dict() == rp.state_dict()
    older = {k: v for k, v in st.items() if k != "rank_noise"}
    Replanner(rp.meta, 0.05, 3).load_state_dict(older)
    with pytest.raises(ValueError, match="rank_noise"):
        Replanner(rp.meta, 0.05, 3).load_state_dict(dict(st, rank_noise={"x": 0.1}))
