"""Figures from a trace's timestamps (``planner.timing.spans``): spans, the F factor, the shares in ``summary.json``,
and the measured timeline panels, on a committed run's trace (its records carry ``start_ms``)."""

from __future__ import annotations

import copy
import json
import statistics
from pathlib import Path

import pytest

from planner.cli import main
from planner.gantt import NO_TIMESTAMPS, measured_panel, plot_timeline
from planner.plan import load_plan
from planner.schedule.dag import build_dag
from planner.timing.spans import (
    achieved_share,
    dag_f_factor,
    f_factor,
    phase_spans,
    rank_f_factors,
    representative_step,
    step_spans,
    step_timeline,
)
from planner.trace.archive import unpack_trace
from planner.trace.load import Trace, load_trace
from planner.trace.simulate import synthetic_trace, write_trace
from timelyfreeze.outputs import timeline
from timelyfreeze.outputs.summary import build, format_summary

JOB = (
    Path(__file__).resolve().parent.parent
    / "docs/results/comparison/jobs/1F1B__timelyfreeze__r_max=0.8__seed=0/dump/timelyfreeze"
)


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory) -> Path:
    """The committed job's trace (packed in the repository) as a folder of its own, for tests that read its files."""
    return unpack_trace(JOB / "trace.tar.gz", tmp_path_factory.mktemp("spans") / "trace")


@pytest.fixture(scope="module")
def trace():
    return load_trace(JOB / "trace.tar.gz")


def raw_records(folder: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(folder.glob("actions_rank*.jsonl")) for line in f.open()]


def test_the_committed_trace_has_timestamps(trace) -> None:
    assert all(r.start_ms is not None for r in trace.records) and len(set(trace.meta.hosts)) == 1


def test_step_span_is_first_start_to_last_end_over_every_rank(trace, trace_dir) -> None:
    by_step: dict[int, list[dict]] = {}
    for r in raw_records(trace_dir):
        by_step.setdefault(r["step"], []).append(r)
    want = {k: max(r["start_ms"] + r["ms"] for r in v) - min(r["start_ms"] for r in v) for k, v in by_step.items()}
    got = step_spans(trace)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], abs=1e-6)
    phases = phase_spans(trace, got)
    stable = [got[k] for k, v in by_step.items() if v[0]["phase"] == "stable"]
    assert phases["stable"] == pytest.approx(statistics.median(stable))


def test_spans_need_one_host_and_timestamps(trace) -> None:
    other = copy.copy(trace)
    other.meta = copy.deepcopy(trace.meta)
    other.meta.extra["hosts"] = ["node-a", "node-b"]
    assert step_spans(other) == {} and phase_spans(other) == {}
    assert step_spans(synthetic_trace("1F1B", 2, 4)) == {}  # synthetic traces carry no start_ms


def test_representative_step_is_the_median_span_step(trace) -> None:
    spans = step_spans(trace)
    k = representative_step(trace, "stable", spans)
    stable = [ms for s, ms in spans.items() if s in range(17, 49)]  # the run's stable steps (summary.json)
    assert spans[k] == statistics.median_low(stable)
    tl = step_timeline(trace, k)
    assert tl.span_ms == pytest.approx(spans[k]) and min(x for _, _, x, _ in tl.boxes) == 0.0
    assert len(tl.boxes) == len(trace.meta.all_actions()) and representative_step(trace, "nosuchphase") is None


def test_f_factor_is_the_ratio_of_median_forward_times(trace, trace_dir) -> None:
    f = {
        p: [r["ms"] for r in raw_records(trace_dir) if r["phase"] == p and r["action"][1] == "F"]
        for p in ("upper", "stable")
    }
    assert f_factor(trace) == pytest.approx(statistics.median(f["stable"]) / statistics.median(f["upper"]))
    assert f_factor(trace, "nosuchphase") is None


