"""Online re-planning without torch: ``planner.timing.drift`` (scales, drift, rescaled weights) and
``timelyfreeze.plan.replan.Replanner`` (when a re-plan is due, what it starts from, its checkpointed state)."""

from __future__ import annotations

import pytest

from planner.plan import make_plan
from planner.schedule.dag import build_dag
from planner.schedule.orders import schedule_meta
from planner.timing import drift
from planner.trace.load import NodeWeights, validate_meta
from planner.trace.synthetic import synthetic_weights
from timelyfreeze.config.freeze import Freeze, FreezeConfigError, validate
from timelyfreeze.outputs.summary import build, format_summary
from timelyfreeze.plan.replan import Replanner, mean_ratio, takes_effect
from timelyfreeze.runtime import state as freeze_state
from timelyfreeze.runtime import state_codec


def setup(schedule: str = "1F1B", pp: int = 2, n: int = 4):
    meta = validate_meta(schedule_meta(schedule, pp, n), "meta")
    weights = synthetic_weights(meta, seed=1)
    plan = make_plan(meta, weights, 0.8)
    ratios = {a: ap.freeze_ratio for a, ap in plan.actions.items()}
    return meta, weights, plan, ratios


def as_lists(w: NodeWeights) -> dict:
    return {a: [w.w_min[a], w.w_max[a]] for a in w.w_max}


def test_group_and_expected_time():
    w = NodeWeights({"1B7": 4.0, "0F0": 3.0}, {"1B7": 10.0, "0F0": 3.0})
    assert drift.group_of("1B7") == "1B" and drift.group_of("12W3") == "12W"
    assert drift.expected_ms(w, "1B7", 0.5) == 7.0
    assert drift.expected_ms(w, "1B7", 1.5) == 4.0 and drift.expected_ms(w, "1B7", -1) == 10.0


def test_step_scales_are_medians_per_group():
    w = NodeWeights(
        {"0B0": 5.0, "0B1": 5.0, "0B2": 5.0, "0F0": 2.0}, {"0B0": 10.0, "0B1": 10.0, "0B2": 10.0, "0F0": 2.0}
    )
    samples = [("0B0", 10.0, 0.0), ("0B1", 15.0, 0.0), ("0B2", 5.5, 1.0), ("0F0", 3.0, 0.0), ("9X9", 1.0, 0.0)]
    assert drift.step_scales(samples, w) == {"0B": pytest.approx(1.1), "0F": pytest.approx(1.5)}
    assert drift.max_scales([{"0B": 1.2}, None, {"0B": 0.9, "1F": 2.0}]) == {"0B": 1.2, "1F": 2.0}
    assert drift.window_scales([{"0B": 1.0}, {"0B": 3.0, "1F": 2.0}, {"0B": 2.0}]) == {"0B": 2.0, "1F": 2.0}


def test_step_scales_through_kept_bounds_are_the_definition():
    """``step_scales`` with ``action_bounds`` (the re-planner keeps them per plan) gives the same floats as
    ``measured / expected_ms`` per sample, medians per group: ratios inside, on and outside [0, 1], NaN included."""
    import math
    import random
    import statistics

    rng = random.Random(7)
    _, weights, _, _ = setup("ZBVZeroBubble", 2, 4)
    bounds = drift.action_bounds(weights)
    for _ in range(200):
        samples = []
        for a in weights.w_max:
            ratio = rng.choice([0.0, 1.0, rng.random(), rng.uniform(-1, 2), math.nan, 1])
            samples.append((a, rng.uniform(0.1, 20.0), ratio))
        expect: dict[str, list[float]] = {}
        for a, ms, ratio in samples:
            e = drift.expected_ms(weights, a, ratio)
            if e > 0:
                expect.setdefault(drift.group_of(a), []).append(ms / e)
        want = {g: float(statistics.median(v)) for g, v in sorted(expect.items())}
        assert drift.step_scales(samples, weights, bounds) == want
        assert drift.step_scales(samples, weights) == want


