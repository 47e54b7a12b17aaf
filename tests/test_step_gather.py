"""The per-step gather as one fixed-size float64 row (``timelyfreeze.runtime.step_gather``, ``JobGroup.
all_gather_floats``): the same values the object gather gave, and nothing pickled per step. The profiler's
per-action path keeps its records as they were."""

from __future__ import annotations

import math

import torch.distributed as dist

from planner.schedule.orders import schedule_meta
from planner.trace.load import validate_meta
from tests.single_rank import process_group  # noqa: F401  (module-scoped, autouse)
from timelyfreeze.hooks.profiler import ActionProfiler
from timelyfreeze.job.collectives import JobGroup
from timelyfreeze.runtime.step_gather import StepGather


def gather() -> StepGather:
    return StepGather(validate_meta(schedule_meta("ZBVZeroBubble", 2, 4), "meta").all_actions())


def test_rows_carry_exactly_what_the_object_gather_carried():
    g = gather()
    assert g.groups == sorted(g.groups) and {"0F", "0I", "0W", "3F", "3I", "3W"} <= set(g.groups)
    cases = [
        ({"frozen": 1234.5, "batch_s": 0.123456789, "step_s": 0.2, "loss": 10.0 / 3}, {"0F": 1.1, "3W": 0.1 + 0.2}),
        ({"frozen": 0.0, "batch_s": 0.0, "step_s": 1e-9, "loss": None}, None),
        ({"frozen": 1.0, "batch_s": 1.0, "step_s": 1.0, "loss": 0.0}, {}),
    ]
    rows = [g.pack(local, scales) for local, scales in cases]
    assert len({len(r) for r in rows}) == 1
    back = g.unpack(rows)
    for (local, scales), got in zip(cases, back):
        assert got == {**local, "scales": scales, "method": {}}
    nan = g.unpack([g.pack({"frozen": 0.0, "batch_s": 0.0, "step_s": 0.0, "loss": math.nan}, None)])[0]
    assert math.isnan(nan["loss"])  # a NaN loss stays a loss, not None


def test_method_figures_ride_their_named_slots():
    import pytest

    from timelyfreeze.methods.egeria.method import Egeria

    g = StepGather(validate_meta(schedule_meta("1F1B", 2, 4), "meta").all_actions(), Egeria.step_metric_names)
    local = {"frozen": 1.0, "batch_s": 0.5, "step_s": 0.6, "loss": 2.0}
    figures = {"cache_hits": 3.0, "cache_misses": 1.0, "forward_ms_saved": 12.5, "cache_mb": 0.25}
    rank0, rank1 = g.unpack([g.pack(local, None, figures), g.pack(local, None, {})])
    assert rank0["method"] == figures and rank1["method"] == {}  # a rank without a cache gives none
    with pytest.raises(ValueError, match="step_metric_names"):
        g.pack(local, None, {"surprise": 1.0})


def test_all_gather_floats_is_exact_and_reuses_its_buffer():
    job = JobGroup(dist.group.WORLD)
    values = [0.1, 1 / 3, math.nan, 1e300, -0.0]
    got = job.all_gather_floats(values)
    assert len(got) == 1 and got[0][:2] == values[:2] and math.isnan(got[0][2]) and got[0][3:] == values[3:]
    buf = job._rows[len(values)][0]
    job.all_gather_floats([2.0] * len(values))
    assert job._rows[len(values)][0] is buf
    pending = job.start_gather_floats([3.0] * len(values))  # started, then waited for: the same row
    assert pending.result() == [[3.0] * len(values)] and job._rows[len(values)][0] is buf


def test_profiler_records_plain_actions_and_pairs():
    prof = ActionProfiler(0, use_cuda=False, pairs={"0F1": "(0F1;3B0)OVERLAP_F_B", "3B0": "(0F1;3B0)OVERLAP_F_B"})
    for _ in range(2):
        prof.before_action(0, "F", 0)
        prof.after_action(0, "F", 0)
    prof.before_action(0, "F", 1)
    prof.after_action(0, "F", 1)
    prof.before_action(3, "B", 0)
    prof.after_action(3, "B", 0)
    out = prof.collect()
    assert [a for a, _, _ in out] == ["0F0", "0F0", "(0F1;3B0)OVERLAP_F_B"]
    assert all(ms >= 0 and start is not None for _, ms, start in out)
    assert prof.order == ["0F0", "(0F1;3B0)OVERLAP_F_B"] and prof.collect() == []
