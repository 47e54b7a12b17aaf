"""The gap model (``planner.timing.gaps``) and the batch decomposition (``planner.analysis.gap_analysis``) on synthetic
traces whose start times follow a known runtime: each action starts at the later of its rank predecessor's
end plus a fixed gap per (rank, kind -> kind) and its cross-rank inputs' ends plus a link delay."""

from __future__ import annotations

import json
import statistics

import pytest

from planner.analysis.gap_analysis import decompose_batch, decompose_trace, gap_table
from planner.cli import main as cli_main
from planner.plan import plan_from_trace
from planner.schedule.actions import action_kind
from planner.schedule.dag import build_dag, longest_path
from planner.timing.comm import cross_rank_edges, estimate_edge_delays
from planner.timing.gaps import (
    class_name,
    delay_fields,
    fit_gap_model,
    gap_samples,
    merge_delays,
    rank_neighbours,
    split_delays,
    with_gap_costs,
)
from planner.trace.load import Trace
from planner.trace.simulate import synthetic_trace, write_trace

LINK_MS = 0.3
STABLE_EXTRA_MS = 5.0  # added to every gap of the stable phase: the fit must not see it


def gap_of(rank: int, prev: str, nxt: str) -> float:
    """The true gap of a transition: distinct per class, every one below the link delay (so the delay
    estimate stays exact: a rank free at the input's end starts it after the link, not after the gap)."""
    kinds = "FBIW"
    return 0.02 + 0.05 * rank + 0.03 * kinds.index(action_kind(prev)) + 0.01 * kinds.index(action_kind(nxt))


def run_timed(schedule: str, pp: int = 2, mb: int = 4, *, stable_ratio: float = 0.5, jitter: float = 0.1) -> Trace:
    """A synthetic trace (phases upper, lower, stable; 3 steps each) with ``start_ms`` from the runtime of the
    module docstring; stable-phase gaps are :data:`STABLE_EXTRA_MS` longer."""
    tr = synthetic_trace(schedule, pp, mb, steps=3, jitter=jitter, seed=3, stable_ratio=stable_ratio)
    dag = build_dag(tr.meta)
    prev = rank_neighbours(tr.meta)
    xpred: dict[str, list[str]] = {}
    for u, v in cross_rank_edges(dag):
        xpred.setdefault(v, []).append(u)
    rank_of = {a: r for r, o in tr.meta.rank_orders.items() for a in o}
    by_step: dict[int, dict] = {}
    for rec in tr.records:
        by_step.setdefault(rec.step, {})[rec.action] = rec
    names = [dag.index.names[i] for i in dag.index.order.tolist()]
    for step, recs in by_step.items():
        t0 = 10_000.0 * step
        end: dict[str, float] = {}
        for a in names:
            if a not in recs:
                continue
            extra = STABLE_EXTRA_MS if recs[a].phase == "stable" else 0.0
            p = prev[a]
            start = t0 if p is None else end[p] + gap_of(rank_of[a], p, a) + extra
            start = max([start, *(end[u] + LINK_MS for u in xpred.get(a, []))])
            recs[a].start_ms = start
            end[a] = start + recs[a].ms
    return tr


@pytest.mark.parametrize("schedule", ["1F1B", "GPipe", "Interleaved1F1B", "ZBVZeroBubble"])
def test_fit_recovers_the_true_gaps_from_the_monitoring_windows_only(schedule):
    tr = run_timed(schedule)
    dag = build_dag(tr.meta)
    cross = estimate_edge_delays(tr, dag)
    assert cross and all(x == pytest.approx(LINK_MS) for x in cross.values())
    model = fit_gap_model(tr, dag=dag, cross=cross)
    assert model.costs, "every schedule has free transitions"
    for (rank, pk, vk), ms in model.costs.items():
        want = gap_of(rank, f"0{pk}0", f"0{vk}0")
        assert ms == pytest.approx(want, abs=1e-9), class_name((rank, pk, vk))
    # the delays sit on rank-order edges only, one per consecutive pair whose class has a cost
    edges = model.edge_delays(dag)
    assert edges and all(dag.nodes[u]["rank"] == dag.nodes[v]["rank"] for u, v in edges)
    orders = {(p, v) for o in tr.meta.rank_orders.values() for p, v in zip(o[:-1], o[1:])}
    assert set(edges) <= orders


