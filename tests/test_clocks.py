"""Clocks across hosts: the clock's key (boot id), the NTP-style offset estimate, ``meta.json``'s ``clock_sync``
and the planner's alignment (spans, delays, gaps on aligned times; cross-host edges their own link value)."""

from __future__ import annotations

import pytest

from planner.errors import PlannerError
from planner.timing.comm import estimate_edge_delays
from planner.timing.gaps import fit_gap_model
from planner.timing.spans import step_spans
from planner.trace.clocks import error_bound_ms, offset_at
from planner.trace.load import trace_from_records
from tests.test_comm import timed_trace
from timelyfreeze.runtime.clock_sync import BOOT_ID_ENV, best_offset, clock_id

HOSTS4 = ["a", "a", "b", "b"]


def shifted(trace, offsets: list[float], sync: dict | None, hosts=HOSTS4):
    """``trace`` with rank r's starts moved by ``offsets[r]`` (another host's clock), ``hosts`` and ``sync``."""
    recs: dict[int, list[dict]] = {r: [] for r in range(trace.meta.pp_degree)}
    for rec in trace.records:
        fields = {k: getattr(rec, k) for k in ("step", "action", "ms", "phase", "freeze_ratio")}
        recs[rec.rank].append(fields | {"start_ms": rec.start_ms + offsets[rec.rank]})
    meta = trace.meta.to_json() | {"hosts": hosts} | ({"clock_sync": sync} if sync else {})
    return trace_from_records(meta, recs)


def test_clock_id_is_the_boot_id_then_the_host_name(tmp_path, monkeypatch):
    monkeypatch.delenv(BOOT_ID_ENV, raising=False)
    f = tmp_path / "boot_id"
    f.write_text("1234-abcd\n")
    assert clock_id(str(f)) == ("1234-abcd", "boot_id")
    name, key = clock_id(str(tmp_path / "missing"))
    assert key == "hostname" and name
    monkeypatch.setenv(BOOT_ID_ENV, "fake")
    assert clock_id(str(f)) == ("fake", "boot_id")


def test_best_round_trip_gives_offset_and_bound():
    # remote clock = rank 0's + 250; round trips of 10, 2 and 6 ms, the answer anywhere inside each
    trips = [(0.0, 253.0, 10.0), (20.0, 271.5, 22.0), (30.0, 285.0, 36.0)]
    offset, err = best_offset(trips)
    assert (offset, err) == (250.5, 1.0) and abs(offset - 250.0) <= err


def test_offset_is_linear_between_samples():
    s = [{"step": 2, "offset_ms": [0.0, 10.0]}, {"step": 6, "offset_ms": [0.0, 30.0]}]
    assert [offset_at(s, 1, k) for k in (1, 2, 4, 6, 9)] == [10.0, 10.0, 20.0, 30.0, 30.0]


def test_aligned_trace_has_the_spans_delays_and_gaps_of_one_clock():
    base = timed_trace("1F1B", 4, 4, lambda es: {e: 0.25 for e in es}, steps=4)
    base.records = [r.__class__(**{**r.__dict__, "phase": "upper"}) for r in base.records]
    sync = {
        "key": "boot_id",
        "samples": [{"step": 1, "offset_ms": [0, 0, 250, 250], "error_ms": [0, 0, 0.1, 0.1]}],
    }
    aligned = shifted(base, [0, 0, 250, 250], sync)
    assert error_bound_ms(aligned.meta) == 0.1
    assert step_spans(aligned) == pytest.approx(step_spans(base))
    assert estimate_edge_delays(aligned) == pytest.approx(estimate_edge_delays(base), abs=1e-9)
    assert fit_gap_model(aligned).costs == pytest.approx(fit_gap_model(base).costs, abs=1e-9)
    unaligned = shifted(base, [0, 0, 250, 250], None)
    assert step_spans(unaligned) == {}


def test_cross_host_edges_get_their_own_link_value():
    """Ranks 0, 1 on host a and 2, 3 on host b, aligned: the edges between hosts take 2 ms, the others 0.25 ms.
    An edge without an uncensored sample takes the link value of its own kind, so every cross-host edge gets
    2 ms and every other 0.25 ms (before, an unmeasured cross-host edge took the pooled median)."""
    rank = {f"{s}": s for s in range(4)}

    def cross(e):
        return {rank[e[0][0]], rank[e[1][0]]} == {1, 2}

    base = timed_trace("GPipe", 4, 4, lambda es: {e: (2.0 if cross(e) else 0.25) for e in es})
    sync = {"key": "boot_id", "samples": [{"step": 1, "offset_ms": [0, 0, 0, 0], "error_ms": [0, 0, 0, 0]}]}
    got = estimate_edge_delays(shifted(base, [0, 0, 0, 0], sync))
    assert got == pytest.approx({e: (2.0 if cross(e) else 0.25) for e in got}, abs=1e-9)


@pytest.mark.parametrize(
    "sync",
    [
        [],
        {"key": "ntp", "samples": []},
        {"key": "boot_id", "samples": [{"step": 1, "offset_ms": [0.0], "error_ms": [0.0, 0.0]}]},
        {"key": "boot_id", "samples": [{"step": 1, "offset_ms": [0.0, 1.0], "error_ms": [0.0, -1.0]}]},
        {"key": "boot_id", "samples": [{"step": 2, "offset_ms": [0, 1], "error_ms": [0, 1]}] * 2},
    ],
)
def test_bad_clock_sync_is_one_error(sync):
    meta = timed_trace("1F1B", 2, 2, lambda es: {}).meta.to_json() | {"clock_sync": sync}
    with pytest.raises(PlannerError, match="clock_sync"):
        trace_from_records(meta, {0: [], 1: []})
