"""Start times on one clock: the trace's clock offsets applied (``meta.json`` field ``clock_sync``; no torch).

``start_ms`` is each host's monotonic clock. The runtime measures every pipeline rank's clock against global
rank 0's at a few steps (``clock_sync.samples``: per step, an ``offset_ms`` and an ``error_ms`` bound per rank
of replica 0; ``timelyfreeze.runtime.clock_sync``). A record of step ``k`` of rank ``r`` (replica 0) then
starts at ``start_ms - offset_r(k)`` on rank 0's clock, ``offset_r(k)`` interpolated linearly in the step
between the two samples around ``k`` (the nearest one outside them), so a clock that drifts between the ends
of a monitoring window is followed. :func:`align_records` does that when a trace is loaded
(``planner.trace.load``), so the spans, the gap model and the communication delays read aligned times;
records of other replicas keep their own clocks (only replica 0's ranks are measured, and only replica 0's
records are used for times across ranks).

Two ranks' start times compare when they share a clock (``hosts``: the clock of each rank, a boot id) or the
trace has clock samples (:func:`same_clock`, :func:`comparable`); the alignment is then good to the samples'
``error_ms`` (:func:`error_bound_ms`).
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any

__all__ = ["align_records", "comparable", "error_bound_ms", "offset_at", "same_clock", "samples"]


def samples(meta: Any) -> list[dict]:
    """The trace's clock samples, by step (``[]`` without any)."""
    sync = meta.extra.get("clock_sync") if hasattr(meta, "extra") else None
    return sorted(sync["samples"], key=lambda s: s["step"]) if sync else []


def offset_at(sampled: list[dict], rank: int, step: int) -> float:
    """Rank ``rank``'s offset (ms) at ``step``: linear between the samples around it, the nearest outside."""
    steps = [s["step"] for s in sampled]
    i = bisect.bisect_left(steps, step)
    if i < len(steps) and steps[i] == step:
        return float(sampled[i]["offset_ms"][rank])
    if i == 0:
        return float(sampled[0]["offset_ms"][rank])
    if i == len(steps):
        return float(sampled[-1]["offset_ms"][rank])
    a, b = sampled[i - 1], sampled[i]
    w = (step - a["step"]) / (b["step"] - a["step"])
    return float(a["offset_ms"][rank] + w * (b["offset_ms"][rank] - a["offset_ms"][rank]))


def align_records(meta: Any, records: list) -> list:
    """``records`` (``planner.trace.load.Record``) with replica 0's ``start_ms`` on rank 0's clock; the same
    list when the trace has no clock samples."""
    sampled = samples(meta)
    if not sampled:
        return records
    memo: dict[tuple[int, int], float] = {}
    out = []
    for rec in records:
        if rec.replica != 0 or rec.start_ms is None:
            out.append(rec)
            continue
        key = (rec.rank, rec.step)
        off = memo.get(key)
        if off is None:
            off = memo[key] = offset_at(sampled, rec.rank, rec.step)
        out.append(dataclasses.replace(rec, start_ms=rec.start_ms - off) if off else rec)
    return out


def same_clock(meta: Any, a: int, b: int) -> bool:
    """True when pipeline ranks ``a`` and ``b`` (replica 0) have start times on one clock: one host
    (``hosts``; without it one host is assumed), or the trace's clock samples align them."""
    hosts = meta.hosts
    return hosts is None or hosts[a] == hosts[b] or bool(samples(meta))


def comparable(meta: Any) -> bool:
    """True when the start times of every rank of replica 0 compare (:func:`same_clock` for all of them)."""
    hosts = meta.hosts
    return hosts is None or len(set(hosts)) <= 1 or bool(samples(meta))


def error_bound_ms(meta: Any) -> float:
    """The largest ``error_ms`` of the trace's clock samples (0 without any): how far aligned start times of
    two ranks on different clocks may be off."""
    return max((e for s in samples(meta) for e in s["error_ms"]), default=0.0)
