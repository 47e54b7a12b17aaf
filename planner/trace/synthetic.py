"""Synthetic pipeline workloads without torch: valid per-rank orders and seeded node weights.

Used by the tests and ``scripts/bench_planner.py`` to exercise the DAG/LP on any placement
(looped, V-shaped, random) and size.  The orders come from a small list-scheduling simulation, so they
are always executable (the DAG is acyclic); they resemble, but are not, the exact torch schedules
(``planner/schedule/orders.py`` has those).
"""

from __future__ import annotations

import heapq
import random

from planner.errors import PlannerError
from planner.schedule.actions import PAIR, parse_action
from planner.trace.load import NodeWeights, TraceMeta


def placement(pp: int, stages_per_rank: int, kind: str = "looped") -> list[int]:
    """``stage_to_rank`` for ``pp * stages_per_rank`` stages: ``looped`` (stage s on rank s % pp) or
    ``v`` (V-shape: down the ranks, then back up, as ZBV places its two chunks)."""
    n = pp * stages_per_rank
    if kind == "looped":
        return [s % pp for s in range(n)]
    if kind == "v":
        out = []
        for s in range(n):
            chunk, pos = divmod(s, pp)
            out.append(pos if chunk % 2 == 0 else pp - 1 - pos)
        return out
    raise ValueError(f"unknown placement {kind!r}")


def list_schedule_orders(
    stage_to_rank: list[int],
    num_microbatches: int,
    split_backward: bool,
    policy: str = "1f1b",
    durations: dict[str, float] | None = None,
) -> dict[int, list[str]]:
    """Per-rank action orders from a list-scheduling simulation.

    ``policy="1f1b"``: backward first, at most ``num_stages - s`` microbatches in flight at stage ``s``,
    weight-grad (W) work only when nothing else is ready.  ``policy="gpipe"``: forwards first, no cap.
    ``durations`` (default F=1, B=2, I=1, W=1) only shape the interleaving.
    """
    if policy not in ("1f1b", "gpipe"):
        raise ValueError(f"unknown policy {policy!r}")
    n_st, n_mb = len(stage_to_rank), num_microbatches
    pp = max(stage_to_rank) + 1
    bk = "I" if split_backward else "B"

    def dur(a: str, kind: str) -> float:
        if durations is not None:
            return durations[a]
        return 2.0 if kind == "B" else 1.0

    cls = {"F": 1, bk: 0, "W": 2} if policy == "1f1b" else {"F": 0, bk: 1, "W": 2}
    ready: list[list[tuple]] = [[] for _ in range(pp)]
    done: set[tuple[int, str, int]] = set()
    bdone = [0] * n_st  # backward (B/I) actions finished per stage
    blocked_f: dict[int, list[int]] = {s: [] for s in range(n_st)}  # F waiting only on the in-flight cap
    fstarted = [0] * n_st

    def cap(s: int) -> int:
        return n_st - s if policy == "1f1b" else n_mb

    def push(s: int, kind: str, m: int) -> None:
        if kind == "F" and fstarted[s] - bdone[s] >= cap(s):
            blocked_f[s].append(m)
            return
        if kind == "F":
            fstarted[s] += 1
        key = (cls[kind], m, -s if kind != "F" else s)
        heapq.heappush(ready[stage_to_rank[s]], (key, s, kind, m))

    for m in range(n_mb):
        push(0, "F", m)
    orders: dict[int, list[str]] = {r: [] for r in range(pp)}
    busy = [False] * pp
    events: list[tuple[float, int, int, str, int]] = []
    t = 0.0
    total = n_st * n_mb * (3 if split_backward else 2)
    finished = 0
    seq = 0
    while finished < total:
        for r in range(pp):
            if not busy[r] and ready[r]:
                _, s, kind, m = heapq.heappop(ready[r])
                name = f"{s}{kind}{m}"
                orders[r].append(name)
                busy[r] = True
                seq += 1
                heapq.heappush(events, (t + dur(name, kind), seq, s, kind, m))
        if not events:
            raise PlannerError("synthetic schedule deadlocked")  # pragma: no cover - policy bug
        t, _, s, kind, m = heapq.heappop(events)
        busy[stage_to_rank[s]] = False
        finished += 1
        done.add((s, kind, m))
        if kind == "F":
            if s + 1 < n_st:
                push(s + 1, "F", m)
            if s == n_st - 1 or (s + 1, bk, m) in done:
                push(s, bk, m)
        elif kind == bk:
            bdone[s] += 1
            if blocked_f[s]:
                push(s, "F", blocked_f[s].pop(0))
            if split_backward:
                push(s, "W", m)
            if s > 0 and (s - 1, "F", m) in done:
                push(s - 1, bk, m)
    return orders


