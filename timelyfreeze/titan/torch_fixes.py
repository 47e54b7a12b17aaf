"""Targeted fixes for torch 2.13 (not CPU-specific, so applied on every host).

1. ``patch_v_schedule_eval``: ``_PipelineScheduleRuntime.eval()`` on a V-shaped schedule (ZBVZeroBubble, DualPipeV)
still walks the backward actions of its lowered program. ``backward_one_chunk`` returns early when the stage has
no backward, but the V-schedule's local hand-off between the two stages on a rank then calls
``stage.get_local_bwd_output``, which asserts "can't steal_bwd_input if this stage doesn't have
backward" -- so TorchTitan's validation crashes every ZBV run. In eval there is no backward, so the
hand-off has nothing to pass: make both sides of it no-ops while ``has_backward`` is False.

2. ``release_mesh_process_groups``: a ``DeviceMesh`` keeps its process groups in ``_pg_registry`` after
``destroy_process_group()``, and TorchTitan's meshes stay reachable until the interpreter shuts down. The
gloo process groups then live on with their worker threads and are destroyed by the garbage collector
*during interpreter finalization* (seen with gdb: ``~ProcessGroupGloo`` called from ``finalize_modules``),
where about one finished run in twenty aborted ("terminate called without an active exception"). Dropping
those references when the trainer closes lets ``destroy_process_group()`` destroy the groups and join
their threads while the interpreter is fully alive. The meshes are the ones TorchTitan's ``ParallelDims``
built (``parallel_meshes``), with their root meshes, whose registry child meshes share: an earlier version
scanned ``gc.get_objects()`` for meshes and, under ``torch.compile``, tripped over a dead weak proxy that
Dynamo leaves behind (``ReferenceError`` at exit).

3. ``patch_titan_clipping``: TorchTitan's ``clip_grad_norm_`` takes the norm of the gradients present with
``torch.nn.utils.get_total_norm``, which returns ``torch.tensor(0.0)`` -- a float32 on the CPU -- for no
gradients, and then all-reduces that norm over the pipeline group. A rank whose stages have no gradient in a
step (every tensor frozen: ranks without stage 0 in the lower-bound window, the last warm-up step under
``torch.compile``, whole block units) hands NCCL a CPU tensor ("no backend for cpu") while the other ranks
wait in the all-reduce until the watchdog; with bf16 parameters its float32 would also not match their
norms' dtype. The norm of no gradients is a zero on the parameters' device in their dtype: the patched
function clips, when no parameter has a gradient, one zero tensor of that device and dtype with a zero
gradient instead (a replicated DTensor where the parameters are DTensors), so TorchTitan's own reduction
(sum of powers, or max) runs unchanged on the right tensor.
"""

from __future__ import annotations

import functools

import torch


def patch_v_schedule_eval(stage) -> None:
    get_out, set_in = stage.get_local_bwd_output, stage.set_local_bwd_input

    def get_local_bwd_output(mb_index):
        if not stage.has_backward:
            return None
        return get_out(mb_index)

    def set_local_bwd_input(next_stage_bwd_outputs, mb_index):
        if not stage.has_backward or next_stage_bwd_outputs is None:
            return None
        return set_in(next_stage_bwd_outputs, mb_index)

    stage.get_local_bwd_output = get_local_bwd_output
    stage.set_local_bwd_input = set_local_bwd_input


def parallel_meshes(parallel_dims) -> list:
    """Every ``DeviceMesh`` a TorchTitan 0.2.2 ``ParallelDims`` built: the world mesh, its global meshes
    and its one-dimensional meshes (private fields of ``ParallelDims``, checked against 0.2.2)."""
    meshes = [getattr(parallel_dims, "_world_mesh", None)]
    meshes += list(getattr(parallel_dims, "_global_meshes", {}).values())
    meshes += list(getattr(parallel_dims, "_meshes", {}).values())
    return [m for m in meshes if m is not None]


def release_mesh_process_groups(meshes) -> int:
    """Drop the references of ``meshes`` (and of their root meshes) to their process groups (call at
    shutdown, once no mesh is used again). Returns how many references were dropped."""
    dropped = 0
    seen: set[int] = set()
    for mesh in meshes:
        root = mesh._get_root_mesh() if hasattr(mesh, "_get_root_mesh") else mesh
        for m in (mesh, root):
            registry = getattr(m, "_pg_registry", None)
            if id(m) in seen or not isinstance(registry, dict):
                continue
            seen.add(id(m))
            dropped += len(registry)
            registry.clear()
    return dropped


def norm_on_parameters_device(clip):
    """``clip`` (TorchTitan's ``clip_grad_norm_``) with the norm of no gradients a zero on the parameters'
    device, in their dtype (see 3. above); with any gradient present, ``clip`` itself."""

    @functools.wraps(clip)
    def clip_grad_norm_(parameters, *args, **kwargs):
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        if params and all(p.grad is None for p in params):
            zero = _zero_like(params[0])
            zero.grad = torch.zeros_like(zero)
            params = [zero]
        return clip(params, *args, **kwargs)

    clip_grad_norm_.norm_on_parameters_device = True
    return clip_grad_norm_


def _zero_like(param: torch.Tensor) -> torch.Tensor:
    """A 0-d zero on ``param``'s device in its dtype; a DTensor replicated on its mesh if ``param`` is one
    (TorchTitan's expert-parallel clipping takes DTensors only; a replicated norm is made whole without a
    collective)."""
    zero = torch.zeros((), device=param.device, dtype=param.dtype)
    mesh = getattr(param, "device_mesh", None)
    if mesh is None:
        return zero
    from torch.distributed.tensor import DTensor, Replicate

    return DTensor.from_local(zero, device_mesh=mesh, placements=[Replicate()] * mesh.ndim, run_check=False)


def patch_titan_clipping() -> None:
    """Make TorchTitan's ``clip_grad_norm_`` (which its ``Trainer.train_step`` looks up in
    ``torchtitan.distributed.utils`` at each step) return a zero on the parameters' device for no gradients.
    Idempotent."""
    from torchtitan.distributed import utils as dist_utils

    if not getattr(dist_utils.clip_grad_norm_, "norm_on_parameters_device", False):
        dist_utils.clip_grad_norm_ = norm_on_parameters_device(dist_utils.clip_grad_norm_)