def test_drift_is_zero_at_unit_scales_and_homogeneous():
    meta, weights, _, ratios = setup()
    dag = build_dag(meta)
    groups = {drift.group_of(a) for a in weights.w_max}
    assert drift.drift(dag, weights, ratios, {g: 1.0 for g in groups}) == pytest.approx(0.0, abs=1e-12)
    assert drift.drift(dag, weights, ratios, {g: 1.3 for g in groups}) == pytest.approx(0.3)
    # one slowed group moves the batch by at most its own scale
    d = drift.drift(dag, weights, ratios, {"1F": 2.0})
    assert 0.0 < d <= 1.0 + 1e-12


def test_scaled_weights_scale_both_bounds_of_a_group():
    meta, weights, _, _ = setup()
    sw = drift.scaled_weights(weights, {"1B": 2.0})
    for a in weights.w_max:
        k = 2.0 if a.startswith("1B") else 1.0
        assert sw.w_max[a] == weights.w_max[a] * k and sw.w_min[a] == weights.w_min[a] * k


def test_a_stable_steps_factors_are_computed_once_and_match_the_ones_made_from_its_scales():
    """``observe_step`` hands the step's machine and rank factors to the drift check and keeps the window entry's
    corrected scales and rank speeds made from them: the same as computing each from the scales, and the same as an
    entry restored from a checkpoint (without them) gets."""
    meta, weights, plan, ratios = setup()
    rp = Replanner(meta, threshold=0.1, patience=2)
    early = rp.observe_step({"1F": 3.0})  # no plan yet: the factors, no drift, the window untouched
    assert early.drift is None and not rp.window
    assert early.machine_factor == 3.0 and early.rank_factors == drift.rank_factors({"1F": 3.0}, rp.ranks)
    rp.install(as_lists(weights), ratios, plan.batch_time_ms)
    for scales in ({"0F": 1.1, "0B": 1.3, "1F": 0.9, "1B": 1.2}, {"0B": 1.3, "1B": 1.2}, {"1F": 1.05, "0B": 0.8}):
        seen = rp.observe_step(scales)
        assert seen.drift == drift.drift(build_dag(meta), weights, ratios, scales)
        assert seen.machine_factor == drift.machine_factor(scales)
        assert seen.rank_factors == drift.rank_factors(scales, rp.ranks)
        entry = rp.window[-1]
        factors = drift.rank_factors(scales, rp.ranks)
        assert entry["relative"] == (drift.corrected_scales(scales, rp.ranks), drift.rank_speeds(factors))
        assert rp._relative({"drift": entry["drift"], "scales": entry["scales"]}) == entry["relative"]


def test_replanner_replans_when_a_group_changes_relative_to_the_machine_over_the_window():
    meta, weights, plan, ratios = setup()
    rp = Replanner(meta, threshold=0.1, patience=3)
    assert rp.observe({"1F": 3.0}) is None and not rp.due()  # no plan yet
    rp.install(as_lists(weights), ratios, plan.batch_time_ms)
    same = {"0F": 1.0, "0B": 1.0, "1F": 1.0, "1B": 1.0}
    step = {**same, "1F": 1.02}
    assert rp.observe(step) == pytest.approx(drift.drift(build_dag(meta), weights, ratios, step))
    rp.observe({**same, "1B": 1.5})  # stage 1's backwards 50 % slower, the machine (F) unchanged
    assert not rp.due() and rp.assess() is None  # two steps only
    rp.observe(same)  # 1B: median of 1.0, 1.5, 1.0 -- one slow step does not re-plan
    assert not rp.due()
    rp.observe({**same, "1B": 1.7})  # 1.5, 1.0, 1.7: the quiet step holds it back (beyond in every step)
    assert not rp.due()
    rp.observe({**same, "1B": 1.5})  # 1.0, 1.7, 1.5
    assert not rp.due()
    rp.observe({**same, "1B": 1.4})  # 1.7, 1.5, 1.4: held in every step, median 1.5
    verdict = rp.assess()
    assert rp.due() and verdict["machine"] == pytest.approx(1.0) and verdict["moved"] == {"1B": pytest.approx(1.5)}
    assert rp.reason().startswith("1B x1.50 (limit 10%) against the machine factor x1.00")
    proposed, scales = rp.proposed_weights()
    assert scales == {**same, "1B": 1.5}
    assert all(
        proposed.w_max[a] == pytest.approx(weights.w_max[a] * (1.5 if a[:2] == "1B" else 1.0)) for a in weights.w_max
    )
    # keeping the plan under the proposed weights takes longer than the LP's new plan (the kept ratios are
    # feasible for the same budget), and exactly the plan's own prediction under its own weights
    again = make_plan(meta, proposed, 0.8)
    assert rp.kept_plan_ms(proposed) >= again.batch_time_ms["planned"] * (1 - 1e-6)
    assert rp.kept_plan_ms(weights) == pytest.approx(plan.batch_time_ms["planned"], rel=1e-6)
    # a new plan starts a new window; a faster machine (every group alike) keeps the plan, rescales the prediction
    rp.install(as_lists(proposed), ratios, plan.batch_time_ms)
    assert not rp.due()
    for _ in range(3):
        assert rp.observe({g: 0.5 for g in same}) == pytest.approx(-0.5)
    assert not rp.due() and rp.assess()["machine"] == 0.5
    event = rp.rescale(20)
    assert event == {
        "step": 20,
        "machine_factor": 0.5,
        "old_predicted_ms": pytest.approx(plan.batch_time_ms["planned"]),
        "new_predicted_ms": pytest.approx(0.5 * plan.batch_time_ms["planned"]),
    }
    assert rp.predicted_ms() == pytest.approx(0.5 * plan.batch_time_ms["planned"]) and rp.rescale(21) is None
    assert rp.rescales == [event]