@pytest.mark.parametrize("schedule", ["1F1B", "ZBVZeroBubble"])
def test_the_gap_model_replays_the_monitoring_batches_exactly(schedule):
    """Over each monitoring batch's measured action times, the DAG with delays and gaps gives the measured
    span (the classes a batch uses were all free somewhere); without the gaps it falls short."""
    tr = run_timed(schedule, jitter=0.0)
    dag = build_dag(tr.meta)
    cross = estimate_edge_delays(tr, dag)
    merged, _ = with_gap_costs(tr, dag, cross)
    for step, phase, split in decompose_trace(tr, phases=("upper", "lower"), dag=dag, cross=cross, edge_ms=merged):
        assert split.residual_ms == pytest.approx(0.0, abs=1e-6), (step, phase)
    for _, _, split in decompose_trace(tr, phases=("upper",), dag=dag, cross=cross):
        assert split.residual_ms > 0.1


def test_decomposition_adds_up():
    tr = run_timed("Interleaved1F1B", mb=4)
    dag = build_dag(tr.meta)
    cross = estimate_edge_delays(tr, dag)
    splits = decompose_trace(tr, dag=dag, cross=cross)
    assert {p for _, p, _ in splits} == {"upper", "lower", "stable"} and len(splits) == 9
    for _, _, b in splits:
        assert b.action_ms + b.dag_idle_ms + b.residual_ms == pytest.approx(b.span_ms)
        assert b.dag_idle_ms >= -1e-9
        for r, rs in b.ranks.items():
            total = rs.offset_ms + rs.action_ms + rs.free_ms + rs.wait_due_ms + rs.wait_late_ms
            assert total == pytest.approx(rs.end_ms), r
            assert rs.offset_late_ms == pytest.approx(0.0, abs=1e-9)  # the runtime starts each rank on time
        assert b.ranks[b.critical_rank].end_ms == pytest.approx(b.span_ms)
    # the stable phase's longer gaps are residual the monitoring-fitted model does not know
    stable = [b for _, p, b in splits if p == "stable"]
    assert min(b.residual_ms for b in stable) > STABLE_EXTRA_MS


def test_decompose_batch_on_a_hand_made_batch():
    """1F1B, pp=2, 2 microbatches, F 10 ms, B 20 ms, link 0.5 ms; rank 1 leaves 0.5 ms between its actions,
    rank 0 0.2 ms before 0F1 and starts each B 0.5 ms after its gradient was due: span 93, DAG 91."""
    tr = synthetic_trace("1F1B", 2, 2, steps=1, f_ms=10, b_ms=20)
    starts = {"0F0": 0.0, "0F1": 10.2, "1F0": 10.5, "1B0": 21.0, "1F1": 41.5, "1B1": 52.0, "0B0": 42.0, "0B1": 73.0}
    recs = {}
    for rec in tr.records:
        if rec.phase == "upper":
            rec.start_ms = starts[rec.action]
            recs[rec.action] = rec
    dag = build_dag(tr.meta)
    cross = {e: 0.5 for e in cross_rank_edges(dag)}
    b = decompose_batch(tr, recs, dag=dag, cross=cross)
    assert (b.span_ms, b.critical_rank, b.action_ms) == (93.0, 0, 60.0)
    assert (b.dag_ms, b.dag_idle_ms, b.residual_ms) == (pytest.approx(91.0), pytest.approx(31.0), pytest.approx(2.0))
    r0, r1 = b.ranks[0], b.ranks[1]
    assert (r0.free_ms, r0.wait_due_ms, r0.wait_late_ms) == (
        pytest.approx(0.2),
        pytest.approx(31.8),
        pytest.approx(1.0),
    )
    assert (r1.offset_ms, r1.offset_late_ms, r1.free_ms, r1.wait_due_ms) == (10.5, 0.0, pytest.approx(1.5), 0.0)
    free = sorted((s.prev, s.action, round(s.gap_ms, 9)) for s in b.gaps if s.free)
    assert free == [("0F0", "0F1", 0.2), ("1B0", "1F1", 0.5), ("1F0", "1B0", 0.5), ("1F1", "1B1", 0.5)]
    # with those gaps on the rank-order edges the DAG is 0.5 ms short: the late start of 0B1 (that of 0B0 is
    # absorbed by 0B1 waiting for its gradient)
    gaps = {("0F0", "0F1"): 0.2, ("1F0", "1B0"): 0.5, ("1B0", "1F1"): 0.5, ("1F1", "1B1"): 0.5}
    with_gaps = decompose_batch(tr, recs, dag=dag, cross=cross, edge_ms=merge_delays(cross, gaps))
    assert with_gaps.residual_ms == pytest.approx(0.5)


