"""planner.trace.simulate, planner.rmax_sweep and planner.gantt (no torch needed)."""

from __future__ import annotations

import csv

import pytest

import planner.rmax_sweep as sweep_mod
from planner.errors import PlannerError
from planner.gantt import plot_timeline
from planner.rmax_sweep import check_r_values, format_table, plot_sweep, sweep, write_csv
from planner.trace.load import load_trace, node_weights
from planner.trace.simulate import simulate_batch, synthetic_trace, write_trace

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------- simulate


def test_synthetic_model_numbers():
    w = node_weights(
        synthetic_trace("1F1B", 2, 2, f_ms=1.0, b_ms=2.0, w_share=0.5, lower_share=0.3, stage_scale=[1.0, 2.0])
    )
    assert w.w_max["0F1"] == w.w_min["0F1"] == 1.0
    assert w.w_max["1F0"] == 2.0
    assert w.w_max["0B0"] == 2.0 and w.w_min["0B0"] == pytest.approx(1.0 + 0.3 * 1.0)
    assert w.w_max["1B1"] == 4.0 and w.w_min["1B1"] == pytest.approx(2.0 + 0.3 * 2.0)
    assert w.freezable == {"0B0", "0B1", "1B0", "1B1"}

    # Split backward: I is the input-grad part (never shrinks), W the weight-grad part, B = I + W.
    z = node_weights(synthetic_trace("ZBVZeroBubble", 2, 2, w_share=0.25, lower_share=0.0))
    assert z.w_max["3I1"] == z.w_min["3I1"] == pytest.approx(1.5)
    assert z.w_max["3W1"] == pytest.approx(0.5) and z.w_min["3W1"] == 0.0
    assert z.freezable == {a for a in z.w_max if "W" in a}


def test_synthetic_phases_steps_and_jitter():
    tr = synthetic_trace("GPipe", 2, 3, jitter=0.2, seed=7, steps=2, stable_ratio=0.5)
    phases = {(r.step, r.phase) for r in tr.records}
    assert phases == {(1, "upper"), (2, "upper"), (3, "lower"), (4, "lower"), (5, "stable"), (6, "stable")}
    assert len(tr.records) == 6 * 12
    for rec in tr.records:
        kind = rec.action[1]
        expected = {"upper": 0.0, "lower": 1.0, "stable": 0.5}[rec.phase] if kind == "B" else 0.0
        assert rec.freeze_ratio == expected
        nominal = 1.0 if kind == "F" else 2.0 - 0.7 * rec.freeze_ratio  # B = I + W*(1 - 0.7 r)
        assert nominal * 0.8 - 1e-9 <= rec.ms <= nominal * 1.2 + 1e-9
    again = synthetic_trace("GPipe", 2, 3, jitter=0.2, seed=7, steps=2, stable_ratio=0.5)
    assert [r.ms for r in again.records] == [r.ms for r in tr.records]
    other = synthetic_trace("GPipe", 2, 3, jitter=0.2, seed=8, steps=2, stable_ratio=0.5)
    assert [r.ms for r in other.records] != [r.ms for r in tr.records]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"w_share": 1.5}, "w_share"),
        ({"lower_share": -0.1}, "lower_share"),
        ({"jitter": 1.0}, "jitter"),
        ({"f_ms": float("nan")}, "f_ms"),
        ({"stage_scale": [1.0]}, "stage_scale"),
        ({"steps": 0}, "steps"),
    ],
)
def test_synthetic_rejects_bad_parameters(kwargs, message):
    with pytest.raises(PlannerError, match=message):
        synthetic_trace("1F1B", 2, 4, **kwargs)


def test_write_trace_round_trip(tmp_path):
    tr = synthetic_trace("Interleaved1F1B", 2, 4, jitter=0.1, stable_ratio=0.3)
    out = write_trace(tr, tmp_path / "t")
    back = load_trace(out)
    assert back.meta.to_json() == tr.meta.to_json()
    key = lambda r: (r.rank, r.step, r.action)  # noqa: E731
    assert [(r.rank, r.step, r.action, r.ms, r.phase, r.freeze_ratio) for r in sorted(back.records, key=key)] == [
        (r.rank, r.step, r.action, r.ms, r.phase, r.freeze_ratio) for r in sorted(tr.records, key=key)
    ]
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == [
        "actions_rank0.jsonl",
        "actions_rank1.jsonl",
        "meta.json",
    ]
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(PlannerError, match="cannot create trace directory"):
        write_trace(tr, blocker / "sub")


def test_simulate_batch_gpipe_by_hand():
    meta = synthetic_trace("GPipe", 2, 2).meta
    d = {"0F0": 1, "0F1": 1, "1F0": 1, "1F1": 1, "1B0": 2, "1B1": 2, "0B0": 2, "0B1": 2}
    # rank1: F0 [1,2] F1 [2,3] B0 [3,5] B1 [5,7]; rank0: B0 [5,7] B1 [7,9]
    assert simulate_batch(meta, d) == pytest.approx(9.0)
    d["1B0"] = 3.0
    assert simulate_batch(meta, d) == pytest.approx(10.0)


