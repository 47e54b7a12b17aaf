"""Node-weight estimators (``planner.timing.estimate``): ``median`` is ``node_weights``; ``pooled`` shares the
records of a stage's microbatches and keeps a microbatch's own median only where the data show an effect."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from planner.errors import PlannerError
from planner.plan import load_plan, plan_from_trace, write_plan
from planner.schedule.orders import schedule_meta
from planner.timing.estimate import (
    DEFAULT_ESTIMATOR,
    ESTIMATORS,
    MAD_TO_SIGMA,
    MEDIAN_SE_FACTOR,
    check_estimator,
    estimate_weights,
    pooled_estimates,
)
from planner.trace.load import Trace, node_weights, trace_from_records
from planner.trace.simulate import synthetic_trace
from timelyfreeze.plan import planning
from timelyfreeze.plan.outcome import PlanFailure
from timelyfreeze.plan.settings import PlanSettings

NOISE = (0.97, 0.99, 1.0, 1.01, 1.03)  # one step's factor each; every microbatch sees all five once
BASE = {"F": 10.0, "B": 20.0}


def make_trace(ms, *, schedule: str = "1F1B", pp: int = 2, n: int = 8, steps: int = 5, replicas: int = 1) -> Trace:
    """Records of ``steps`` upper then ``steps`` lower steps; ``ms(replica, action, phase, k)`` gives each one
    (``k``: the step within its phase)."""
    meta = schedule_meta(schedule, pp, n) | ({"replicas": replicas} if replicas > 1 else {})
    recs: dict[tuple[int, int], list[dict]] = {}
    for d in range(replicas):
        for r, order in meta["rank_orders"].items():
            out = recs.setdefault((d, int(r)), [])
            for i, phase in enumerate(("upper", "lower")):
                for k in range(steps):
                    for a in order:
                        out.append(
                            {
                                "step": 1 + i * steps + k,
                                "action": a,
                                "ms": ms(d, a, phase, k),
                                "phase": phase,
                                "freeze_ratio": 1.0 if phase == "lower" and "B" in a else 0.0,
                            }
                        )
    return trace_from_records(meta, recs, source="mem")


def kind_mb(a: str) -> tuple[int, str, int]:
    i = next(j for j, c in enumerate(a) if c.isalpha())
    return int(a[:i]), a[i], int(a[i + 1 :])


def slow_first(d: int, a: str, phase: str, k: int, offsets: tuple[float, ...] = (0.0,)) -> float:
    """Every microbatch alike (noise ``NOISE[(k + m) % 5]``, a per-microbatch offset cycling through ``offsets``),
    except that B of microbatch 0 is 30 % slower; ``lower`` halves B."""
    s, kind, m = kind_mb(a)
    v = BASE[kind] * (1 + s) * NOISE[(k + m) % 5] * (1 + offsets[m % len(offsets)])
    if kind == "B":
        v *= (1.3 if m == 0 else 1.0) * (0.5 if phase == "lower" else 1.0)
    return v


def test_slow_first_microbatch_keeps_its_own_value_the_others_share_one():
    tr = make_trace(slow_first)
    w, med = estimate_weights(tr, "pooled"), node_weights(tr)
    est = pooled_estimates(tr)
    for s in (0, 1):
        hi, lo = 20.0 * (1 + s), 10.0 * (1 + s)
        assert w.w_max[f"{s}B0"] == med.w_max[f"{s}B0"] == pytest.approx(1.3 * hi)  # its own median
        assert w.w_min[f"{s}B0"] == med.w_min[f"{s}B0"] == pytest.approx(1.3 * lo)
        assert est[0, f"{s}B0", "upper"].own and est[0, f"{s}B0", "lower"].own
        for m in range(1, 8):
            assert w.w_max[f"{s}B{m}"] == pytest.approx(hi) and w.w_min[f"{s}B{m}"] == pytest.approx(lo)
            e = est[0, f"{s}B{m}", "upper"]
            assert not e.own and e.n == 40 and e.value == e.pooled
        assert len({w.w_max[f"{s}B{m}"] for m in range(1, 8)}) == 1
        # By hand: 40 samples, 7 per NOISE level plus 5 slow ones -> median 1.0 * hi, MAD 0.01 * hi.
        e0, e1 = est[0, f"{s}B0", "upper"], est[0, f"{s}B1", "upper"]
        sigma = MAD_TO_SIGMA * 0.01 * hi
        assert e1.pooled == pytest.approx(hi) and e1.se == pytest.approx(MEDIAN_SE_FACTOR * sigma / math.sqrt(40))
        assert e0.n == 5 and e0.se == pytest.approx(MEDIAN_SE_FACTOR * sigma / math.sqrt(5))
        # F is pooled too (one value for the stage) and stays unfreezable.
        assert len({w.w_max[f"{s}F{m}"] for m in range(8)}) == 1
        assert all(w.w_min[f"{s}F{m}"] == w.w_max[f"{s}F{m}"] for m in range(8))


def test_scattered_medians_of_alike_microbatches_become_one_value():
    """Offsets of up to 1 % per microbatch: the own medians scatter, the pooled weights do not."""
    tr = make_trace(lambda d, a, p, k: slow_first(d, a, p, k, offsets=(-0.01, -0.005, 0.0, 0.005, 0.01)))
    w, med = estimate_weights(tr, "pooled"), node_weights(tr)
    for s in (0, 1):
        others = [f"{s}B{m}" for m in range(1, 8)]
        assert len({med.w_max[a] for a in others}) > 1 and len({med.w_min[a] for a in others}) > 1
        assert len({w.w_max[a] for a in others}) == 1 and len({w.w_min[a] for a in others}) == 1
        assert w.w_max[f"{s}B0"] == med.w_max[f"{s}B0"] > w.w_max[f"{s}B1"]


@pytest.mark.parametrize("schedule,pp,n", [("1F1B", 4, 8), ("ZBVZeroBubble", 2, 6), ("Interleaved1F1B", 2, 4)])
def test_no_effect_gives_equal_weights_per_stage_and_kind(schedule, pp, n):
    tr = synthetic_trace(schedule, pp, n, stage_scale=None, jitter=0.05, seed=3, steps=5)
    w, med = estimate_weights(tr, "pooled"), node_weights(tr)
    groups: dict[tuple[int, str], list[str]] = {}
    for a in tr.meta.all_actions():
        s, kind, _ = kind_mb(a)
        groups.setdefault((s, kind), []).append(a)
    scattered = 0
    for acts in groups.values():
        assert len({w.w_max[a] for a in acts}) == 1 and len({w.w_min[a] for a in acts}) == 1
        scattered += len({med.w_max[a] for a in acts}) > 1
    assert scattered == len(groups)  # the plain medians differ within every group
    assert not any(e.own for e in pooled_estimates(tr).values())
    for a in tr.meta.all_actions():
        assert w.w_min[a] <= w.w_max[a]
        if kind_mb(a)[1] in "FI":
            assert w.w_min[a] == w.w_max[a]
    assert w.freezable  # B (1F1B) or W (ZBV) can still shrink


@pytest.mark.parametrize("replicas", [1, 2])
def test_median_is_node_weights_exactly(replicas):
    tr = make_trace(lambda d, a, p, k: slow_first(d, a, p, k, offsets=(0.003 * d, -0.004, 0.02)), replicas=replicas)
    assert estimate_weights(tr, "median") == node_weights(tr)
    assert estimate_weights(tr) == estimate_weights(tr, DEFAULT_ESTIMATOR) == estimate_weights(tr, "pooled")
    assert estimate_weights(tr, "pooled") != node_weights(tr)


def test_unknown_estimator_is_one_line_error():
    assert ESTIMATORS == ("median", "pooled") and check_estimator("pooled") == "pooled"
    tr = make_trace(slow_first)
    with pytest.raises(PlannerError, match=r"^estimator 'mean': choose one of median, pooled$"):
        estimate_weights(tr, "mean")
    with pytest.raises(PlannerError, match="estimator 'mean'"):
        plan_from_trace(tr, 0.5, estimator="mean")


def _single_replicas(tr: Trace) -> list[Trace]:
    meta = tr.meta.to_json()
    meta.pop("replicas")
    out = []
    for d in range(tr.meta.replicas):
        recs: dict[int, list[dict]] = {r: [] for r in range(tr.meta.pp_degree)}
        for x in tr.records:
            if x.replica == d:
                recs[x.rank].append({k: getattr(x, k) for k in ("step", "action", "ms", "phase", "freeze_ratio")})
        out.append(trace_from_records(meta, recs))
    return out


def test_replicas_combined_by_per_action_max_after_the_clamp():
    def ms(d, a, phase, k):
        s, kind, m = kind_mb(a)
        v = slow_first(d, a, phase, k) * (1.1 if s == d else 1.0)  # replica d slow on stage d
        if d == 1 and kind == "B" and m == 3 and phase == "lower":
            v *= 4.0  # noise makes w_min > w_max here: clamped within replica 1
        return v

    tr = make_trace(ms, replicas=2)
    both = estimate_weights(tr, "pooled")
    single = [estimate_weights(t, "pooled") for t in _single_replicas(tr)]
    for a in tr.meta.all_actions():
        assert both.w_max[a] == max(w.w_max[a] for w in single)
        assert both.w_min[a] == max(w.w_min[a] for w in single)
        assert both.w_min[a] <= both.w_max[a]
    assert single[1].w_min["1B3"] == single[1].w_max["1B3"]  # clamped
    assert both.w_min["1B3"] == both.w_max["1B3"] == single[1].w_max["1B3"]
    assert both.w_max["0B1"] == single[0].w_max["0B1"] > single[1].w_max["0B1"]
    assert both.w_max["1B1"] == single[1].w_max["1B1"] > single[0].w_max["1B1"]
    est = pooled_estimates(tr)
    assert est[1, "1B3", "lower"].own and not est[0, "1B3", "lower"].own


def test_missing_records_are_the_same_errors_as_median():
    tr = make_trace(slow_first)
    for phase in ("upper", "lower"):
        cut = Trace(tr.meta, [x for x in tr.records if not (x.action == "1B5" and x.phase == phase)], tr.source)
        with pytest.raises(PlannerError) as want:
            node_weights(cut)
        with pytest.raises(PlannerError) as got:
            estimate_weights(cut, "pooled")
        assert str(got.value) == str(want.value) and "1B5" in str(got.value) and phase in str(got.value)


def test_other_phases_are_ignored_and_records_unchanged():
    tr = make_trace(slow_first)
    before = list(tr.records)
    extra = [dataclasses.replace(x, phase="stable", ms=x.ms * 7) for x in tr.records]
    more = Trace(tr.meta, tr.records + extra, tr.source)
    assert estimate_weights(more, "pooled") == estimate_weights(tr, "pooled")
    assert tr.records == before


def test_plan_records_the_estimator(tmp_path):
    tr = make_trace(lambda d, a, p, k: slow_first(d, a, p, k, offsets=(-0.01, 0.0, 0.01)))
    for name in ESTIMATORS:
        plan = plan_from_trace(tr, 0.5, estimator=name)
        assert plan.extra == {"estimator": name}
        w = estimate_weights(tr, name)
        assert all(plan.actions[a].w_max == w.w_max[a] and plan.actions[a].w_min == w.w_min[a] for a in w.w_max)
        write_plan(plan, tmp_path / f"{name}.json")
        assert load_plan(tmp_path / f"{name}.json").extra == {"estimator": name}
    assert plan_from_trace(tr, 0.5).extra == {"estimator": DEFAULT_ESTIMATOR} == {"estimator": "pooled"}


def plan_settings(**kw) -> PlanSettings:
    """The runtime's plan settings at r_max 0.5 (``kw`` overrides), as the solve tests take them."""
    base = dict(
        r_max=0.5,
        solver="auto",
        estimator=DEFAULT_ESTIMATOR,
        gaps=False,
        anchor=True,
        jitter=False,
        cliff=False,
        monitor_tolerance=0.1,
        replan=False,
        replan_threshold=0.05,
        replan_patience=3,
        replan_noise_k=3.0,
        replan_min_gain=0.01,
        given_plan="",
    )
    return PlanSettings(**{**base, **kw})


