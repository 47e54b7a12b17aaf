"""The freezing state in a TorchTitan checkpoint (format ``timelyfreeze-state/1``): its fields, and the
checks on load.

One rank's state is one JSON text (``timelyfreeze.runtime.state_codec``) with the fields of
:data:`FIELDS`, written here once: the runtime's own (:data:`RUN_FIELDS`: the step it was saved at, the
run's identity, the method's ``state_dict``, the metrics history, the validation curve, the trace's
``meta``) and the plan coordinator's (``timelyfreeze.plan.coordinator.STATE_FIELDS``: the monitoring
records, the plan's predicted batch times, the failures, the re-planner, the monitoring windows' factors).
``unpack`` decodes a state and refuses, with a ``FreezeStateError`` naming what is wrong, one that is not
this run's (method, schedule, stages, microbatches, pipeline rank), not of the step the checkpoint
restores, or whose measurements do not belong to the phases this run's ``[freeze]`` settings give those
steps. Each owner restores its own fields: :class:`RunState` the runtime's, the coordinator its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from timelyfreeze.job.errors import FreezeStateError
from timelyfreeze.job.phases import Phases
from timelyfreeze.plan.coordinator import OPTIONAL_FIELDS, STATE_FIELDS, check_state
from timelyfreeze.runtime import state_codec

RUN_FIELDS: dict[str, tuple[type, ...]] = {
    "step": (int,),
    "run": (dict,),
    "method": (dict,),
    "history": (list,),
    "val_curve": (list,),
    "acc_curve": (list,),
    "meta": (dict, type(None)),
}
"""The runtime's own fields, field -> accepted types."""
FIELDS: dict[str, tuple[type, ...]] = {**RUN_FIELDS, **STATE_FIELDS}
"""Every field of a saved state."""


@dataclass
class RunState:
    """What the runtime itself carries across a checkpoint (the plan's part is the coordinator's)."""

    history: list[dict] = field(default_factory=list)
    """Per-step metrics rows (identical on every rank)."""
    val_curve: list[list[float]] = field(default_factory=list)
    """``[step, validation loss]`` pairs."""
    acc_curve: list[dict] = field(default_factory=list)
    """The held-out accuracy at each validation that scored it (``Accuracy.row()`` with its ``step``)."""
    meta: dict | None = None
    """The trace's ``meta.json`` dict, known from the end of step 1."""

    def restore(self, st: dict) -> None:
        """Take this state's fields of ``unpack``'s checked state ``st``."""
        self.history, self.val_curve, self.meta = st["history"], st["val_curve"], st["meta"]
        self.acc_curve = st["acc_curve"]


def pack(**state: Any) -> str:
    """JSON text of the state (keyword arguments: exactly ``FIELDS``; the optional ones may be left out)."""
    for name in OPTIONAL_FIELDS:
        state.setdefault(name, None)
    state.setdefault("acc_curve", [])  # no held-out accuracy scored (as unpack reads an older state)
    assert set(state) == set(FIELDS), sorted(set(state) ^ set(FIELDS))
    return state_codec.encode({"format": state_codec.STATE_FORMAT, **state})


def unpack(text: Any, identity: dict, step: int, phases: Phases) -> dict:
    """The checked state saved by ``pack`` for a run with ``identity``, restored at ``step``."""
    st = state_codec.decode(text)
    check(st, identity, step, phases)
    return st


def check(st: Any, identity: dict, step: int, phases: Phases | None = None) -> None:
    """Structure and consistency of a decoded freezing state (see ``pack``); with ``phases``, also that its
    measurements belong to the phases this run's settings give their steps."""

    def fail(msg: str):
        raise FreezeStateError(f"saved freezing state: {msg}")

    if not isinstance(st, dict):
        fail("not an object")
    if st.get("format") != state_codec.STATE_FORMAT:
        fail(f"format {st.get('format')!r}, expected {state_codec.STATE_FORMAT!r}")
    for name in OPTIONAL_FIELDS:  # (saved before re-planning, or F-anchored monitoring, existed)
        st.setdefault(name, None)
    st.setdefault("acc_curve", [])  # (saved before the held-out accuracy existed)
    for name, types in FIELDS.items():
        if name not in st:
            fail(f"field {name!r} is missing")
        if not isinstance(st[name], types) or isinstance(st[name], bool):
            fail(f"field {name!r} has the wrong type ({type(st[name]).__name__})")
    for k, v in identity.items():
        if st["run"].get(k) != v:
            fail(f"saved by a run with {k} = {st['run'].get(k)!r}, this run has {v!r}")
    if st["step"] != step:
        fail(f"saved at step {st['step']}, but the checkpoint restores step {step}")
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
    for i, a in enumerate(st["acc_curve"]):
        if not (isinstance(a, dict) and isinstance(a.get("step"), int) and isinstance(a.get("val_acc"), (int, float))):
            fail(f"acc_curve[{i}] must be an object with an integer step and a number val_acc")
    check_state(st, step, phases)
