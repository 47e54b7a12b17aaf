"""The runtime's freezing state in a TorchTitan checkpoint: what is saved, and the checks on load.

``pack`` turns one rank's state into JSON text (``timelyfreeze.state_codec``, format
``timelyfreeze-state/1``); ``unpack`` decodes it and refuses, with a ``FreezeStateError`` naming what
is wrong, a state that is not this run's (method, schedule, stages, microbatches, pipeline rank), not
of the step the checkpoint restores, or whose measurements do not belong to the phases this run's
``[freeze]`` settings give those steps. Fields:

- ``step``: the step at which it was saved; ``run``: the identity above;
- ``method``: the method's own ``state_dict()`` (plain data and tensors);
- ``monitor_records``: this rank's upper/lower-bound trace records (the plan's input);
- ``plan_batch_ms``: the plan's predicted batch times; ``history``: per-step metrics rows;
- ``val_curve``: ``[step, loss]`` pairs; ``meta``: the trace's ``meta.json`` dict; ``failures``;
- ``replan``: the online re-planner's state (``timelyfreeze.replan.Replanner.state_dict``) or None; a state
  saved before re-planning existed has no such field and loads as None.
"""

from __future__ import annotations

import math
from typing import Any

from timelyfreeze import state_codec
from timelyfreeze.phases import Phases
from timelyfreeze.state_codec import FreezeStateError

FIELDS = ("step", "run", "method", "monitor_records", "plan_batch_ms", "history", "val_curve", "meta", "failures",
          "replan")


def pack(**state: Any) -> str:
    """JSON text of the state (keyword arguments: exactly ``FIELDS``)."""
    assert set(state) == set(FIELDS), sorted(set(state) ^ set(FIELDS))
    return state_codec.encode({"format": state_codec.STATE_FORMAT, **state})


def unpack(text: Any, identity: dict, step: int, phases: Phases) -> dict:
    """The checked state saved by ``pack`` for a run with ``identity``, restored at ``step``."""
    st = state_codec.decode(text)
    check(st, identity, step)
    for rec in st["monitor_records"]:
        if phases.phase(rec["step"]) != rec["phase"]:
            raise FreezeStateError(
                f"saved freezing state: a {rec['phase']} measurement of step {rec['step']}, which is in the "
                f"{phases.phase(rec['step'])} phase of this run's [freeze] settings (changed since the checkpoint?)")
    return st


_RECORD_TYPES = {"step": int, "action": str, "ms": (int, float), "phase": str, "freeze_ratio": (int, float)}


def check(st: Any, identity: dict, step: int) -> None:
    """Structure and consistency of a decoded freezing state (see ``FreezeRuntime.state_dict``)."""
    def fail(msg: str):
        raise FreezeStateError(f"saved freezing state: {msg}")

    if not isinstance(st, dict):
        fail("not an object")
    if st.get("format") != state_codec.STATE_FORMAT:
        fail(f"format {st.get('format')!r}, expected {state_codec.STATE_FORMAT!r}")
    st.setdefault("replan", None)  # (saved before online re-planning existed)
    fields = {"step": int, "run": dict, "method": dict, "monitor_records": list, "plan_batch_ms": (dict, type(None)),
              "history": list, "val_curve": list, "meta": (dict, type(None)), "failures": list,
              "replan": (dict, type(None))}
    for name, typ in fields.items():
        if name not in st:
            fail(f"field {name!r} is missing")
        if not isinstance(st[name], typ) or isinstance(st[name], bool):
            fail(f"field {name!r} has the wrong type ({type(st[name]).__name__})")
    for k, v in identity.items():
        if st["run"].get(k) != v:
            fail(f"saved by a run with {k} = {st['run'].get(k)!r}, this run has {v!r}")
    if st["step"] != step:
        fail(f"saved at step {st['step']}, but the checkpoint restores step {step}")
    for i, rec in enumerate(st["monitor_records"]):
        if not isinstance(rec, dict) or any(not isinstance(rec.get(f), t) or isinstance(rec.get(f), bool)
                                            for f, t in _RECORD_TYPES.items()):
            fail(f"monitor_records[{i}] is not a trace record ({', '.join(_RECORD_TYPES)})")
        if rec["phase"] not in ("upper", "lower") or not 1 <= rec["step"] <= step or not math.isfinite(rec["ms"]):
            fail(f"monitor_records[{i}] = {rec}: must be an upper/lower record of a step <= {step} with finite ms")
    steps = []
    for i, row in enumerate(st["history"]):
        if not isinstance(row, dict) or not isinstance(row.get("step"), int) or not isinstance(row.get("phase"), str):
            fail(f"history[{i}] needs an integer step and a phase")
        steps.append(row["step"])
    if steps != list(range(1, len(steps) + 1)) or len(steps) > step:
        fail(f"history covers steps {steps[:3]}...{steps[-3:]}, expected 1..{step} in order")
    for i, v in enumerate(st["val_curve"]):
        if not (isinstance(v, list) and len(v) == 2 and isinstance(v[0], int) and isinstance(v[1], (int, float))):
            fail(f"val_curve[{i}] must be [step, loss]")
    if st["plan_batch_ms"] is not None and not all(
            isinstance(st["plan_batch_ms"].get(k), (int, float)) and math.isfinite(st["plan_batch_ms"][k])
            for k in ("no_freeze", "all_frozen", "planned")):
        fail("plan_batch_ms needs finite no_freeze, all_frozen and planned times")
    if not all(isinstance(f, str) for f in st["failures"]):
        fail("failures must be strings")