def test_replanner_state_round_trips_through_the_checkpoint_codec():
    meta, weights, plan, ratios = setup("ZBVZeroBubble", 2, 4)
    rp = Replanner(meta, 0.1, 2)
    assert rp.state_dict() is None
    rp.install(as_lists(weights), ratios, plan.batch_time_ms)
    slow = {drift.group_of(a): 1.5 if a[1] == "W" else 1.0 for a in weights.w_max}  # the weight-grad backwards
    rp.observe(slow)
    rp.events.append({"step": 12, "reason": "drift +20%", "scales": {"0W": 1.5}})
    st = state_codec.decode(state_codec.encode(rp.state_dict()))
    again = Replanner(meta, 0.1, 2)
    again.load_state_dict(st)
    assert again.state_dict() == rp.state_dict()
    assert len(again.window) == 1
    assert again.observe(slow) == rp.observe(slow) > 0 and again.due() and rp.due()
    with pytest.raises(ValueError, match="window"):
        Replanner(meta, 0.1, 2).load_state_dict(dict(st, window=[{"1F": 1.0}]))
    bad = dict(st, weights={a: w for a, w in list(st["weights"].items())[1:]})
    with pytest.raises(ValueError, match="node weights"):
        Replanner(meta, 0.1, 2).load_state_dict(bad)
    a0 = next(iter(st["weights"]))
    with pytest.raises(ValueError, match="w_min"):
        Replanner(meta, 0.1, 2).load_state_dict(dict(st, weights={**st["weights"], a0: [5.0, 1.0]}))
    with pytest.raises(ValueError, match="ratios"):
        Replanner(meta, 0.1, 2).load_state_dict(dict(st, ratios={a0: 2.0}))


