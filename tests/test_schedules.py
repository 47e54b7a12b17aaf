"""planner.schedule.orders: per-rank executed orders, checked against torch 2.13 itself where torch is present."""

from __future__ import annotations

import logging
from unittest import mock

import networkx as nx
import pytest

from planner.errors import PlannerError
from planner.schedule.actions import parse_action
from planner.schedule.orders import (
    SCHEDULES,
    canonical_schedule,
    rank_orders,
    schedule_meta,
    stage_to_rank,
    stages_per_rank,
)

PP_SIZES = (1, 2, 3, 4, 8)
MB_SIZES = tuple(range(1, 17)) + (32,)


def _allowed(schedule: str, pp: int, n: int) -> bool:
    try:
        rank_orders(schedule, pp, n)
    except PlannerError:
        return False
    return True


# ---------------------------------------------------------------- without torch


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("pp", (1, 2, 3, 4))
def test_orders_cover_every_action_once_on_its_own_rank(schedule, pp):
    for n in (1, 2, 5, 8, 12):
        if not _allowed(schedule, pp, n):
            continue
        spr = stages_per_rank(schedule)
        s2r = stage_to_rank(schedule, pp)
        orders = rank_orders(schedule, pp, n)
        assert sorted(orders) == list(range(pp))
        # a DualPipeV pair runs two of these actions (its parts)
        flat = [str(p) for r in range(pp) for a in orders[r] for p in parse_action(a).parts]
        assert len(flat) == len(set(flat))
        if schedule == "DualPipeV":  # per (stage, microbatch): F and either B or I and W
            for s in range(pp * spr):
                for m in range(n):
                    assert f"{s}F{m}" in flat
                    assert (f"{s}B{m}" in flat) != ({f"{s}I{m}", f"{s}W{m}"} <= set(flat)), (s, m)
        else:
            kinds = ("F", "I", "W") if "ZeroBubble" in schedule else ("F", "B")
            expected = {f"{s}{k}{m}" for s in range(pp * spr) for k in kinds for m in range(n)}
            assert len(flat) == len(expected) and set(flat) == expected
        for r, order in orders.items():
            assert all(s2r[p.stage] == r for a in order for p in parse_action(a).parts)


def _dependency_graph(schedule: str, pp: int, n: int) -> nx.DiGraph:
    """Data dependencies plus per-rank program order; a cycle would be a deadlock. A DualPipeV pair is one
    node standing for both its parts."""
    orders = rank_orders(schedule, pp, n)
    num_stages = pp * stages_per_rank(schedule)
    node = {str(p): a for order in orders.values() for a in order for p in parse_action(a).parts}
    g = nx.DiGraph()
    for order in orders.values():
        nx.add_path(g, order)

    def bwd(s: int, m: int) -> str:
        return node.get(f"{s}B{m}") or node[f"{s}I{m}"]

    for s in range(num_stages):
        for m in range(n):
            if s > 0:
                g.add_edge(node[f"{s - 1}F{m}"], node[f"{s}F{m}"])
            if s < num_stages - 1:
                g.add_edge(bwd(s + 1, m), bwd(s, m))
            else:
                g.add_edge(node[f"{s}F{m}"], bwd(s, m))
            if f"{s}W{m}" in node:
                g.add_edge(node[f"{s}I{m}"], node[f"{s}W{m}"])
    return g


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_orders_respect_dependencies(schedule):
    for pp, n in ((1, 3), (2, 2), (2, 7 if "Interleaved" not in schedule else 6), (4, 8), (4, 3), (3, 12)):
        if _allowed(schedule, pp, n):
            assert nx.is_directed_acyclic_graph(_dependency_graph(schedule, pp, n)), (schedule, pp, n)


