"""See every compute action of a ``torch.distributed.pipelining`` stage, by subclassing it.

Every schedule in torch 2.13 (the GPipe/1F1B loops, ``PipelineScheduleMulti`` and
``_PipelineScheduleRuntime`` for Interleaved1F1B/ZBV) runs compute by calling three methods of the
stage:

    stage.forward_one_chunk(mb, ...)                          -> F
    stage.backward_one_chunk(mb, full_backward=True|False)    -> B | I
    stage.backward_weight_one_chunk(mb, ...)                  -> W

``install`` switches a built stage to a subclass of its own class whose overrides of those three
methods call the listeners around the base class's methods, with the methods' real signatures (so
``full_backward`` is bound by name or position as torch passes it); ``uninstall`` switches it back.
TorchTitan builds the stages inside its pipelining function, so the class is switched right after
construction rather than chosen at construction. Receives happen in the schedule before these calls,
so what runs inside is compute only. So is FSDP2's all-gather of a stage's parameters: a forward's
listeners are called after it (``fsdp_unshard``). Calls made with autograd disabled (validation/eval
forwards) pass straight through.

DualPipeV's ``OVERLAP_F_B`` actions run a forward and a full backward of the rank's two stages as one
schedule action; the stages see them as an ``F`` and a ``B`` call (torch's loop runs them one after
the other, TorchTitan's overlap callback in two threads). ``overlap_pairs`` reads, from the schedule
object, which calls belong to such a pair, so the listeners can name and time the pair as one action.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from planner.schedule.actions import Action, part_owners
from timelyfreeze.hooks import fsdp_unshard


class ActionListener(Protocol):
    def before_action(self, stage: int, kind: str, microbatch: int) -> None: ...

    def after_action(self, stage: int, kind: str, microbatch: int) -> None: ...


def _run(stage, kind: str, mb: int, fn, *args, **kwargs):
    """``fn`` with the stage's listeners around it: ``before_action`` in list order, ``after_action`` in
    reverse (an outer listener's timing excludes nothing an inner one does)."""
    if not torch.is_grad_enabled() or not getattr(stage, "has_backward", True):
        return fn(*args, **kwargs)
    if kind == "F":
        fsdp_unshard.unshard(stage._kept_unsharded)  # before the listeners: the wait is no compute
    sidx = stage.stage_index
    for before in stage._before:
        before(sidx, kind, mb)
    try:
        return fn(*args, **kwargs)
    finally:
        for after in stage._after:
            after(sidx, kind, mb)


def _forward_one_chunk(self, fwd_chunk_id: int, *args: Any, **kwargs: Any):
    return _run(self, "F", fwd_chunk_id, self._base_class.forward_one_chunk, self, fwd_chunk_id, *args, **kwargs)


def _backward_one_chunk(self, bwd_chunk_id: int, loss=None, full_backward: bool = True, last_backward=False):
    return _run(
        self,
        "B" if full_backward else "I",
        bwd_chunk_id,
        self._base_class.backward_one_chunk,
        self,
        bwd_chunk_id,
        loss=loss,
        full_backward=full_backward,
        last_backward=last_backward,
    )


def _backward_weight_one_chunk(self, bwd_chunk_id: int, *args: Any, **kwargs: Any):
    return _run(
        self, "W", bwd_chunk_id, self._base_class.backward_weight_one_chunk, self, bwd_chunk_id, *args, **kwargs
    )


_CLASSES: dict[type, type] = {}


def _hooked_class(cls: type) -> type:
    """``cls`` subclassed with the three compute methods overridden (the only base, so a built stage's
    class can be switched to it: CPython refuses a ``__class__`` change to a class with a mixin base)."""
    if cls not in _CLASSES:
        _CLASSES[cls] = type(
            f"Hooked{cls.__name__}",
            (cls,),
            {
                "_base_class": cls,
                "forward_one_chunk": _forward_one_chunk,
                "backward_one_chunk": _backward_one_chunk,
                "backward_weight_one_chunk": _backward_weight_one_chunk,
            },
        )
    return _CLASSES[cls]


def _is_hooked(stage) -> bool:
    return type(stage) in _CLASSES.values()


def install(stage, listeners: list[ActionListener]) -> None:
    """Make ``stage`` call ``listeners`` around its compute actions (idempotent: a second call only
    replaces the listeners). Their ``before_action``/``after_action`` are looked up here, once: a wrapper set on a
    listener later (as the GPU host-view recorder sets one, in the profiler's ``__init__``, before this call) needs
    another call of ``install``."""
    if not _is_hooked(stage):
        stage.__class__ = _hooked_class(type(stage))
        stage._kept_unsharded = fsdp_unshard.kept_unsharded(getattr(stage, "submod", None))
    stage._listeners = list(listeners)
    stage._before = tuple(lst.before_action for lst in stage._listeners)  # (bound once: every action calls them)
    stage._after = tuple(lst.after_action for lst in reversed(stage._listeners))


def uninstall(stage) -> None:
    """Back to the stage's own class: plain compute."""
    if _is_hooked(stage):
        stage.__class__ = stage._base_class
        del stage._listeners, stage._before, stage._after, stage._kept_unsharded


def overlap_pairs(schedule) -> dict[str, str]:
    """``{part name: pair name}`` (``planner.schedule.actions.part_owners``) of the ``OVERLAP_F_B`` actions this
    rank's schedule executes (``str`` of torch's ``_Action`` is the planner's action name); ``{}`` for
    schedules without any (all but DualPipeV) and for single-stage schedules, which have no IR to run."""
    program = getattr(schedule, "pipeline_order_with_comms", None) or getattr(schedule, "pipeline_order", None)
    rank = getattr(schedule, "rank", None)
    if not program or rank not in program:
        return {}
    return part_owners(str(a) for a in program[rank] if a is not None and getattr(a, "sub_actions", None))


class ActionNames:
    """What a listener calls the compute call ``(stage, kind, microbatch)``: its action name, and the name of the
    DualPipeV pair it is a part of (``pairs``: :func:`overlap_pairs`; None for a plain action), each made once."""

    def __init__(self, pairs: dict[str, str] | None = None):
        self.pairs = dict(pairs or {})
        self._known: dict[tuple[int, str, int], tuple[str, str | None]] = {}

    def of(self, stage: int, kind: str, microbatch: int) -> tuple[str, str | None]:
        key = (stage, kind, microbatch)
        known = self._known.get(key)
        if known is None:
            name = str(Action(stage, kind, microbatch))
            known = self._known[key] = (name, self.pairs.get(name))
        return known