def test_freeze_state_carries_the_replan_state_and_accepts_older_states():
    identity = {
        "method": "timelyfreeze",
        "schedule": "1F1B",
        "num_stages": 2,
        "num_microbatches": 4,
        "pp_rank": 0,
        "pp_size": 2,
    }
    state = dict(
        step=2,
        run=identity,
        method={},
        monitor_records=[],
        plan_batch_ms=None,
        history=[{"step": 1, "phase": "warmup"}, {"step": 2, "phase": "warmup"}],
        val_curve=[],
        meta=None,
        failures=[],
        replan={"weights": {}},
    )
    phases = validate(Freeze(warmup_steps=2, monitor_steps=1, ramp_steps=1), total_steps=10, lr_warmup_steps=0)
    assert freeze_state.unpack(freeze_state.pack(**state), identity, 2, phases)["replan"] == {"weights": {}}
    old = state_codec.decode(freeze_state.pack(**state))
    del old["replan"]
    assert freeze_state.unpack(state_codec.encode(old), identity, 2, phases)["replan"] is None
    with pytest.raises(state_codec.FreezeStateError, match="replan"):
        freeze_state.unpack(freeze_state.pack(**dict(state, replan=[1])), identity, 2, phases)


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("replan_threshold", 0.0, "replan_threshold"),
        ("replan_threshold", float("inf"), "replan_threshold"),
        ("replan_patience", 0, "replan_patience"),
        ("replan_patience", 1.5, "replan_patience"),
        ("replan_min_gain", -0.01, "replan_min_gain"),
        ("replan_min_gain", 1.0, "replan_min_gain"),
    ],
)
def test_bad_replan_settings_name_the_field(field, value, match):
    with pytest.raises(FreezeConfigError, match=match):
        validate(Freeze(**{field: value}), total_steps=100, lr_warmup_steps=20)


def summary_kwargs() -> dict:
    return dict(
        history=[{"step": 1, "phase": "stable", "step_ms": 10.0, "batch_ms": 9.0, "freeze_ratio": 0.5, "loss": 1.0}],
        steady_phases=("stable",),
        tokens_per_step=8,
        run={"method": "timelyfreeze", "schedule": "1F1B", "pp_degree": 2, "num_stages": 2, "num_microbatches": 4},
        predicted_batch_ms=None,
        val_curve=[],
        method_summary={},
        failures=[],
    )


def test_summary_lists_the_replans():
    event = {
        "step": 8,
        "reason": "drift +185.4% (beyond 10%) for 2 stable steps",
        "scales": {"1F": 5.9},
        "old_planned_ms": 337.3,
        "new_planned_ms": 944.3,
        "plan": "replans/plan_step8.json",
    }
    s = build(**summary_kwargs(), replans=[event])
    assert s["replans"] == [event]
    assert (
        "re-planned after step 8: drift +185.4% (beyond 10%) for 2 stable steps; predicted batch 337.3 -> 944.3 ms"
        in format_summary(s)
    )


def test_delays_on_cross_rank_edges_stay_fixed_in_the_drift_and_travel_with_the_state():
    from planner.timing.comm import cross_rank_edges

    meta, weights, plan, ratios = setup()
    dag = build_dag(meta)
    edges = {e: 50.0 for e in cross_rank_edges(dag)}
    groups = {drift.group_of(a) for a in weights.w_max}
    slow = {g: 1.5 for g in groups}
    # compute 50 % slower, delays unchanged: the batch stretches by less than 50 %
    with_delays = drift.drift(dag, weights, ratios, slow, edges)
    assert 0.0 < with_delays < drift.drift(dag, weights, ratios, slow) == pytest.approx(0.5)
    rp = Replanner(meta, 0.1, 1)
    rp.install(as_lists(weights), ratios, plan.batch_time_ms, [[u, v, ms] for (u, v), ms in edges.items()])
    assert rp.observe(slow) == pytest.approx(with_delays)
    again = Replanner(meta, 0.1, 1)
    again.load_state_dict(state_codec.decode(state_codec.encode(rp.state_dict())))
    assert again.edge_ms == edges
    with pytest.raises(ValueError, match="edge_ms"):
        again.load_state_dict(dict(rp.state_dict(), edge_ms=[["0F0", "nope", 1.0]]))