def test_runtime_planning_step_uses_the_estimator(tmp_path):

    tr = make_trace(lambda d, a, p, k: slow_first(d, a, p, k, offsets=(-0.01, 0.0, 0.01)))
    meta = tr.meta.to_json()
    recs: dict[int, list[dict]] = {r: [] for r in range(tr.meta.pp_degree)}
    for x in tr.records:
        recs[x.rank].append({k: getattr(x, k) for k in ("step", "action", "ms", "phase", "freeze_ratio")})
    for name in ESTIMATORS:
        path = tmp_path / f"{name}.json"
        result = planning.solve(meta, recs, plan_settings(estimator=name), tmp_path / "trace", path)
        assert not isinstance(result, PlanFailure)
        want = plan_from_trace(tr, 0.5, estimator=name)
        assert result.freeze_ratios == pytest.approx({a: p.freeze_ratio for a, p in want.actions.items()}, abs=1e-9)
        assert json.loads(path.read_text())["estimator"] == name
    bad = planning.solve(meta, recs, plan_settings(estimator="mean"), tmp_path / "trace", tmp_path / "x.json")
    assert isinstance(bad, PlanFailure) and bad.message.startswith("planning failed: estimator 'mean'")


def _rule_group_by_group(trace: Trace) -> dict:
    """The ``pooled`` rule as the module docstring words it, one group and one action at a time in plain Python:
    the reference the columnar estimator must equal float for float."""
    import statistics

    from planner.schedule.actions import FREEZABLE_KINDS, parse_action

    groups: dict[tuple, dict[str, list[float]]] = {}
    for rec in trace.records:
        act = parse_action(rec.action)
        if rec.phase == "upper" or (rec.phase == "lower" and act.kind in FREEZABLE_KINDS):
            groups.setdefault((rec.replica, act.stage, act.kind, rec.phase), {}).setdefault(rec.action, []).append(
                rec.ms
            )
    out = {}
    for (d, _, _, phase), samples in groups.items():
        everything = [x for xs in samples.values() for x in xs]
        pooled = float(statistics.median(everything))
        sigma = MAD_TO_SIGMA * float(statistics.median([abs(x - pooled) for x in everything]))
        se_pooled = MEDIAN_SE_FACTOR * sigma / math.sqrt(len(everything))
        for a, xs in samples.items():
            own = float(statistics.median(xs))
            se_own = MEDIAN_SE_FACTOR * sigma / math.sqrt(len(xs))
            if abs(own - pooled) > max(3.0 * se_own, 0.02 * abs(pooled)):
                out[d, a, phase] = (own, se_own, len(xs), True, pooled)
            else:
                out[d, a, phase] = (pooled, se_pooled, len(everything), False, pooled)
    return out