def test_only_free_gaps_are_fitted_and_the_statistic_is_the_mean():
    tr = run_timed("GPipe", jitter=0.0)
    samples = gap_samples(tr)
    assert {s.phase for s in samples} == {"upper", "lower"}
    assert any(not s.free for s in samples) and any(s.free for s in samples)
    # bend one free gap per class: the mean moves by its share, the median does not
    one = {}
    for s in samples:
        if s.free:
            one.setdefault(s.cls, s)
    by_cls: dict = {}
    for s in samples:
        if s.free:
            by_cls.setdefault(s.cls, []).append(s.gap_ms)
    model = fit_gap_model(tr)
    median = fit_gap_model(tr, stat="median")
    for c, xs in by_cls.items():
        assert model.costs[c] == pytest.approx(statistics.fmean(xs))
        assert median.costs[c] == pytest.approx(statistics.median(xs))
        assert model.counts[c] == len(xs)
    with pytest.raises(ValueError):
        fit_gap_model(tr, stat="max")


def test_plan_with_gaps_predicts_with_them_and_records_them():
    tr = run_timed("1F1B")
    dag = build_dag(tr.meta)
    plain = plan_from_trace(tr, 0.5, dag=dag)
    plan = plan_from_trace(tr, 0.5, dag=dag, gaps=True)
    merged, model = with_gap_costs(tr, dag, estimate_edge_delays(tr, dag))
    durations = {a: p.duration for a, p in plan.actions.items()}
    assert plan.batch_time_ms["planned"] == pytest.approx(longest_path(dag, durations, merged)[0], rel=1e-9)
    assert plan.batch_time_ms["no_freeze"] > plain.batch_time_ms["no_freeze"]
    assert plan.extra["comm"] == plain.extra["comm"]  # cross-rank edges only
    g = plan.extra["gaps"]
    assert g["edges"] == len(model.edge_delays(dag)) and g["phases"] == ["upper", "lower"] and g["stat"] == "mean"
    assert set(g["classes"]) == {class_name(c) for c in model.costs}
    cross, same = split_delays(dag, merged)
    assert delay_fields(dag, merged)["gaps"]["edges"] == len(same) and len(cross) == plain.extra["comm"]["edges"]
    assert merge_delays({("a", "b"): 1.0}, {("a", "b"): 2.0, ("b", "c"): 1.0}) == {("a", "b"): 3.0, ("b", "c"): 1.0}


def test_without_start_times_gaps_change_nothing():
    tr = synthetic_trace("1F1B", 2, 4, steps=2, jitter=0.05)
    a, b = plan_from_trace(tr, 0.5), plan_from_trace(tr, 0.5, gaps=True)
    assert a.batch_time_ms == b.batch_time_ms and a.actions == b.actions
    assert b.extra["gaps"]["edges"] == 0 and b.extra["gaps"]["classes"] == {}


def test_cli_plan_with_gaps(tmp_path, capsys):
    tr = run_timed("1F1B")
    write_trace(tr, tmp_path / "t")
    assert cli_main(["plan", str(tmp_path / "t"), "--r-max", "0.5", "--out", str(tmp_path / "p.json"), "--gaps"]) == 0
    out = capsys.readouterr().out
    assert "gaps between actions:" in out and "communication:" in out
    assert "classes" in json.loads((tmp_path / "p.json").read_text())["gaps"]
    assert cli_main(["sweep", str(tmp_path / "t"), "--r-max", "0,1", "--gaps"]) == 0
    assert "gaps between actions:" in capsys.readouterr().out
    assert cli_main(["sweep", str(tmp_path / "t"), "--r-max", "0", "--gaps", "--no-comm"]) == 2
    assert "--gaps needs the cross-rank delays" in capsys.readouterr().err