def test_a_kept_replan_takes_the_measurements_and_keeps_the_ratios():
    meta, weights, plan, ratios = setup()
    rp = Replanner(meta, threshold=0.05, patience=3)
    rp.install(as_lists(weights), ratios, plan.batch_time_ms)
    for _ in range(3):
        rp.observe({"0F": 1.0, "0B": 1.0, "1F": 1.0, "1B": 1.2})
    assert rp.due()
    proposed, _ = rp.proposed_weights()
    kept = rp.kept_plan_ms(proposed)
    event = rp.keep(30, proposed, {**plan.batch_time_ms, "planned": kept}, reason="1B x1.20", saves=0.004, frees=0.0)
    assert rp.ratios == ratios and rp.weights.w_max == proposed.w_max and rp.predicted_ms() == kept
    assert (
        event["kept_replan"] and event["old_predicted_ms"] == plan.batch_time_ms["planned"] and event["saves"] == 0.004
    )
    assert rp.rescales == [event] and rp.events == [] and not rp.due() and rp.window == []
    # the same measurements again are no change against the new reference
    assert rp.observe({"0F": 1.0, "0B": 1.0, "1F": 1.0, "1B": 1.0}) == pytest.approx(0.0)
    jitter = {"steps": 8, "no_freeze": 1.004, "all_frozen": 1.0, "planned": 1.0151}
    text = format_summary(build(**summary_kwargs(), monitoring={"factors": {}, "jitter": jitter}, rescales=[event]))
    assert (
        "jitter (planner.timing.jitter, 8 monitoring steps): predictions +1.5 % planned, +0.4 % without freezing"
        in text
    )
    assert "re-plan not taken after step 30 (it would save 0.4 % of the batch, +0.000 of freezing), plan kept" in text


def test_mean_ratio_counts_the_freezable_actions_only():
    w = NodeWeights({"0F0": 5.0, "0B0": 4.0, "0B1": 4.0}, {"0F0": 5.0, "0B0": 8.0, "0B1": 8.0})
    assert mean_ratio({"0F0": 0.0, "0B0": 0.5, "0B1": 1.0}, w) == 0.75
    assert mean_ratio({}, NodeWeights({"0F0": 5.0}, {"0F0": 5.0})) == 0.0


def test_min_gain_zero_takes_every_due_replan_and_a_positive_one_weighs_the_gain():
    # 0 takes a plan equal to the one in force, whose gain the solver's tolerance leaves a hair below 0
    assert takes_effect(-1e-9, -1e-6, 0.0) and takes_effect(0.0, 0.0, 0.0)
    assert takes_effect(0.01, -0.2, 0.01) and takes_effect(-0.2, 0.02, 0.01)
    assert not takes_effect(0.009, 0.009, 0.01) and not takes_effect(-1e-9, 0.0, 0.01)


def test_a_drift_report_gives_the_metrics_row_only_what_the_check_measured():
    """``DriftReport.row_fields``: the fields ``check_drift`` used to write into the row, in the same order."""
    from timelyfreeze.plan.outcome import DriftReport

    assert DriftReport().row_fields() == {}  # no plan watched: nothing
    assert DriftReport(replans=0).row_fields() == {"replans": 0}  # a plan, not a stable step
    watched = DriftReport(watched=True, drift=None, machine_factor=None, rank_factors={}, replans=1)
    assert watched.row_fields() == {"drift": None, "replans": 1}  # observed, no scales to read
    full = DriftReport(
        watched=True, drift=0.1, machine_factor=1.05, rank_factors={"0": 1.0, "1": 1.1}, replan={"step": 5}, replans=2
    )
    assert list(full.row_fields()) == ["drift", "machine_factor", "rank_factors", "replan", "replans"]
    assert DriftReport(watched=True, drift=0.0, rescale={"step": 7}, replans=0).row_fields()["rescale"] == {"step": 7}


@pytest.mark.parametrize("schedule", ["1F1B", "ZBVZeroBubble", "Interleaved1F1B"])
def test_a_plans_path_gives_the_drift_of_planned_durations_bit_for_bit(schedule):
    """``path_drift`` on a plan's arrays is the longest path of ``planned_durations`` with the scales, the same
    float, with and without delays, for scales of some groups, all groups and none."""
    import random

    from planner.schedule.dag import longest_path
    from planner.timing.comm import cross_rank_edges

    meta, weights, _, ratios = setup(schedule, 2, 8)
    dag = build_dag(meta)
    rnd = random.Random(3)
    groups = sorted({drift.group_of(a) for a in weights.w_max})
    for edges in (None, {e: rnd.uniform(0.0, 30.0) for e in cross_rank_edges(dag)}):
        path = drift.planned_path(dag, weights, ratios, edges)
        base = longest_path(dag, drift.planned_durations(weights, ratios), edges)[0]
        assert path.base == base
        for scales in ({}, {g: rnd.uniform(0.5, 2.0) for g in groups}, {groups[0]: 1.7, "9Z": 3.0}):
            old = longest_path(dag, drift.planned_durations(weights, ratios, scales), edges)[0] / base - 1.0
            assert drift.path_drift(path, scales) == old
            assert drift.drift(dag, weights, ratios, scales, edges) == old


