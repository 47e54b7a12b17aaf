"""All-gather a stage's FSDP2 parameters before its forward is timed, not inside it.

FSDP2 (``fully_shard``) all-gathers a module's parameters in its forward pre-hook, which runs inside the
stage's ``forward_one_chunk`` -- after the action's timing started (``stage_hooks``). Under pipeline
parallelism TorchTitan keeps a stage unsharded from its first forward to the step's last backward
(``reshard_after_forward`` is off with PP), so the first forward of each stage in a step waited for the
all-gather of every FSDP unit of the stage (on CUDA: its compute stream waited for the all-gather stream)
and the trace recorded that wait as forward compute: the first F of every stage inflated in every step.

``unshard`` does what torch's own ``UNSHARD`` action does in the schedules that lower it
(``_PipelineScheduleRuntime``): ``unshard(async_op=True)`` on every FSDP module of the stage, then ``wait()``
on each -- before the listeners' ``before_action``, so the action's start (a CUDA event on the compute
stream, recorded after the stream's wait) comes after the parameters are there; the wait falls in the gap
before the action. FSDP's pre-forward then finds the parameters unsharded and does nothing. The later
forwards of the step find them unsharded too (nothing to do, and nothing in their timings).

Only modules that keep their parameters unsharded after forward (TorchTitan's default under PP) are unsharded
early. With ``fsdp_reshard_after_forward = "always"`` a stage reshards after each forward and all-gathers
again, one unit at a time, in a later forward or backward (torch's pipelining keeps it unsharded only after
backwards), and those actions keep that wait in their times: unsharding all its units at once would raise
the peak memory that setting is chosen to lower. The module states are FSDP2's private API (checked against
torch 2.13), as in ``param_switch``.
"""

from __future__ import annotations

import torch


def kept_unsharded(module: torch.nn.Module) -> list:
    """The FSDP2 modules under ``module`` (the stage's root FSDP module, itself included) whose parameter
    groups all stay unsharded after a forward; ``[]`` when ``module`` is not FSDP2's root of its stage."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover -- torch without FSDP2
        return []
    if not isinstance(module, FSDPModule):
        return []
    return [
        m
        for m in module.modules()
        if isinstance(m, FSDPModule)
        and not any(g._reshard_after_forward for g in m._get_fsdp_state()._fsdp_param_groups)
    ]


def unshard(modules: list) -> None:
    """All-gather the parameters of ``modules`` (``kept_unsharded``; the first is the stage's root) and wait for
    them; nothing when they are unsharded already (every forward of a step after the first)."""
    if not modules or all(g.is_unsharded for m in modules for g in m._get_fsdp_state()._fsdp_param_groups):
        return
    modules[0]._get_fsdp_state()._lazy_init()  # the root's streams, before any group all-gathers (idempotent)
    for handle in [m.unshard(async_op=True) for m in modules]:
        handle.wait()