def test_each_rank_has_its_own_f_factor_and_the_dag_combines_them(trace) -> None:
    def ratios(rank: int, recs) -> list[float]:
        ms: dict[tuple[str, str], list[float]] = {}
        for r in recs:
            if r.rank == rank and r.action[1] == "F":
                ms.setdefault((r.phase, r.action), []).append(r.ms)
        return [statistics.median(v) / statistics.median(ms[("upper", a)]) for (p, a), v in ms.items() if p == "stable"]

    factors = rank_f_factors(trace)
    assert factors == {r: pytest.approx(statistics.median(ratios(r, trace.records))) for r in (0, 1)}
    # rank 1's forwards 30 % slower in the stable phase: only its factor moves
    recs = [copy.copy(r) for r in trace.records]
    for r in recs:
        if r.rank == 1 and r.phase == "stable":
            r.ms *= 1.3
    slowed = Trace(trace.meta, recs, trace.source)
    assert rank_f_factors(slowed) == {0: pytest.approx(factors[0]), 1: pytest.approx(1.3 * factors[1])}
    plan = load_plan(JOB / "plan.json")
    durations = {a: ap.duration for a, ap in plan.actions.items()}
    dag = build_dag(trace.meta)
    f = dag_f_factor(slowed, durations, dag)
    lo, hi = sorted(rank_f_factors(slowed).values())
    assert lo <= f <= hi  # no delays on edges: the longest path scales between the slowest and fastest rank
    same = Trace(trace.meta, [r for r in trace.records if r.rank == 0 or r.phase != "stable"], trace.source)
    assert dag_f_factor(same, durations, dag) is None  # rank 1 has no stable forwards: no factor


def test_achieved_share() -> None:
    assert achieved_share(1.1, 1.2) == pytest.approx(0.5)
    assert achieved_share(1.1, 1.0) is None and achieved_share(None, 1.2) is None


def kw_of(s: dict, history: list[dict]) -> dict:
    run = {k: s[k] for k in ("method", "schedule", "pp_degree", "num_stages", "num_microbatches")}
    kw = dict(history=history, steady_phases=("stable",), tokens_per_step=s["tokens_per_step"], run=run)
    return kw | dict(predicted_batch_ms=s["predicted_batch_ms"], val_curve=[], method_summary={}, failures=[])


def summary_of(trace):
    s = json.loads((JOB / "summary.json").read_text())
    history = [m for m in map(json.loads, (JOB / "metrics.jsonl").read_text().splitlines()) if "phase" in m]
    kw = kw_of(s, history)
    return build(**kw, trace=trace), build(**kw), history, s


def test_summary_gives_speedups_shares_and_spans(trace) -> None:
    with_trace, without, history, old = summary_of(trace)
    med = {p: statistics.median(h["batch_ms"] for h in history if h["phase"] == p) for p in ("upper", "stable")}
    pred = old["predicted_batch_ms"]["no_freeze"] / old["predicted_batch_ms"]["planned"]
    sp = with_trace["speedup"]
    f = f_factor(trace)
    assert sp["predicted"] == pytest.approx(pred) and sp["measured"] == pytest.approx(med["upper"] / med["stable"])
    assert sp["f_factor"] == pytest.approx(f)
    assert sp["share"] == pytest.approx((sp["measured"] - 1) / (pred - 1))
    assert sp["share_f_corrected"] == pytest.approx((sp["measured"] * f - 1) / (pred - 1))
    spans = phase_spans(trace)
    assert with_trace["span_ms"] == pytest.approx(spans)
    assert sp["measured_span"] == pytest.approx(spans["upper"] / spans["stable"])
    assert sp["share_span"] == pytest.approx((sp["measured_span"] - 1) / (pred - 1))
    assert with_trace["step_span_ms"][0][0] == 1 and len(with_trace["step_span_ms"]) == old["steps"]
    assert with_trace["phases"] == old["phases"]  # existing fields kept
    for key in ("mean_batch_ms", "predicted_batch_ms", "avg_freeze_ratio"):
        assert with_trace[key] == pytest.approx(old[key])
    text = format_summary(with_trace)
    assert "pipeline span from timestamps" in text and "share of the predicted speedup" in text
    # the F factor through the plan's DAG, where known, is the one the corrected shares take out
    dag = build(**kw_of(old, history), trace=trace, f_factor_dag=1.25)["speedup"]
    assert dag["f_factor"] == pytest.approx(f) and dag["f_factor_dag"] == 1.25
    assert dag["share_span_f_corrected"] == pytest.approx((sp["measured_span"] * 1.25 - 1) / (pred - 1))
    # without the trace: no spans, no F factor; the wall-time speed-up and share stay
    assert without["span_ms"] == {} and without["step_span_ms"] == []
    assert without["speedup"]["f_factor"] is None and without["speedup"]["share_f_corrected"] is None
    assert without["speedup"]["share"] == pytest.approx(sp["share"])
    assert "n/a" in format_summary(without)