def test_known_orders():
    # Hand-checked against the torch executions recorded in torchtitan-feasibility.md section 4.
    assert rank_orders("1F1B", 2, 4) == {
        0: "0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3".split(),
        1: "1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3".split(),
    }
    assert rank_orders("GPipe", 2, 2)[1] == ["1F0", "1F1", "1B0", "1B1"]
    assert rank_orders("ZBVZeroBubble", 2, 4)[0] == (
        "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0F3 0I0 0W0 3F2 3I2 3W2 0I1 0W1 3F3 3I3 3W3 0I2 0W2 0I3 0W3".split()
    )
    assert rank_orders("Interleaved1F1B", 2, 4)[1] == (
        "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3".split()
    )
    # torch's own names for its OVERLAP_F_B actions: one forward and one full backward of the rank's two stages
    assert rank_orders("DualPipeV", 2, 4) == {
        0: [
            "0F0",
            "0F1",
            "0F2",
            "3F0",
            "3I0",
            "3W0",
            "3F1",
            "(0F3;3B1)OVERLAP_F_B",
            "(3F2;0B0)OVERLAP_F_B",
            "3B2",
            "(3F3;0B1)OVERLAP_F_B",
            "3B3",
            "0I2",
            "0W2",
            "0I3",
            "0W3",
        ],
        1: [
            "1F0",
            "2F0",
            "1F1",
            "2F1",
            "1F2",
            "2B0",
            "(2F2;1B0)OVERLAP_F_B",
            "(1F3;2B1)OVERLAP_F_B",
            "(2F3;1B1)OVERLAP_F_B",
            "2B2",
            "1B2",
            "2I3",
            "1I3",
            "2W3",
            "1W3",
        ],
    }


def test_stage_to_rank_and_meta():
    assert stage_to_rank("ZBVZeroBubble", 4) == [0, 1, 2, 3, 3, 2, 1, 0]
    assert stage_to_rank("DualPipeV", 3) == [0, 1, 2, 2, 1, 0]
    assert stage_to_rank("Interleaved1F1B", 3) == [0, 1, 2, 0, 1, 2]
    assert stage_to_rank("Interleaved1F1B", 2, stages_per_rank=3) == [0, 1, 0, 1, 0, 1]
    assert stage_to_rank("1F1B", 3) == [0, 1, 2]
    assert stages_per_rank("gpipe") == 1 and stages_per_rank("zbvzerobubble") == 2
    assert canonical_schedule("interleaved1f1b") == "Interleaved1F1B"
    meta = schedule_meta("zbvzerobubble", 2, 4)
    assert meta["format"] == "timelyfreeze-trace/1"
    assert meta["schedule"] == "ZBVZeroBubble"
    assert (meta["pp_degree"], meta["num_stages"], meta["num_microbatches"]) == (2, 4, 4)
    assert meta["stage_to_rank"] == [0, 1, 1, 0]
    assert sorted(meta["rank_orders"]) == ["0", "1"]
    assert meta["rank_orders"]["0"] == rank_orders("ZBVZeroBubble", 2, 4)[0]


@pytest.mark.parametrize(
    "args, message",
    [
        (("Nope", 2, 4), "unknown schedule"),
        (("1F1B", 0, 4), "pp degree"),
        (("1F1B", 2.0, 4), "pp degree"),
        (("GPipe", 2, 0), "microbatches"),
        (("GPipe", 2, True), "microbatches"),
        (("1F1B", 4, 3), "at least as many microbatches as stages (4)"),
        (("Interleaved1F1B", 4, 9), "multiple of the number of rounds"),
        (("InterleavedZeroBubble", 3, 10), "multiple of the number of rounds"),
        (("ZBVZeroBubble", 2, 4, 3), "exactly 2 stages per rank"),
        (("DualPipeV", 2, 4, 3), "exactly 2 stages per rank"),
        (("DualPipeV", 2, 3), "DualPipeV needs at least as many microbatches as stages (4)"),
        (("GPipe", 2, 4, 2), "exactly 1 stage per rank"),
        (("Interleaved1F1B", 2, 4, 1), "at least 2 stages per rank"),
    ],
)
def test_invalid_arguments(args, message):
    with pytest.raises(PlannerError, match=None) as info:
        rank_orders(*args)
    assert message in str(info.value)
    assert "\n" not in str(info.value)
    with pytest.raises(PlannerError):
        schedule_meta(*args)


# ---------------------------------------------------------------- against torch 2.13


@pytest.fixture(scope="module")
def torch_pp():
    pytest.importorskip("torch")
    logging.getLogger("torch.distributed.pipelining").setLevel(logging.ERROR)
    from torch.distributed.pipelining import _schedule_visualizer, schedules

    return _schedule_visualizer, schedules


