"""The runtime's freezing state in a TorchTitan checkpoint: what is saved, and the checks on load.

``FreezeState`` holds one rank's state besides the method's own, shared by the runtime (history,
validation curve, meta) and its plan coordinator (measurements, plan, re-planner, failures). ``pack``
turns one rank's state into JSON text (``timelyfreeze.runtime.state_codec``, format ``timelyfreeze-state/1``);
``unpack`` decodes it and refuses, with a ``FreezeStateError`` naming what
is wrong, a state that is not this run's (method, schedule, stages, microbatches, pipeline rank), not
of the step the checkpoint restores, or whose measurements do not belong to the phases this run's
``[freeze]`` settings give those steps; ``load`` also has the method load its part and rebuilds the
re-planner. Fields:

- ``step``: the step at which it was saved; ``run``: the identity above;
- ``method``: the method's own ``state_dict()`` (plain data and tensors);
- ``monitor_records``: this rank's upper/lower-bound trace records (the plan's input);
- ``plan_batch_ms``: the plan's predicted batch times; ``history``: per-step metrics rows;
- ``val_curve``: ``[step, loss]`` pairs; ``meta``: the trace's ``meta.json`` dict; ``failures``;
- ``replan``: the online re-planner's state (``timelyfreeze.plan.replan.Replanner.state_dict``) or None; a state
  saved before re-planning existed has no such field and loads as None;
- ``monitoring``: the monitoring windows' machine factors and warnings (``planner.timing.monitor``) or None
  (absent in older states: None).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from planner.errors import PlannerError
from timelyfreeze.config.freeze import Freeze
from timelyfreeze.config.phases import Phases
from timelyfreeze.methods.base import FreezeMethod
from timelyfreeze.plan.replan import Replanner
from timelyfreeze.plan.solve import one_line
from timelyfreeze.runtime import state_codec
from timelyfreeze.runtime.state_codec import FreezeStateError

FIELDS = (
    "step",
    "run",
    "method",
    "monitor_records",
    "plan_batch_ms",
    "history",
    "val_curve",
    "meta",
    "failures",
    "replan",
    "monitoring",
)


@dataclass
class FreezeState:
    """One rank's freezing state besides the method's own: what a checkpoint carries with ``step``, the
    run's identity and the method's ``state_dict`` (``FIELDS``)."""

    monitor_records: list[dict] = field(default_factory=list)
    """This rank's trace records of the phases the method's plan is made from."""
    plan_batch_ms: dict[str, float] | None = None
    """The first plan's predicted batch times (``plan.json``: from monitoring, or the given plan)."""
    history: list[dict] = field(default_factory=list)
    """Per-step metrics rows (identical on every rank)."""
    val_curve: list[list[float]] = field(default_factory=list)
    """``[step, validation loss]`` pairs."""
    meta: dict | None = None
    """The trace's ``meta.json`` dict, known from the end of step 1."""
    failures: list[str] = field(default_factory=list)
    """Problems the run survived (e.g. no plan): reported in the summary; a sweep marks the job failed."""
    replanner: Replanner | None = None
    """Online re-planning (``[freeze] replan``): the plan in force and its drift; None before a plan."""
    monitoring: dict | None = None
    """The monitoring windows' F factors against the reference, the tolerance and the warnings (summary)."""

    def pack(self, *, step: int, run: dict, method: dict) -> str:
        """JSON text of this state saved at ``step`` by a run with identity ``run``."""
        return pack(
            step=step,
            run=run,
            method=method,
            monitor_records=self.monitor_records,
            plan_batch_ms=self.plan_batch_ms,
            history=self.history,
            val_curve=self.val_curve,
            meta=self.meta,
            failures=self.failures,
            replan=self.replanner.state_dict() if self.replanner is not None else None,
            monitoring=self.monitoring,
        )

    def restore(self, st: dict, replanner: Replanner | None) -> None:
        """Take the fields of ``unpack``'s checked state ``st``, and ``restore_replanner``'s re-planner."""
        for name in ("monitor_records", "plan_batch_ms", "history", "val_curve", "meta", "failures", "monitoring"):
            setattr(self, name, st[name])
        self.replanner = replanner


def pack(**state: Any) -> str:
    """JSON text of the state (keyword arguments: exactly ``FIELDS``; ``monitoring`` may be left out: None)."""
    state.setdefault("monitoring", None)
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
                f"{phases.phase(rec['step'])} phase of this run's [freeze] settings (changed since the checkpoint?)"
            )
    return st


def load(
    text: Any, identity: dict, step: int, phases: Phases, cfg: Freeze, method: FreezeMethod
) -> tuple[dict, Replanner | None]:
    """``unpack``'s checked state, after ``method`` loaded its part, and the saved re-planner
    (``restore_replanner``). Whatever does not load, a method state included, raises ``FreezeStateError``
    naming what is wrong (one line, not a traceback)."""
    try:
        st = unpack(text, identity, step, phases)
        method.load_state_dict(st["method"])
        return st, restore_replanner(st, cfg)
    except FreezeStateError:
        raise
    except Exception as e:
        raise FreezeStateError(f"the {cfg.method} method state does not load: {one_line(e)}") from None


def restore_replanner(st: dict, cfg: Freeze) -> Replanner | None:
    """The re-planner saved in ``unpack``'s state ``st``, on this run's schedule with this run's ``[freeze]``
    settings ``cfg`` (None where none was saved, or re-planning is off now); ``FreezeStateError`` naming
    what does not fit."""
    if st["replan"] is None or st["meta"] is None:
        return None
    try:
        replanner = Replanner.for_run(cfg, st["meta"])
        if replanner is not None:
            replanner.load_state_dict(st["replan"])
    except (PlannerError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise FreezeStateError(f"saved freezing state: replan: {one_line(e)}") from None
    return replanner


_RECORD_TYPES = {"step": int, "action": str, "ms": (int, float), "phase": str, "freeze_ratio": (int, float)}


def check(st: Any, identity: dict, step: int) -> None:
    """Structure and consistency of a decoded freezing state (see ``FreezeState.pack``)."""

    def fail(msg: str):
        raise FreezeStateError(f"saved freezing state: {msg}")

    if not isinstance(st, dict):
        fail("not an object")
    if st.get("format") != state_codec.STATE_FORMAT:
        fail(f"format {st.get('format')!r}, expected {state_codec.STATE_FORMAT!r}")
    st.setdefault("replan", None)  # (saved before online re-planning existed)
    st.setdefault("monitoring", None)  # (saved before F-anchored monitoring existed)
    fields = {
        "step": int,
        "run": dict,
        "method": dict,
        "monitor_records": list,
        "plan_batch_ms": (dict, type(None)),
        "history": list,
        "val_curve": list,
        "meta": (dict, type(None)),
        "failures": list,
        "replan": (dict, type(None)),
        "monitoring": (dict, type(None)),
    }
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
        if not isinstance(rec, dict) or any(
            not isinstance(rec.get(f), t) or isinstance(rec.get(f), bool) for f, t in _RECORD_TYPES.items()
        ):
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
        for k in ("no_freeze", "all_frozen", "planned")
    ):
        fail("plan_batch_ms needs finite no_freeze, all_frozen and planned times")
    if not all(isinstance(f, str) for f in st["failures"]):
        fail("failures must be strings")