@pytest.mark.parametrize("schedule,replicas", [("1F1B", 1), ("ZBVZeroBubble", 2), ("DualPipeV", 1)])
def test_the_columnar_pooled_rule_gives_the_group_by_group_floats(schedule, replicas):
    import random

    rng = random.Random(5)
    jitter = {}

    def ms(d, a, phase, k):  # noise, a few outliers, odd and even sample counts (steps 4 and 5 below)
        from planner.schedule.actions import parse_action

        x = BASE.get(parse_action(a).kind, 15.0) * rng.choice(NOISE) * (0.6 if phase == "lower" else 1.0)
        return x * (3.0 if rng.random() < 0.03 else 1.0) + jitter.setdefault(a, rng.random())

    for steps in (4, 5):
        trace = make_trace(ms, schedule=schedule, pp=2, n=8, steps=steps, replicas=replicas)
        got = {k: dataclasses.astuple(e) for k, e in pooled_estimates(trace).items()}
        assert got == _rule_group_by_group(trace)


def test_group_medians_are_statistics_medians():
    import random
    import statistics

    import numpy as np

    from planner.trace.columns import group_ids, group_medians

    rng = random.Random(3)
    keys = np.array([rng.randrange(7) for _ in range(200)])
    sub = np.array([rng.randrange(3) for _ in range(200)])
    values = np.array([rng.choice([rng.random(), 0.1, 0.3]) for _ in range(200)])  # ties too
    gid, first = group_ids(keys, sub)
    med, count = group_medians(gid, values, len(first))
    for g, f in enumerate(first):
        xs = [float(v) for k, s, v in zip(keys, sub, values) if k == keys[f] and s == sub[f]]
        assert med[g] == statistics.median(xs) and count[g] == len(xs)
    assert sorted(zip(keys[first].tolist(), sub[first].tolist())) == list(zip(keys[first], sub[first]))


def test_a_trace_without_records_names_the_first_missing_record():
    meta = schedule_meta("1F1B", 2, 2)
    empty = trace_from_records(meta, {0: [], 1: []}, source="mem")
    for estimator in ESTIMATORS:
        with pytest.raises(PlannerError, match=r"actions_rank0.jsonl: action '0F0' has no record with phase 'upper'"):
            estimate_weights(empty, estimator)