def _compute_only(actions) -> list[str]:
    """Compute actions only (``2F0``, ``3W1``, ``(0F3;3B1)OVERLAP_F_B``), as torch names them: drops None
    slots and SEND/RECV/UNSHARD/RESHARD/REDUCE_GRAD."""
    return [str(a) for a in actions if a is not None and a.is_compute_op]


def _torch_accepts(vis, schedule: str, pp: int, n: int) -> bool:
    try:
        vis.get_schedule_ops(schedule, pp, n)
    except (ValueError, AssertionError):
        return False
    return True


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_same_microbatch_constraints_as_torch(torch_pp, schedule):
    vis, _ = torch_pp
    for pp in (2, 3, 4):
        for n in range(1, 12):
            assert _allowed(schedule, pp, n) == _torch_accepts(vis, schedule, pp, n), (schedule, pp, n)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_orders_equal_torch_pipeline_order(torch_pp, schedule):
    """The IR (``get_schedule_ops``, None dropped) equals our order, except 1F1B's last rank."""
    vis, _ = torch_pp
    checked = 0
    for pp in PP_SIZES:
        for n in MB_SIZES:
            if not _allowed(schedule, pp, n):
                continue
            ours = rank_orders(schedule, pp, n)
            ir = vis.get_schedule_ops(schedule, pp, n)
            for r in range(pp):
                if schedule == "1F1B" and r == pp - 1:
                    # torch's 1F1B IR is off by one on the last rank (F1..Fn); see the test below.
                    assert _compute_only(ir[r])[0] == f"{r}F1"
                    continue
                assert _compute_only(ir[r]) == ours[r], (schedule, pp, n, r)
            checked += 1
    assert checked >= 40


@pytest.mark.parametrize(
    "schedule", ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
)
def test_orders_equal_torch_runtime_order_with_comms(torch_pp, schedule):
    """Multi-stage schedules execute the comms-lowered IR action by action: its compute part is ours."""
    vis, _ = torch_pp
    for pp, n in ((2, 4), (2, 8), (3, 6), (4, 8), (4, 12)):
        ops = vis.get_schedule_ops(schedule, pp, n, with_comms=True)
        ours = rank_orders(schedule, pp, n)
        for r in range(pp):
            assert _compute_only(ops[r]) == ours[r], (schedule, pp, n, r)


def _executed_single_stage(schedules, cls, pp: int, n: int, stage_index: int) -> list[str]:
    """Run torch's own ``_step_microbatches`` loop with a mocked stage and no communication."""
    from torch.distributed.pipelining.stage import PipelineStage

    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.num_stages, stage.stage_index = pp, stage_index
    stage.group_size, stage.group_rank = pp, stage_index
    stage.is_first, stage.is_last = stage_index == 0, stage_index == pp - 1
    stage.submod = None
    log: list[str] = []
    stage.forward_one_chunk.side_effect = lambda i, *a, **k: log.append(f"{stage_index}F{i}")
    stage.backward_one_chunk.side_effect = lambda i, *a, **k: log.append(f"{stage_index}B{i}")
    sched = cls(stage, n)
    with (
        mock.patch.object(schedules, "_batch_p2p", return_value=[]),
        mock.patch.object(schedules, "_wait_batch_p2p"),
        mock.patch.object(schedules, "_sorted_batch_p2p", return_value={}),
        mock.patch.object(cls, "_initialize_stage"),
        mock.patch.object(cls, "_maybe_compute_loss"),
        mock.patch.object(cls, "_maybe_get_loss"),
        mock.patch.object(cls, "_update_losses"),
    ):
        sched._step_microbatches([()] * n, [{}] * n)
    return log


@pytest.mark.parametrize("schedule", ("GPipe", "1F1B"))
def test_single_stage_orders_equal_torch_executed_loop(torch_pp, schedule):
    """GPipe/1F1B run a hand-written loop, not their IR: execute it (mocked stage) on every rank."""
    _, schedules = torch_pp
    cls = {"GPipe": schedules.ScheduleGPipe, "1F1B": schedules.Schedule1F1B}[schedule]
    for pp, n in ((1, 3), (2, 2), (2, 5), (3, 7), (4, 4), (4, 8), (8, 8), (8, 16)):
        ours = rank_orders(schedule, pp, n)
        for r in range(pp):
            assert _executed_single_stage(schedules, cls, pp, n, r) == ours[r], (schedule, pp, n, r)
