"""planner.analysis.placement: the plan against the same per-stage shares spread uniformly."""

import pytest

from planner.analysis.placement import predict_placement, uniform_durations
from planner.plan import plan_from_trace, stage_mean_ratios
from planner.timing.comm import estimate_edge_delays
from planner.trace.simulate import synthetic_trace


@pytest.mark.parametrize(
    "schedule, pp, stages", [("1F1B", 2, 2), ("GPipe", 4, 4), ("ZBVZeroBubble", 2, 4), ("Interleaved1F1B", 2, 4)]
)
def test_the_plan_is_never_slower_than_its_shares_spread_uniformly(schedule, pp, stages):
    scale = [1.0 + 0.3 * s for s in range(stages)]
    trace = synthetic_trace(schedule, pp, 8, stage_scale=scale, jitter=0.05, seed=2)
    plan = plan_from_trace(trace, 0.6)
    edges = estimate_edge_delays(trace)
    means = stage_mean_ratios(plan)
    shares = [means[s] for s in range(trace.meta.num_stages)]
    p = predict_placement(trace.meta, plan, shares, edges)
    # the uniform assignment has the plan's per-stage averages, so it is feasible for the LP the plan solved
    assert p.planned_ms <= p.uniform_ms * (1 + 1e-9)
    assert p.planned_ms == pytest.approx(plan.batch_time_ms["planned"], rel=1e-9)
    assert p.no_freeze_ms == pytest.approx(plan.batch_time_ms["no_freeze"], rel=1e-9)
    assert p.speedup_difference >= -1e-9


def test_uniform_durations_follow_the_linear_model():
    trace = synthetic_trace("1F1B", 2, 4)
    plan = plan_from_trace(trace, 0.5)
    d = uniform_durations(plan, [0.0, 1.0])
    for name, a in plan.actions.items():
        if name[1] in "BW" and name[0] == "1":
            assert d[name] == pytest.approx(a.w_min)
        else:
            assert d[name] == pytest.approx(a.w_max)


def test_shares_must_cover_every_stage():
    trace = synthetic_trace("1F1B", 2, 4)
    with pytest.raises(ValueError, match="2 stages"):
        predict_placement(trace.meta, plan_from_trace(trace, 0.5), [0.5])