def test_measured_panel_ends_at_the_representative_steps_span(trace, tmp_path) -> None:
    spans = step_spans(trace)
    panels = [measured_panel(trace, p, spans) for p in ("upper", "stable")]
    times = plot_timeline(trace.meta, [p[:2] for p in panels], tmp_path / "t.png", ratios=[p[2] for p in panels])
    for p, t in zip(("upper", "stable"), times):
        assert t == pytest.approx(spans[representative_step(trace, p, spans)], abs=1e-6)
    assert "median span" in panels[1][0] and (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


def test_gantt_cli_draws_measured_panels_from_timestamps(tmp_path, capsys) -> None:
    assert (
        main(["gantt", str(JOB / "trace.tar.gz"), "--plan", str(JOB / "plan.json"), "--out", str(tmp_path / "g.png")])
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    trace = load_trace(JOB / "trace.tar.gz")
    spans = step_spans(trace)
    stable = [line for line in out if line.startswith("measured, stable phase")]
    assert len(stable) == 1 and NO_TIMESTAMPS not in stable[0]
    assert float(stable[0].split("measured span ")[1].split()[0]) == pytest.approx(
        spans[representative_step(trace, "stable", spans)], abs=1e-3
    )
    assert any(line.startswith("planned") for line in out)


def test_gantt_cli_without_timestamps_keeps_the_medians_and_says_so(tmp_path, capsys) -> None:
    root = write_trace(synthetic_trace("1F1B", 2, 4, stable_ratio=0.5), tmp_path / "t")
    assert main(["gantt", str(root), "--out", str(tmp_path / "g.png")]) == 0
    out = capsys.readouterr().out
    assert out.count(NO_TIMESTAMPS) == 2 and "measured span" not in out


def test_timeline_draws_from_timestamps_or_says_it_did_not(trace, trace_dir, tmp_path, monkeypatch) -> None:
    drawn = []
    monkeypatch.setattr(timeline, "plot_timeline", lambda meta, panels, out, ratios: drawn.append(panels))
    medians = timeline.merge([timeline.phase_medians(f) for f in sorted(trace_dir.glob("actions_rank*.jsonl"))])
    meta = trace.meta.to_json()
    args = (meta, medians, JOB / "plan.json", trace_dir, tmp_path / "t.png", print)
    assert timeline.draw(*args, trace) and timeline.draw(*args)
    with_trace, without = drawn
    assert [t.startswith("measured") for t, _ in with_trace] == [True, False, True]
    assert all(NO_TIMESTAMPS not in t for t, _ in with_trace) and "median span" in with_trace[2][0]
    assert NO_TIMESTAMPS in without[0][0] and NO_TIMESTAMPS in without[2][0]


def test_the_reports_timeline_is_the_gantt_commands(tmp_path) -> None:
    from timelyfreeze.experiments.sweep.predictions import Planner

    Planner().gantt(JOB / "trace.tar.gz", JOB / "plan.json", tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_the_runtime_takes_the_plans_durations_and_delays(trace, tmp_path) -> None:
    from timelyfreeze.runtime.freeze_runtime import _plan_f_factor

    logged: list[str] = []
    f = _plan_f_factor(trace, JOB / "plan.json", logged.append)
    lo, hi = sorted(rank_f_factors(trace).values())
    # delays on edges (not scaled) keep the factor between the ranks' factors and 1
    assert f is not None and min(lo, 1.0) <= f <= max(hi, 1.0) and not logged
    assert _plan_f_factor(trace, tmp_path / "none.json", logged.append) is None and not logged  # no plan made
    (tmp_path / "bad.json").write_text("{}")
    assert _plan_f_factor(trace, tmp_path / "bad.json", logged.append) is None
    assert len(logged) == 1 and "bad.json" in logged[0]
