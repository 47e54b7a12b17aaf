"""Plan vs reality without torch: F-anchored monitoring windows (``planner.timing.monitor``) and the re-plan rule
that tells a uniform change (the machine) from a relative one (``timelyfreeze.plan.replan``)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from planner.plan import plan_from_trace
from planner.timing import monitor
from planner.timing.drift import machine_factor
from planner.trace.load import Trace, node_weights, validate_meta
from planner.trace.simulate import synthetic_trace
from tests.test_replan import as_lists, setup
from timelyfreeze.config.freeze import Freeze, FreezeConfigError, validate
from timelyfreeze.outputs.summary import build, format_summary
from timelyfreeze.plan.replan import Replanner
from timelyfreeze.runtime import state_codec


def slowed(trace: Trace, phase: str, factor: float) -> Trace:
    """``trace`` with every record of ``phase`` ``factor`` times slower (a loaded machine in that window)."""
    recs = [replace(r, ms=r.ms * factor) if r.phase == phase else r for r in trace.records]
    return Trace(trace.meta, recs, trace.source)


@pytest.mark.parametrize("schedule,pp,n", [("1F1B", 2, 4), ("ZBVZeroBubble", 2, 4)])
def test_a_slow_lower_window_is_brought_to_the_upper_windows_speed(schedule, pp, n):
    base = synthetic_trace(schedule, pp, n, stage_scale=None, jitter=0.02, seed=3)
    loaded = slowed(base, "lower", 1.2)
    assert monitor.window_factors(base) == [pytest.approx(1.0, abs=0.03)]
    f = monitor.window_factors(loaded)[0]
    assert f == pytest.approx(1.2 * monitor.window_factors(base)[0])
    # anchored, the loaded trace gives the base trace's weights (up to the base's own F factor)
    fixed = node_weights(monitor.anchored(loaded, {"lower": [f]}))
    ref = node_weights(monitor.anchored(base, {"lower": monitor.window_factors(base)}))
    assert all(fixed.w_min[a] == pytest.approx(ref.w_min[a]) for a in ref.w_min)
    # without anchoring every w_min is inflated: freezing seems to save less
    assert sum(node_weights(loaded).w_min.values()) > sum(fixed.w_min.values())
    plan = plan_from_trace(loaded, 0.8, anchor=True, comm=False)
    again = plan_from_trace(base, 0.8, anchor=True, comm=False)  # the same windows on a steady machine
    assert plan.extra["monitoring"]["factors"] == {"lower": [round(f, 6)]}
    assert plan.extra["monitoring"]["anchored"] and plan.extra["monitoring"]["reference"] == "upper"
    assert plan.batch_time_ms == pytest.approx(again.batch_time_ms, rel=1e-6)
    assert "monitoring" not in plan_from_trace(loaded, 0.8, comm=False).extra  # the CLI default
    off = plan_from_trace(loaded, 0.8, anchor=False, comm=False)
    assert not off.extra["monitoring"]["anchored"]
    assert off.batch_time_ms == plan_from_trace(loaded, 0.8, comm=False).batch_time_ms


def test_replicas_have_their_own_factor():
    base = synthetic_trace("1F1B", 2, 4)
    meta = base.meta.to_json() | {"replicas": 2}
    recs = base.records + [replace(r, replica=1, ms=r.ms * (1.5 if r.phase == "lower" else 1.0)) for r in base.records]
    two = Trace(validate_meta(meta, "meta"), recs, "two")
    assert monitor.window_factors(two) == [pytest.approx(1.0), pytest.approx(1.5)]


def test_noise_floors_measure_the_windows_dispersion_against_the_machine():
    quiet = synthetic_trace("1F1B", 2, 4, steps=3)
    assert monitor.noise_floors(quiet) == {"0B": 0.0, "0F": 0.0, "1B": 0.0, "1F": 0.0}
    noisy = monitor.noise_floors(synthetic_trace("1F1B", 2, 4, steps=5, jitter=0.1, seed=1))
    # each rank is its own yardstick: with one stage per rank, its F group is its factor (floor 0)
    assert all(0.005 < noisy[g] < 0.1 for g in ("0B", "1B")) and noisy["0F"] == noisy["1F"] == 0.0
    # a step in which every action ran 30 % slower (the machine) raises no floor ...
    recs = [replace(r, ms=r.ms * 1.3) if r.step == 2 else r for r in quiet.records]
    assert set(monitor.noise_floors(Trace(quiet.meta, recs, "t")).values()) == {0.0}
    # ... stage 1's backwards alone running 30 % slower every other step raise theirs
    four = synthetic_trace("1F1B", 2, 4, steps=4)
    recs = [replace(r, ms=r.ms * 1.3) if r.step % 2 == 0 and r.action[:2] == "1B" else r for r in four.records]
    floors = monitor.noise_floors(Trace(four.meta, recs, "t"))
    assert floors["1B"] > 0.1 and floors["0B"] == floors["0F"] == 0.0


def test_machine_factor_is_the_median_of_the_f_and_i_groups():
    assert machine_factor({"0F": 1.1, "1F": 1.3, "2F": 1.2, "0B": 5.0, "1I": 1.0}) == pytest.approx(1.15)
    assert machine_factor({"0B": 1.0}) is None


def replanner(noise: dict[str, float] | None = None, threshold: float = 0.05) -> tuple[Replanner, dict, float]:
    meta, weights, plan, ratios = setup()
    rp = Replanner(meta, threshold=threshold, patience=3, noise_k=3.0)
    rp.install(as_lists(weights), ratios, plan.batch_time_ms, noise=noise)
    groups = {"0F": 1.0, "0B": 1.0, "1F": 1.0, "1B": 1.0}
    return rp, groups, plan.batch_time_ms["planned"]


def test_a_uniform_slowdown_keeps_the_plan_and_rescales_the_prediction():
    rp, groups, planned = replanner({g: 0.02 for g in ("0F", "0B", "1F", "1B")})
    for k in range(3):
        rp.observe({g: 1.13 + 0.01 * (k - 1) for g in groups})  # every group +13 %, F included
    assert not rp.due() and rp.assess()["moved"] == {}
    event = rp.rescale(12)
    assert event["machine_factor"] == pytest.approx(1.13)
    assert rp.predicted_ms() == pytest.approx(1.13 * planned)


def test_one_stages_backwards_beyond_their_floor_replan():
    rp, groups, _ = replanner({g: 0.02 for g in ("0F", "0B", "1F", "1B")})  # limit max(3 x 2 %, 5 %) = 6 %
    for _ in range(3):
        rp.observe({**groups, "1B": 1.10})
    assert rp.due() and rp.assess()["moved"] == {"1B": pytest.approx(1.10)}
    # ... also on a machine that slowed by 20 % at the same time: the rule looks past the uniform part
    rp, groups, _ = replanner({g: 0.02 for g in ("0F", "0B", "1F", "1B")})
    for _ in range(3):
        rp.observe({g: 1.2 * (1.10 if g == "1B" else 1.0) for g in groups})
    assert rp.due() and rp.assess()["moved"] == {"1B": pytest.approx(1.10)}
    assert rp.rescale(9) is None  # a re-plan is due: no rescale


def test_noise_within_the_floor_does_not_replan():
    rp, groups, _ = replanner({"0F": 0.02, "1F": 0.02, "0B": 0.02, "1B": 0.05})  # 1B's limit: 15 %
    rng = random.Random(0)
    for _ in range(30):
        rp.observe({**groups, "1B": 1.0 + rng.uniform(-0.12, 0.12), "0F": 1.0 + rng.uniform(-0.04, 0.04)})
        assert not rp.due() and rp.rescale(1) is None
    for _ in range(3):
        rp.observe({**groups, "1B": 1.2})  # beyond 15 %: re-plan
    assert rp.due()


def test_replanner_state_keeps_floors_machine_and_rescales():
    rp, groups, _ = replanner({"1B": 0.03})
    for _ in range(3):
        rp.observe({g: 1.3 for g in groups})
    rp.rescale(7)
    st = state_codec.decode(state_codec.encode(rp.state_dict()))
    again = Replanner(rp.meta, 0.05, 3)
    again.load_state_dict(st)
    assert again.state_dict() == rp.state_dict() and again.machine == pytest.approx(1.3)
    old = {k: v for k, v in st.items() if k not in ("noise", "machine", "rescales")}  # an older state
    Replanner(rp.meta, 0.05, 3).load_state_dict(old)
    with pytest.raises(ValueError, match="machine"):
        Replanner(rp.meta, 0.05, 3).load_state_dict(dict(st, machine=0))


@pytest.mark.parametrize("field,value", [("replan_noise_k", -1.0), ("monitor_tolerance", float("inf"))])
def test_bad_monitoring_settings_name_the_field(field, value):
    with pytest.raises(FreezeConfigError, match=field):
        validate(Freeze(**{field: value}), total_steps=100, lr_warmup_steps=20)


def test_summary_reports_the_monitoring_windows_and_the_rescales():
    monitoring = {
        "reference": "upper",
        "kinds": ["F", "I"],
        "factors": {"lower": [1.2]},
        "anchored": True,
        "noise": {"0F": 0.01},
        "tolerance": 0.1,
        "warnings": ["the lower-bound window ran at F factor 1.200 against the upper-bound window, beyond ..."],
    }
    rescale = {"step": 9, "machine_factor": 1.13, "old_predicted_ms": 100.0, "new_predicted_ms": 113.0}
    s = build(
        history=[{"step": 1, "phase": "stable", "step_ms": 10.0, "batch_ms": 9.0, "freeze_ratio": 0.5, "loss": 1.0}],
        steady_phases=("stable",),
        tokens_per_step=8,
        run={"method": "timelyfreeze", "schedule": "1F1B", "pp_degree": 2, "num_stages": 2, "num_microbatches": 4},
        predicted_batch_ms=None,
        val_curve=[],
        method_summary={},
        failures=[],
        monitoring=monitoring,
        rescales=[rescale],
    )
    assert s["monitoring"] == {**monitoring, "rescales": [rescale]} and s["failures"] == []
    text = format_summary(s)
    assert "monitoring: lower-bound window F factor 1.200 against the upper window (anchored)" in text
    assert "WARNING: the lower-bound window ran at F factor 1.200" in text
    assert "uniform change after step 9: machine factor x1.13, plan kept; predicted batch 100.0 -> 113.0 ms" in text