def test_the_replanner_builds_a_plans_arrays_once_and_assesses_a_window_once(monkeypatch):
    """Per step only the scaled longest paths run: the plan's durations and delays are made at ``install``, and
    ``due``, ``rescale`` and ``reason`` of one window share one assessment."""
    from planner.timing.comm import cross_rank_edges
    from timelyfreeze.plan import replan as replan_module

    meta, weights, plan, ratios = setup()
    dag = build_dag(meta)
    edges = [[u, v, 5.0] for u, v in cross_rank_edges(dag)]
    calls = {"planned_path": 0, "window_scales": 0}
    for name in calls:
        real = getattr(drift, name)

        def counted(*a, _real=real, _name=name, **k):
            calls[_name] += 1
            return _real(*a, **k)

        monkeypatch.setattr(replan_module.plan_drift, name, counted)
    rp = Replanner(meta, 0.1, 2)
    rp.install(as_lists(weights), ratios, plan.batch_time_ms, edges)
    groups = {drift.group_of(a) for a in weights.w_max}
    for k in range(6):
        rp.observe({g: 1.0 + 0.01 * k for g in groups})
        rp.due(), rp.rescale(k)
    assert calls == {"planned_path": 1, "window_scales": 5}  # one per full window (steps 2-6)
    rp.install(as_lists(weights), ratios, plan.batch_time_ms, edges)
    assert calls["planned_path"] == 2


@pytest.mark.parametrize("schedule", ["1F1B", "ZBVZeroBubble", "Interleaved1F1B"])
def test_the_machine_factors_bounds_skip_only_rescales_that_would_not_happen(schedule, monkeypatch):
    """``rescale`` first bounds the machine factor by the ranks' factors and 1 (no longest path); where both bounds
    are within the limit it returns None. The same steps give the same events, factors and verdicts as computing
    the factor every step, and the factor always lies within its bounds."""
    import random

    from planner.timing.comm import cross_rank_edges

    meta, weights, plan, ratios = setup(schedule, 2, 8)
    rnd = random.Random(11)
    edges = [[u, v, rnd.uniform(0.0, 3.0)] for u, v in cross_rank_edges(build_dag(meta))]
    groups = sorted({drift.group_of(a) for a in weights.w_max})
    steps = []
    for k in range(80):  # long quiet stretches, machine-wide changes, and changes on one rank
        base = rnd.choice((1.0, 1.0, 1.15, 0.9, rnd.uniform(0.8, 1.3)))
        steps.append(
            {g: base * rnd.uniform(0.97, 1.03) * (1.2 if k > 50 and g.startswith("1") else 1.0) for g in groups}
        )

    def run(bounded: bool):
        rp = Replanner(meta, 0.1, 3)
        rp.install(as_lists(weights), ratios, {"no_freeze": 100.0, "all_frozen": 60.0, "planned": 80.0}, edges)
        if not bounded:
            monkeypatch.setattr(rp, "_machine_range", lambda verdict: None)
        out = []
        for k, scales in enumerate(steps):
            rp.observe(scales)
            verdict = rp.assess()
            event = None if rp.due() else rp.rescale(k)
            if verdict is not None and bounded:
                skipped.append("machine" not in verdict)  # the longest path was not needed this step
                lo, hi = rp._machine_range(verdict)
                assert lo <= verdict["machine"] <= hi
            out.append((event, rp.machine, None if verdict is None else dict(verdict, machine=verdict["machine"])))
        return out

    skipped: list[bool] = []
    got, want = run(True), run(False)
    assert got == want
    assert any(e is not None for e, _, _ in want) and sum(skipped) > 20