def synthetic_meta(
    pp: int,
    stages_per_rank: int,
    num_microbatches: int,
    split_backward: bool,
    placement_kind: str | None = None,
    policy: str = "1f1b",
    schedule: str | None = None,
) -> TraceMeta:
    """A valid :class:`TraceMeta` for a synthetic schedule (V placement by default when split)."""
    if placement_kind is None:
        placement_kind = "v" if split_backward and stages_per_rank == 2 else "looped"
    s2r = placement(pp, stages_per_rank, placement_kind)
    orders = list_schedule_orders(s2r, num_microbatches, split_backward, policy)
    name = schedule or f"synthetic-{policy}-{placement_kind}{'-split' if split_backward else ''}"
    return TraceMeta(name, pp, len(s2r), num_microbatches, s2r, orders)


def synthetic_weights(
    meta: TraceMeta, seed: int = 0, lower_frac: tuple[float, float] = (0.3, 0.6), jitter: float = 0.05
) -> NodeWeights:
    """Seeded per-stage F/B/I/W times (ms) with small per-action jitter; B/W lower bounds are
    ``lower_frac`` of the upper bound (the I part of a full B does not shrink)."""
    rng = random.Random(seed)
    base: dict[int, dict[str, float]] = {}
    for s in range(meta.num_stages):
        f = rng.uniform(5.0, 15.0)
        i = f * rng.uniform(0.8, 1.2)
        w = f * rng.uniform(0.8, 1.2)
        base[s] = {"F": f, "I": i, "W": w, "B": i + w}
    w_min: dict[str, float] = {}
    w_max: dict[str, float] = {}
    for order in meta.rank_orders.values():
        for a in order:
            act = parse_action(a)
            kind, s = act.kind, act.stage
            fwd = 0.0
            if kind == PAIR:  # a forward and a full backward run as one: only the backward part shrinks
                fwd, kind = base[act.forward[0]]["F"], "B"  # type: ignore[index]
            hi = base[s][kind] * (1.0 + rng.uniform(-jitter, jitter))
            lo = hi * rng.uniform(*lower_frac) if kind in ("B", "W") else hi
            w_min[a], w_max[a] = fwd + lo, fwd + hi
    return NodeWeights(w_min, w_max)


def real_like_weights(
    meta: TraceMeta, seed: int = 0, spread: float = 0.4, jitter: float = 0.05, frozen_w: float = 0.1
) -> NodeWeights:
    """Timings shaped like measured ones: per-stage cost spread ``+-spread`` (unbalanced layer splits),
    independent ``+-jitter`` per action on both bounds (they come from separate profiling phases).

    A stage's forward is ``10 * U(1 - spread, 1 + spread)`` ms; its input-grad (I) and weight-grad (W)
    parts are each ``U(0.9, 1.1)`` of that, a full backward B is their sum.  With everything frozen the
    weight-grad part shrinks to ``frozen_w`` of itself (what is left: hook and bookkeeping), so
    ``w_min(W) = frozen_w * W`` and ``w_min(B) = I + frozen_w * W``; F and I do not shrink.
    """
    rng = random.Random(seed)
    base: dict[int, tuple[float, float, float]] = {}
    for s in range(meta.num_stages):
        f = 10.0 * rng.uniform(1.0 - spread, 1.0 + spread)
        base[s] = (f, f * rng.uniform(0.9, 1.1), f * rng.uniform(0.9, 1.1))
    w_min: dict[str, float] = {}
    w_max: dict[str, float] = {}
    for order in meta.rank_orders.values():
        for a in order:
            act = parse_action(a)
            f, i, w = base[act.stage]
            kind, fwd = act.kind, 0.0
            if kind == PAIR:  # a forward and a full backward run as one: only the backward part shrinks
                fwd, kind = base[act.forward[0]][0], "B"  # type: ignore[index]
            hi_lo = {"F": (f, f), "I": (i, i), "W": (w, frozen_w * w), "B": (i + w, i + frozen_w * w)}[kind]
            hi = hi_lo[0] * (1.0 + rng.uniform(-jitter, jitter))
            lo = hi if kind in ("F", "I") else min(hi, hi_lo[1] * (1.0 + rng.uniform(-jitter, jitter)))
            w_min[a], w_max[a] = fwd + lo, fwd + hi
    return NodeWeights(w_min, w_max)


def replay_weights(source: NodeWeights, source_meta: TraceMeta, meta: TraceMeta, seed: int = 0) -> NodeWeights:
    """A measured trace's timings scaled up to ``meta`` (same schedule, any size): every action of ``meta``
    draws the ``(w_min, w_max)`` pair of a random action of the same kind of source stage
    ``stage % source_meta.num_stages`` (the measured stage costs, their spread and per-action jitter, and the
    measured frozen/unfrozen ratios, resampled)."""
    if meta.schedule != source_meta.schedule:
        raise PlannerError(f"replay needs the same schedule: trace {source_meta.schedule!r}, target {meta.schedule!r}")
    pool: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for a, hi in source.w_max.items():
        act = parse_action(a)
        pool.setdefault((act.stage, act.kind), []).append((source.w_min[a], hi))
    rng = random.Random(seed)
    w_min: dict[str, float] = {}
    w_max: dict[str, float] = {}
    for order in meta.rank_orders.values():
        for a in order:
            act = parse_action(a)
            w_min[a], w_max[a] = rng.choice(pool[(act.stage % source_meta.num_stages, act.kind)])
    return NodeWeights(w_min, w_max)
