"""The freezing state in checkpoints is plain data: exact round trips, and a tampered or truncated state
is refused with a clear error -- never unpickled, never restored into a wrong phase."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from timelyfreeze.job.errors import FreezeStateError
from timelyfreeze.runtime.state import check as _check_state
from timelyfreeze.runtime.state_codec import STATE_FORMAT, decode, encode


def test_round_trip_keeps_types_exactly():
    value = {
        "plain": [1, 2.5, "x", None, True],
        "tuple": (1, (2, 3)),
        7: {"int keys": {(0, 3): 0.25}},
        "tensors": [
            torch.randn(3, 4),
            torch.arange(5),
            torch.tensor(True),
            torch.zeros(0, 2),
            torch.randn(2, dtype=torch.bfloat16),
            torch.tensor(1.5),
        ],
        "nan": float("nan"),
    }
    back = decode(encode(value))
    assert set(back) == set(value)
    assert back["plain"] == value["plain"] and back["tuple"] == (1, (2, 3))
    assert back[7] == {"int keys": {(0, 3): 0.25}}
    for a, b in zip(value["tensors"], back["tensors"]):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    assert back["nan"] != back["nan"]


def test_a_dict_using_a_tag_name_as_key_survives():
    assert decode(encode({"__tuple__": 1})) == {"__tuple__": 1}


def test_unsupported_values_are_refused_when_saving():
    with pytest.raises(TypeError, match="set"):
        encode({"s": {1, 2}})
    with pytest.raises(TypeError, match="complex"):
        encode(torch.zeros(2, dtype=torch.complex64))


def test_truncated_state_is_a_clear_error():
    text = encode({"a": list(range(100))})
    with pytest.raises(FreezeStateError, match="not valid JSON"):
        decode(text[: len(text) // 2])


def test_a_pickle_is_never_loaded(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    blob = pickle.dumps({"method": Evil()})
    with pytest.raises(FreezeStateError, match="binary data"):
        decode(blob)
    with pytest.raises(FreezeStateError, match="not JSON text"):
        decode(12)
    assert not marker.exists()


@pytest.mark.parametrize(
    "raw,match",
    [
        ('{"__tensor__": {"dtype": "object", "shape": [1], "data": ""}}', "dtype"),
        ('{"__tensor__": {"dtype": "float32", "shape": [2], "data": "AAAA"}}', "needs 8"),
        ('{"__tensor__": {"dtype": "float32", "shape": [-1], "data": ""}}', "shape"),
        ('{"__tensor__": {"dtype": "float32", "shape": [1], "data": "**"}}', "base64"),
        ('{"__tensor__": {"dtype": "float32", "shape": [1]}}', "exactly dtype, shape and data"),
        ('{"__tuple__": [1], "x": 2}', "only key"),
        ('{"__dict__": [[1]]}', "pairs"),
        ('{"__dict__": [[[1, 2], 3]]}', "hashable"),
    ],
)
def test_tampered_values_are_refused(raw, match):
    with pytest.raises(FreezeStateError, match=match):
        decode(raw)


IDENTITY = {
    "method": "timelyfreeze",
    "schedule": "1F1B",
    "num_stages": 2,
    "num_microbatches": 8,
    "pp_rank": 0,
    "pp_size": 2,
}


def good_state(step: int = 9) -> dict:
    return {
        "format": STATE_FORMAT,
        "step": step,
        "run": dict(IDENTITY),
        "method": {},
        "monitor_records": [{"step": 3, "action": "0F0", "ms": 1.0, "phase": "upper", "freeze_ratio": 0.0}],
        "plan_batch_ms": {"no_freeze": 12.0, "all_frozen": 9.0, "planned": 10.0, "note": "v2"},
        "history": [{"step": s, "phase": "x"} for s in range(1, step + 1)],
        "val_curve": [[4, 5.5]],
        "meta": None,
        "failures": [],
    }


def test_a_consistent_state_passes():
    _check_state(decode(encode(good_state())), IDENTITY, 9)  # (saved before acc_curve existed: it has none)
    with_acc = good_state() | {"acc_curve": [{"step": 4, "val_acc": 0.5, "val_acc_norm": 0.25}]}
    _check_state(decode(encode(with_acc)), IDENTITY, 9)


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda s: s.update(format="timelyfreeze-state/0"), "format"),
        (lambda s: s.pop("history"), "'history' is missing"),
        (lambda s: s.update(history={}), "wrong type"),
        (lambda s: s["run"].update(schedule="GPipe"), "schedule = 'GPipe'"),
        (lambda s: s["run"].update(num_microbatches=4), "num_microbatches"),
        (lambda s: s.update(step=8), "saved at step 8"),
        (lambda s: s["monitor_records"][0].update(phase="stable"), "upper/lower"),
        (lambda s: s["monitor_records"][0].update(step=12), "upper/lower"),
        (lambda s: s["monitor_records"][0].pop("ms"), "not a trace record"),
        (lambda s: s["history"].pop(3), "history covers"),
        (lambda s: s.update(val_curve=[[1]]), "val_curve"),
        (lambda s: s.update(acc_curve=[[4, 0.5]]), "acc_curve"),
        (lambda s: s["plan_batch_ms"].update(planned="fast"), "plan_batch_ms"),
        (lambda s: s["plan_batch_ms"].pop("no_freeze"), "plan_batch_ms"),
    ],
)
def test_inconsistent_states_are_refused(change, match):
    st = good_state()
    change(st)
    with pytest.raises(FreezeStateError, match=match):
        _check_state(decode(encode(st)), IDENTITY, 9)


def test_timelyfreeze_refuses_a_tampered_plan():
    from tests.test_timely_method import make

    m = make()
    m.set_plan({"0B0": 0.9})
    st = decode(encode(m.state_dict()))
    st["planned_ratio"][(0, 0)] = 1.7
    with pytest.raises(ValueError, match="ratio in"):
        make().load_state_dict(st)
    st["planned_ratio"] = {(9, 0): 0.5}
    with pytest.raises(ValueError, match="stage, microbatch"):
        make().load_state_dict(st)


def test_no_pickle_in_the_runtime():
    import timelyfreeze

    root = os.path.dirname(timelyfreeze.__file__)
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                text = open(os.path.join(dirpath, f), encoding="utf-8").read()
                assert "import pickle" not in text and "pickle.loads" not in text, f


def test_a_failed_plan_is_reported_in_the_summary(tmp_path):
    """The runtime survives a planning failure, trains on without freezing, and says so in
    ``summary.json`` (``failures``) and the printed summary."""
    import types

    from tests.test_timely_method import make
    from timelyfreeze.config.freeze import Freeze
    from timelyfreeze.job.run_info import RunInfo
    from timelyfreeze.outputs.summary import format_summary
    from timelyfreeze.plan.coordinator import PlanCoordinator
    from timelyfreeze.plan.settings import PlanSettings

    info = RunInfo(
        schedule="1F1B",
        num_microbatches=4,
        total_steps=20,
        tokens_per_step=1,
        lr_warmup_steps=0,
        dump_folder=str(tmp_path),
        n_layers=2,
        use_cuda=False,
    )
    job = types.SimpleNamespace(rank=0, gather_to_zero=lambda obj: {(0, 0): obj}, broadcast=lambda obj: obj)
    logged = []
    method = make()
    settings = PlanSettings.from_config(Freeze(enable=True, r_max=0.8), 2)
    plans = PlanCoordinator(settings, info, 2, method.monitor_phases, job=job, log=logged.append)
    plans.meta = {"schedule": "1F1B"}  # meta the planner rejects
    plans.make_plan(6).apply_to(method)
    assert method.plan_failed and method.phase(12) == "noplan"
    failures = plans.failures
    assert len(failures) == 1 and failures[0].startswith("planning failed") and "step 6" in failures[0]
    assert any("ERROR planning failed" in m for m in logged)
    record = plans.record_of_run()  # what the summary reads: a copy, typed
    assert record.failures == failures and record.failures is not plans.failures
    assert record.replans == [] and record.rescales == [] and record.predicted_batch_ms is None
    summary = {
        "method": "timelyfreeze",
        "schedule": "1F1B",
        "pp_degree": 2,
        "num_stages": 2,
        "num_microbatches": 8,
        "steps": 12,
        "phases": {},
        "mean_batch_ms": {},
        "tokens_per_s": {"all": None, "stable": None},
        "avg_freeze_ratio": 0.0,
        "loss_curve": [],
        "failures": plans.failures,
    }
    assert "  FAILED: planning failed" in format_summary(summary)


def test_rows_before_a_step_keep_the_history_or_drop_the_steps_done_again():
    """``FreezeRuntime.begin_step``'s history: untouched (the same list, no pass over it) when the step is new, the rows
    of earlier steps when a resumed run does steps again."""
    from timelyfreeze.runtime.freeze_runtime import rows_before

    history = [{"step": s, "phase": "stable"} for s in range(1, 6)]
    assert rows_before(history, 6) is history
    assert rows_before(history, 4) == history[:3]
    assert rows_before(history, 1) == [] and rows_before([], 1) == []
