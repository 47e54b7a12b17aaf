"""Intercept every compute action of a ``torch.distributed.pipelining`` stage.

Every schedule in torch 2.13 (the GPipe/1F1B loops, ``PipelineScheduleMulti`` and
``_PipelineScheduleRuntime`` for Interleaved1F1B/ZBV) runs compute by calling three methods on the
stage object:

    stage.forward_one_chunk(mb, ...)                          -> F
    stage.backward_one_chunk(mb, full_backward=True|False)    -> B | I
    stage.backward_weight_one_chunk(mb, ...)                  -> W

Shadowing those methods on the *instance* therefore sees every action with its stage and
microbatch. Receives happen in the schedule before these calls, so what runs inside is compute only.
Calls made with autograd disabled (validation/eval forwards) pass straight through.
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch


class ActionListener(Protocol):
    def before_action(self, stage: int, kind: str, microbatch: int) -> None: ...

    def after_action(self, stage: int, kind: str, microbatch: int) -> None: ...


def install(stage, listeners: list[ActionListener]) -> Callable[[], None]:
    """Wrap ``stage``'s three compute methods; ``before_action`` runs in list order, ``after_action``
    in reverse (so an outer listener's timing excludes nothing an inner one does inside). Returns an
    ``uninstall`` function."""
    fwd, bwd, wgt = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk
    sidx = stage.stage_index

    def _run(kind: str, mb: int, fn, *args, **kwargs):
        if not torch.is_grad_enabled() or not getattr(stage, "has_backward", True):
            return fn(*args, **kwargs)
        for lst in listeners:
            lst.before_action(sidx, kind, mb)
        try:
            return fn(*args, **kwargs)
        finally:
            for lst in reversed(listeners):
                lst.after_action(sidx, kind, mb)

    def forward_one_chunk(fwd_chunk_id, *args, **kwargs):
        return _run("F", fwd_chunk_id, fwd, fwd_chunk_id, *args, **kwargs)

    def backward_one_chunk(bwd_chunk_id, *args, **kwargs):
        full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
        return _run("B" if full else "I", bwd_chunk_id, bwd, bwd_chunk_id, *args, **kwargs)

    def backward_weight_one_chunk(bwd_chunk_id, *args, **kwargs):
        return _run("W", bwd_chunk_id, wgt, bwd_chunk_id, *args, **kwargs)

    stage.forward_one_chunk = forward_one_chunk
    stage.backward_one_chunk = backward_one_chunk
    stage.backward_weight_one_chunk = backward_weight_one_chunk

    def uninstall() -> None:
        for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
            stage.__dict__.pop(name, None)

    return uninstall