# ---------------------------------------------------------------------------------------- sweep


@pytest.fixture(scope="module")
def imbalanced():
    tr = synthetic_trace("1F1B", 4, 8, stage_scale=[1.0, 1.3, 0.8, 1.1], jitter=0.05, seed=3)
    return tr.meta, node_weights(tr)


def test_sweep_rows(imbalanced, monkeypatch):
    meta, w = imbalanced
    built = []
    real = sweep_mod.build_dag
    monkeypatch.setattr(sweep_mod, "build_dag", lambda m: built.append(m) or real(m))
    r_values = [0.0, 0.1, 0.25, 0.5, 0.75, 1.0]
    rows = sweep(meta, w, r_values)
    assert len(built) == 1, "one DAG for the whole sweep"
    assert [r.r_max for r in rows] == r_values
    no_freeze = simulate_batch(meta, w.w_max)
    all_frozen = simulate_batch(meta, w.w_min)
    assert rows[0].batch_ms == pytest.approx(no_freeze) and rows[0].speedup == pytest.approx(1.0)
    assert rows[0].mean_ratio == pytest.approx(0.0, abs=1e-7)
    assert rows[-1].batch_ms == pytest.approx(all_frozen, rel=1e-6)
    for a, b in zip(rows, rows[1:]):
        assert b.batch_ms <= a.batch_ms + 1e-7
        assert b.speedup >= a.speedup - 1e-9
    assert rows[2].speedup > 1.01
    for row in rows:
        assert row.speedup == pytest.approx(no_freeze / row.batch_ms)
        assert row.throughput_gain == pytest.approx(row.speedup - 1)
        assert -1e-7 <= row.mean_ratio <= row.r_max + 1e-7
        assert (row.no_freeze_ms, row.all_frozen_ms) == (pytest.approx(no_freeze), pytest.approx(all_frozen))
    table = format_table(rows)
    assert table.count("\n| ") == len(rows) and "| 0.25 |" in table


@pytest.mark.parametrize("bad", ([1.5], [-0.1], [float("nan")], ["0.5"], [True], []))
def test_sweep_rejects_bad_r_values(bad):
    with pytest.raises(PlannerError):
        check_r_values(bad)


def test_csv_and_plot(imbalanced, tmp_path):
    meta, w = imbalanced
    rows = sweep(meta, w, [0.0, 0.5, 1.0])
    write_csv(rows, tmp_path / "s.csv")
    with open(tmp_path / "s.csv", newline="") as f:
        parsed = list(csv.DictReader(f))
    assert [float(p["r_max"]) for p in parsed] == [0.0, 0.5, 1.0]
    assert [float(p["batch_ms"]) for p in parsed] == pytest.approx([r.batch_ms for r in rows], rel=1e-8)
    plot_sweep(rows, tmp_path / "s.png")
    data = (tmp_path / "s.png").read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    with pytest.raises(PlannerError, match="no sweep rows"):
        plot_sweep([], tmp_path / "empty.png")
    with pytest.raises(PlannerError, match="s.csv"):
        write_csv(rows, tmp_path / "missing-dir" / "s.csv")


# ---------------------------------------------------------------------------------------- gantt


def test_plot_timeline(imbalanced, tmp_path):
    meta, w = imbalanced
    half = {a: (w.w_max[a] + w.w_min[a]) / 2 for a in w.w_max}
    ratios = {a: (0.5 if a in w.freezable else 0.0) for a in w.w_max}
    out = tmp_path / "t.png"
    times = plot_timeline(meta, [("upper", w.w_max), ("half frozen", half)], out, ratios=[None, ratios])
    assert times == [pytest.approx(simulate_batch(meta, w.w_max)), pytest.approx(simulate_batch(meta, half))]
    assert times[1] < times[0]
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 20_000
    assert not list(tmp_path.glob("*.tmp*"))


def test_plot_timeline_errors(imbalanced, tmp_path):
    meta, w = imbalanced
    with pytest.raises(PlannerError, match="one per panel"):
        plot_timeline(meta, [("a", w.w_max)], tmp_path / "x.png", ratios=[None, None])
    incomplete = dict(w.w_max)
    incomplete.pop("2B3")
    with pytest.raises(PlannerError, match="2B3"):
        plot_timeline(meta, [("a", incomplete)], tmp_path / "x.png")
    with pytest.raises(PlannerError, match="no timeline panels"):
        plot_timeline(meta, [], tmp_path / "x.png")
    with pytest.raises(PlannerError, match="x.png"):
        plot_timeline(meta, [("a", w.w_max)], tmp_path / "nodir" / "x.png")
