"""Per-rank compute orders of the torch 2.13 pipeline schedules, generated without torch.

``rank_orders(schedule, pp, n)`` returns, for every pipeline rank, the compute actions of one training
batch in the order that rank *executes* them (no idle slots, no communication actions). The
generators below re-derive torch's algorithms (``torch/distributed/pipelining/schedules.py`` at
2.13.0) and are checked against torch itself in ``tests/test_schedules.py``:

* ``GPipe`` / ``1F1B`` are ``PipelineScheduleSingle`` schedules: torch runs a hand-written
  ``_step_microbatches`` loop, and their ``pipeline_order`` IR exists only for visualisation. The
  loop is the truth. (``Schedule1F1B._get_pipeline_order`` is off by one on the last rank: it lists
  ``F1..Fn`` instead of ``F0..F(n-1)``; the loop runs ``F0 B0 F1 B1 ...`` there.)
* ``Interleaved1F1B``, ``LoopedBFS``, ``InterleavedZeroBubble``, ``ZBVZeroBubble`` and ``DualPipeV`` are
  ``_PipelineScheduleRuntime`` schedules: the runtime executes the IR (lowered with comms, compute
  order unchanged), so the IR with its ``None`` slots removed is the executed order.
* ``DualPipeV`` mixes full backwards (B), split ones (I then W) and ``OVERLAP_F_B`` pairs (a forward
  and a full backward of the rank's two stages as one action, ``planner.schedule.actions.pair_action``), named
  as torch names them: ``(0F3;3B1)OVERLAP_F_B``.

Microbatch constraints are torch's: ``1F1B`` needs ``n >= num_stages``; the two interleaved ones need
``n`` to be a multiple of ``max(1, n // pp)`` (the number of rounds); ``ZBVZeroBubble`` needs exactly
two stages per rank and accepts any ``n >= 1``; ``DualPipeV`` needs exactly two stages per rank and
``n >= num_stages``.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable

from planner.errors import PlannerError
from planner.schedule.actions import Action, pair_action
from planner.schedule.meta import TRACE_FORMAT

SCHEDULES: tuple[str, ...] = (
    "GPipe",
    "1F1B",
    "Interleaved1F1B",
    "LoopedBFS",
    "InterleavedZeroBubble",
    "ZBVZeroBubble",
    "DualPipeV",
)
"""Schedule names as ``pipeline_parallel_schedule`` (and torch's ``get_schedule_class``) spell them."""

_SINGLE_STAGE = frozenset({"GPipe", "1F1B"})
_V_STYLE = frozenset({"ZBVZeroBubble", "DualPipeV"})
_ROUNDS = frozenset({"Interleaved1F1B", "InterleavedZeroBubble"})


def v_shaped(schedule: str) -> bool:
    """True for the V-shaped schedules (ZBVZeroBubble, DualPipeV): each rank holds stages ``r`` and ``2 pp - 1 - r``."""
    return schedule in _V_STYLE


def canonical_schedule(schedule: str) -> str:
    """The canonical spelling of ``schedule`` (matched case-insensitively, like torch does)."""
    if isinstance(schedule, str):
        for name in SCHEDULES:
            if name.lower() == schedule.lower():
                return name
    raise PlannerError(f"unknown schedule {schedule!r} (known: {', '.join(SCHEDULES)})")


def stages_per_rank(schedule: str) -> int:
    """Default number of stages per rank: 1 for single-stage schedules, 2 for the others (as TorchTitan)."""
    return 1 if canonical_schedule(schedule) in _SINGLE_STAGE else 2


def min_microbatches(schedule: str, pp: int, spr: int | None = None) -> int:
    """The fewest microbatches ``schedule`` runs on ``pp`` ranks with ``spr`` stages each (default: the
    schedule's): one per stage for 1F1B and DualPipeV (torch's constructors raise below that), else 1."""
    name = canonical_schedule(schedule)
    if name not in ("1F1B", "DualPipeV"):
        return 1
    return pp * (stages_per_rank(name) if spr is None else spr)


def _positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlannerError(f"{what} must be an integer >= 1, got {value!r}")
    return value


def _check(schedule: str, pp: int, num_microbatches: int | None, spr: int | None) -> tuple[str, int]:
    """Validate the arguments; returns (canonical schedule, stages per rank)."""
    name = canonical_schedule(schedule)
    _positive_int(pp, "pp degree")
    spr = stages_per_rank(name) if spr is None else _positive_int(spr, "stages per rank")
    if name in _SINGLE_STAGE and spr != 1:
        raise PlannerError(f"{name} runs exactly 1 stage per rank, got {spr}")
    if name in _V_STYLE and spr != 2:
        raise PlannerError(f"{name} requires exactly 2 stages per rank, got {spr}")
    if name not in _SINGLE_STAGE and spr < 2:
        raise PlannerError(f"{name} needs at least 2 stages per rank, got {spr}")
    if num_microbatches is not None:
        check_microbatch_count(name, pp, num_microbatches, spr)
    return name, spr


def check_microbatch_count(schedule: str, pp: int, num_microbatches: int, spr: int | None = None) -> None:
    """Raise ``PlannerError`` if torch's constructor of ``schedule`` would refuse ``num_microbatches`` on ``pp``
    ranks with ``spr`` stages each: fewer than ``min_microbatches``, or (the interleaved schedules) not a
    multiple of the number of rounds ``max(1, n // pp)``."""
    name = canonical_schedule(schedule)
    spr = stages_per_rank(name) if spr is None else spr
    n = _positive_int(num_microbatches, "number of microbatches")
    if n < min_microbatches(name, pp, spr):
        raise PlannerError(f"{name} needs at least as many microbatches as stages ({pp * spr}), got {n}")
    if name in _ROUNDS:
        rounds = max(1, n // pp)
        if n % rounds:
            below = n - n % pp  # a multiple of pp always fits (pp divides it into its rounds)
            raise PlannerError(
                f"{name} needs the number of microbatches to be a multiple of the number of rounds "
                f"max(1, {n} // {pp}) = {rounds}, got {n} (a multiple of {pp} fits: {below} or {below + pp})"
            )


def stage_to_rank(schedule: str, pp: int, stages_per_rank: int | None = None) -> list[int]:
    """``result[s]`` is the rank running stage ``s``: looped (``s % pp``) or V-shaped (ZBV, DualPipeV)."""
    name, spr = _check(schedule, pp, None, stages_per_rank)
    num_stages = pp * spr
    if name in _V_STYLE:
        # V: rank r holds stages r and 2pp-1-r (down the ranks, then back up).
        return [s if s < pp else num_stages - 1 - s for s in range(num_stages)]
    return [s % pp for s in range(num_stages)]


# -- generators: each returns the executed compute actions of one rank as (stage, kind, microbatch) --

Op = tuple[int, str, int] | Action
"""(stage, kind, microbatch), or an :class:`Action` (DualPipeV's pairs)."""


def _gpipe(rank: int, pp: int, n: int) -> list[Op]:
    """``ScheduleGPipe._step_microbatches``: all forwards, then all backwards, microbatches ascending."""
    return [(rank, "F", m) for m in range(n)] + [(rank, "B", m) for m in range(n)]


def _one_f_one_b(rank: int, pp: int, n: int) -> list[Op]:
    """``Schedule1F1B._step_microbatches``: ``min(n, pp - stage)`` warm-up forwards, then B/F pairs
    (backward first) until the forwards run out, then the remaining backwards."""
    warmup = min(n, pp - rank)
    ops: list[Op] = [(rank, "F", m) for m in range(warmup)]
    fwd, bwd = warmup, 0
    while bwd < n:
        ops.append((rank, "B", bwd))
        bwd += 1
        if fwd < n:
            ops.append((rank, "F", fwd))
            fwd += 1
    return ops


def _looped_bfs(rank: int, pp: int, n: int, spr: int) -> list[Op]:
    """``ScheduleLoopedBFS``: every local stage's forwards (stages and microbatches ascending), then
    backwards with stages and microbatches descending."""
    local = [rank + k * pp for k in range(spr)]
    ops: list[Op] = [(s, "F", m) for s in local for m in range(n)]
    ops += [(s, "B", m) for s in reversed(local) for m in reversed(range(n))]
    return ops


def _interleaved(rank: int, pp: int, n: int, spr: int, zero_bubble: bool) -> list[Op]:
    """Interleaved 1F1B (depth first, in rounds of ``n // max(1, n // pp)`` microbatches) and its
    zero-bubble variant (ZB1P: I instead of B, W deferred by ``rank`` steady-state steps).

    Steps ``0..total-1`` walk the local stages round by round for the forwards; backward step ``k``
    walks them in reverse. Warm-up runs forwards only, the steady state one forward and one backward
    per step, the cool-down backwards only."""
    per_round = n // max(1, n // pp)
    total = n * spr
    hops = (1 if zero_bubble else 2) * (pp - 1 - rank)
    warmup = min((spr - 1) * per_round + hops, total)
    bwd_kind = "I" if zero_bubble else "B"

    def fwd_stage(step: int) -> int:
        return ((step // per_round) % spr) * pp + rank

    def bwd_stage(step: int) -> int:
        return (spr - 1 - ((step - warmup) // per_round) % spr) * pp + rank

    next_mb: dict[tuple[str, int], int] = defaultdict(int)
    pending_w: deque[tuple[int, int]] = deque()
    ops: list[Op] = []

    def emit(kind: str, stage: int) -> None:
        mb = next_mb[kind, stage]
        next_mb[kind, stage] = mb + 1
        ops.append((stage, kind, mb))
        if kind == bwd_kind and zero_bubble:
            pending_w.append((stage, mb))

    for step in range(warmup + total):
        if step < total:
            emit("F", fwd_stage(step))
        if step >= warmup:
            emit(bwd_kind, bwd_stage(step))
            if zero_bubble and step - warmup >= rank:
                stage, mb = pending_w.popleft()
                ops.append((stage, "W", mb))
    while pending_w:
        stage, mb = pending_w.popleft()
        ops.append((stage, "W", mb))
    return ops


def _zbv(rank: int, pp: int, n: int) -> list[Op]:
    """``ScheduleZBVZeroBubble``: V placement, chunk 0 = stage ``rank``, chunk 1 = stage ``2pp-1-rank``.

    Planned over ``max(2pp-1, n)`` microbatches (actions for microbatches >= n are dropped):
    warm-up ``2(pp-rank)-1`` chunk-0 forwards, ``rank`` (F1, F0) pairs, ``pp-rank`` (F1, I1, W1);
    steady (F0, I0, W0, F1, I1, W1) until every forward ran; cool-down ``rank`` (I0, I1) pairs,
    ``pp-rank`` (I0, W0), then the outstanding chunk-1 W's, then the outstanding chunk-0 W's."""
    n_plan = max(2 * pp - 1, n)
    c0, c1 = rank, 2 * pp - 1 - rank
    cnt = {(k, c): 0 for k in "FIW" for c in (c0, c1)}
    ops: list[Op] = []

    def emit(kind: str, stage: int) -> None:
        ops.append((stage, kind, cnt[kind, stage]))
        cnt[kind, stage] += 1

    for _ in range(2 * (pp - rank) - 1):
        emit("F", c0)
    for _ in range(rank):
        emit("F", c1)
        emit("F", c0)
    for _ in range(pp - rank):
        emit("F", c1)
        emit("I", c1)
        emit("W", c1)
    while cnt["F", c1] < cnt["F", c0] or cnt["F", c0] < n_plan:
        if cnt["F", c0] < n_plan:
            emit("F", c0)
        emit("I", c0)
        emit("W", c0)
        emit("F", c1)
        emit("I", c1)
        emit("W", c1)
    for _ in range(rank):
        emit("I", c0)
        emit("I", c1)
    for _ in range(pp - rank):
        emit("I", c0)
        emit("W", c0)
    for stage in (c1, c0):
        while cnt["W", stage] < cnt["I", stage]:
            emit("W", stage)
    return [op for op in ops if op[2] < n]


def _dualpipev(rank: int, pp: int, n: int) -> list[Op]:
    """``ScheduleDualPipeV._calculate_single_rank_operations``: V placement, chunk 0 = stage ``rank``,
    chunk 1 = stage ``2pp-1-rank``; a backward's microbatch is its stage's count of backwards so far, a
    W runs the oldest I still waiting for one.

    1. ``2(pp-rank-1)`` chunk-0 forwards; 2. ``rank+1`` (F0, F1); 3. ``pp-rank-1`` (I1, pending W, F1);
    4. ``n-2pp+rank+1`` times the pairs (F0+B1, F1+B0), the first of them unpaired (F0, B1) on the last
    rank; 5. ``pp-rank-1`` (B1, F1+B0); 6. ``rank+1`` (backward 1, backward 0), split into I from the
    middle one on (odd ranks from chunk 1 of it, even ranks from its chunk 0); 7. ``pp-rank-1``
    (pending W, backward 0, split as step 6 left it); 8. ``rank+1`` pending W's."""
    c0, c1 = rank, 2 * pp - 1 - rank
    fwd: dict[int, int] = defaultdict(int)
    bwd: dict[int, int] = defaultdict(int)
    pending_w: deque[tuple[int, int]] = deque()
    ops: list[Op] = []

    def f(stage: int) -> None:
        ops.append((stage, "F", fwd[stage]))
        fwd[stage] += 1

    def b(stage: int, split: bool = False) -> None:
        ops.append((stage, "I" if split else "B", bwd[stage]))
        if split:
            pending_w.append((stage, bwd[stage]))
        bwd[stage] += 1

    def w() -> None:
        if pending_w:
            stage, mb = pending_w.popleft()
            ops.append((stage, "W", mb))

    def pair(f_stage: int, b_stage: int) -> None:
        ops.append(pair_action(f_stage, fwd[f_stage], b_stage, bwd[b_stage]))
        fwd[f_stage] += 1
        bwd[b_stage] += 1

    for _ in range(2 * (pp - rank - 1)):
        f(c0)
    for _ in range(rank + 1):
        f(c0)
        f(c1)
    for _ in range(pp - rank - 1):
        b(c1, split=True)
        w()
        f(c1)
    for i in range(n - 2 * pp + rank + 1):
        if i == 0 and rank == pp - 1:
            f(c0)
            b(c1)
        else:
            pair(c0, c1)
        pair(c1, c0)
    for _ in range(pp - rank - 1):
        b(c1)
        pair(c1, c0)
    split = False
    for i in range(rank + 1):
        split |= i == (rank + 1) // 2 and rank % 2 == 1
        b(c1, split)
        split |= i == (rank + 1) // 2 and rank % 2 == 0
        b(c0, split)
    for _ in range(pp - rank - 1):
        w()
        b(c0, split)
    for _ in range(rank + 1):
        w()
    return ops


def _name(op: Op) -> str:
    return str(op) if isinstance(op, Action) else f"{op[0]}{op[1]}{op[2]}"


def rank_orders(
    schedule: str, pp: int, num_microbatches: int, stages_per_rank: int | None = None
) -> dict[int, list[str]]:
    """Executed compute order of every rank (``{rank: ["0F0", "0F1", ...]}``) for one batch."""
    name, spr = _check(schedule, pp, num_microbatches, stages_per_rank)
    n = num_microbatches
    gen: Callable[[int], list[Op]] = {
        "GPipe": lambda r: _gpipe(r, pp, n),
        "1F1B": lambda r: _one_f_one_b(r, pp, n),
        "LoopedBFS": lambda r: _looped_bfs(r, pp, n, spr),
        "Interleaved1F1B": lambda r: _interleaved(r, pp, n, spr, zero_bubble=False),
        "InterleavedZeroBubble": lambda r: _interleaved(r, pp, n, spr, zero_bubble=True),
        "ZBVZeroBubble": lambda r: _zbv(r, pp, n),
        "DualPipeV": lambda r: _dualpipev(r, pp, n),
    }[name]
    return {r: [_name(op) for op in gen(r)] for r in range(pp)}


def schedule_meta(schedule: str, pp: int, num_microbatches: int, stages_per_rank: int | None = None) -> dict:
    """A complete ``meta.json`` dict (``timelyfreeze-trace/1``) for this schedule and size."""
    name, spr = _check(schedule, pp, num_microbatches, stages_per_rank)
    orders = rank_orders(name, pp, num_microbatches, spr)
    return {
        "format": TRACE_FORMAT,
        "schedule": name,
        "pp_degree": pp,
        "num_stages": pp * spr,
        "num_microbatches": num_microbatches,
        "stage_to_rank": stage_to_rank(name, pp, spr),
        "rank_orders": {str(r): orders[r] for r in range(pp)},
    }