def test_gap_table_pools_by_schedule_phase_and_class():
    tr = run_timed("1F1B", jitter=0.0)
    rows = gap_table([("1F1B", "job", s) for s in gap_samples(tr)])
    keys = [(r["phase"], r["rank"], r["transition"], r["input"]) for r in rows]
    assert len(keys) == len(set(keys)) and keys == sorted(keys)
    for r in rows:
        assert r["q25_ms"] <= r["median_ms"] <= r["q75_ms"] and r["runs"] == 1 and 0 <= r["over_2ms"] <= 1


def test_runtime_planning_step_switch(tmp_path):
    """``timelyfreeze.plan.planning.solve`` with ``PlanSettings.gaps`` (``[freeze.advanced] gap_model``): with it,
    the plan of ``plan_from_trace(gaps=True)`` and the gap edges handed on for re-plans; without it, neither."""
    from tests.test_estimate import plan_settings
    from timelyfreeze.plan import planning
    from timelyfreeze.plan.outcome import PlanFailure

    tr = run_timed("1F1B")
    keys = ("step", "action", "ms", "phase", "freeze_ratio", "start_ms")
    recs: dict[int, list[dict]] = {r: [] for r in range(tr.meta.pp_degree)}
    for x in tr.records:
        if x.phase in ("upper", "lower"):
            recs[x.rank].append({k: getattr(x, k) for k in keys})
    dag = build_dag(tr.meta)
    for gaps in (False, True):
        path = tmp_path / f"{gaps}.json"
        settings = plan_settings(estimator="median", gaps=gaps)
        result = planning.solve(tr.meta.to_json(), recs, settings, tmp_path / "t", path)
        assert not isinstance(result, PlanFailure)
        want = plan_from_trace(tr, 0.5, estimator="median", gaps=gaps, anchor=True)
        assert result.batch_time_ms["planned"] == pytest.approx(want.batch_time_ms["planned"], rel=1e-9)
        same = [(u, v) for u, v, _ in result.edge_ms if dag.nodes[u]["rank"] == dag.nodes[v]["rank"]]
        assert bool(same) == gaps and ("gaps" in json.loads(path.read_text())) == gaps


def test_gap_report_on_a_fake_job(tmp_path):
    """``scripts/gap_eval.py``'s logic on one job folder made from a synthetic timed trace: the runtime's
    prediction in ``metrics.jsonl`` is the re-solved plan's, and the gap model explains the monitoring
    batches (their replay error is 0 with it)."""
    from timelyfreeze.experiments.studies.gap_eval import evaluate_job
    from timelyfreeze.experiments.studies.gap_report import main as report_main

    tr = run_timed("1F1B", jitter=0.0)
    out = tmp_path / "jobs" / "1F1B__timelyfreeze__r_max=0.5__seed=0" / "dump" / "timelyfreeze"
    write_trace(tr, out / "trace")
    planned = plan_from_trace(tr, 0.5).batch_time_ms["planned"]
    (out / "summary.json").write_text(json.dumps({"method": "timelyfreeze", "knob": {"name": "r_max", "value": 0.5}}))
    phase = {r.step: r.phase for r in tr.records}
    rows = [{"step": k, "phase": p, "replans": 0, "predicted_batch_ms": planned} for k, p in sorted(phase.items())]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    row = evaluate_job(out.parents[1])
    assert row["plan_matches"] and row["stable_steps"] == 3 and row["gap_edges"] > 0
    assert row["upper_err_new"] == pytest.approx(0.0, abs=1e-9) and row["upper_err_old"] > 0.001
    assert row["stable_err_new"] < row["stable_err_old"]
    md = tmp_path / "g.md"
    assert report_main(["--jobs", str(tmp_path / "jobs"), "--out", str(md)]) == 0
    text = md.read_text()
    assert text.startswith("# Gap model") and "python scripts/gap_eval.py" in text and "| 1F1B | 1 |" in text
    assert len(md.with_suffix(".csv").read_text().splitlines()) == 2
    assert report_main(["--jobs", str(tmp_path / "none"), "--out", str(md)]) == 2


def test_ranks_on_two_hosts_give_only_the_gaps_that_need_no_other_clock():
    tr = run_timed("1F1B", jitter=0.0)
    tr.meta.extra["hosts"] = ["a", "b"]
    dag = build_dag(tr.meta)
    receives = {v for _, v in cross_rank_edges(dag)}
    samples = gap_samples(tr, dag=dag, cross={})
    assert samples and all(s.action not in receives and s.free for s in samples)
    assert decompose_trace(tr, dag=dag, cross={}) == []
