"""The monitoring windows' jitter and what it adds to a plan's predictions (``planner.timing.jitter``), and the
runtime's planning step that records it (``[freeze.advanced] jitter_model``)."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace

import pytest

from planner.plan import plan_from_trace
from planner.schedule.dag import build_dag, longest_path
from planner.timing.jitter import expected_factor, jitter_factors, residual_steps
from planner.trace.load import Trace
from planner.trace.simulate import synthetic_trace


def test_steady_windows_add_nothing():
    tr = synthetic_trace("1F1B", 2, 4, steps=3)  # no jitter: every step of a window alike
    res = residual_steps(tr)
    assert len(res) == 6 and all(r == pytest.approx(1.0) for v in res for r in v.values())
    plan = plan_from_trace(tr, 0.5, comm=False)
    factors = jitter_factors(tr, build_dag(tr.meta), plan)
    assert factors == {"steps": 6, "no_freeze": 1.0, "all_frozen": 1.0, "planned": 1.0}
    assert residual_steps(synthetic_trace("1F1B", 2, 4, steps=1)) == []  # one step per window: no dispersion


def test_a_slow_step_as_a_whole_is_the_machine_not_jitter():
    tr = synthetic_trace("1F1B", 2, 4, steps=3)
    slow = Trace(tr.meta, [replace(r, ms=r.ms * (1.3 if r.step == 2 else 1.0)) for r in tr.records], tr.source)
    assert all(r == pytest.approx(1.0) for v in residual_steps(slow) for r in v.values())


def test_the_factor_is_the_mean_longest_path_over_the_residual_steps():
    tr = synthetic_trace("GPipe", 2, 4, jitter=0.1, seed=5, steps=4)
    dag = build_dag(tr.meta)
    res = residual_steps(tr)
    for v in res:  # each step's level is taken out: its median residual is 1
        assert statistics.median(v.values()) == pytest.approx(1.0)
    plan = plan_from_trace(tr, 0.5, comm=False)
    d = {a: ap.duration for a, ap in plan.actions.items()}
    want = statistics.fmean(longest_path(dag, {a: x * v[a] for a, x in d.items()})[0] for v in res)
    assert expected_factor(dag, d, res) == pytest.approx(want / longest_path(dag, d)[0])
    assert jitter_factors(tr, dag, plan)["planned"] == pytest.approx(want / longest_path(dag, d)[0])
    assert expected_factor(dag, d, []) == 1.0


def test_two_even_paths_are_longer_together_than_either():
    # Jensen: two parallel actions take turns being slow; each one's mean is its median, their maximum is not
    import networkx as nx

    from planner.schedule.dag import SINK, SOURCE

    dag = nx.DiGraph([(SOURCE, "0B0"), (SOURCE, "1B0"), ("0B0", SINK), ("1B0", SINK)])
    steps = [{"0B0": 1.2, "1B0": 0.8}, {"0B0": 0.8, "1B0": 1.2}]
    assert expected_factor(dag, {"0B0": 10.0, "1B0": 10.0}, steps) == pytest.approx(1.2)
    assert expected_factor(dag, {"0B0": 10.0, "1B0": 1.0}, steps) == pytest.approx(1.0)  # one path dominates


def test_the_runtime_planning_step_records_the_factors(tmp_path):
    from tests.test_estimate import plan_settings
    from timelyfreeze.plan import planning
    from timelyfreeze.plan.outcome import PlanFailure

    tr = synthetic_trace("1F1B", 2, 4, jitter=0.05, seed=1, steps=3)
    keys = ("step", "action", "ms", "phase", "freeze_ratio")
    recs: dict[int, list[dict]] = {r: [] for r in range(tr.meta.pp_degree)}
    for x in tr.records:
        if x.phase in ("upper", "lower"):
            recs[x.rank].append({k: getattr(x, k) for k in keys})
    for jitter in (False, True):
        path = tmp_path / f"{jitter}.json"
        settings = plan_settings(estimator="median", jitter=jitter)
        result = planning.solve(tr.meta.to_json(), recs, settings, tmp_path / "t", path)
        assert not isinstance(result, PlanFailure)
        recorded = json.loads(path.read_text()).get("jitter")
        assert (recorded is not None) == jitter and result.jitter == recorded
        if jitter:
            assert recorded["steps"] == 6 and set(recorded) == {"steps", "no_freeze", "all_frozen", "planned"}


def _residuals_record_by_record(trace: Trace, phases=("upper", "lower")) -> list[dict[str, float]]:
    """The residual rule as the module docstring words it, one record at a time: the reference of the columnar
    :func:`residual_steps`, float for float."""
    actions = set(trace.meta.all_actions())
    by_phase: dict[str, dict[int, dict[str, float]]] = {phase: {} for phase in phases}
    for rec in trace.records:
        if rec.phase in by_phase and rec.replica == 0:
            step = by_phase[rec.phase].setdefault(rec.step, {})
            step[rec.action] = step.get(rec.action, 0.0) + rec.ms
    out = []
    for phase in phases:
        full = [v for v in by_phase[phase].values() if set(v) == actions]
        if len(full) < 2:
            continue
        med = {a: statistics.median(v[a] for v in full) for a in actions}
        for v in full:
            rel = {a: v[a] / med[a] if med[a] > 0 else 1.0 for a in actions}
            level = statistics.median(rel.values())
            out.append({a: r / level for a, r in rel.items()} if level > 0 else rel)
    return out


@pytest.mark.parametrize("steps", [3, 4])
def test_the_columnar_residuals_are_the_record_by_record_floats(steps):
    tr = synthetic_trace("ZBVZeroBubble", 2, 4, jitter=0.1, seed=3, steps=steps)
    recs = list(tr.records)
    recs += [replace(r, ms=0.25) for r in tr.records[::7] if r.step == 2]  # a second record of some actions
    recs = [r for r in recs if not (r.step == steps + 1 and r.action == recs[0].action)]  # one step incomplete
    recs += [replace(r, replica=1, ms=r.ms * 2) for r in tr.records]  # another replica: not read
    mixed = Trace(replace(tr.meta, replicas=2), recs[::-1], tr.source)  # records in another order
    assert residual_steps(mixed) == _residuals_record_by_record(mixed)
    assert residual_steps(tr) == _residuals_record_by_record(tr)
