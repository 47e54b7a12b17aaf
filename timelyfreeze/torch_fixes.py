"""Targeted fixes for torch 2.13 (not CPU-specific, so applied on every host).

1. ``patch_v_schedule_eval``: ``_PipelineScheduleRuntime.eval()`` on a V-shaped schedule (ZBVZeroBubble, DualPipeV) still walks
the backward actions of its lowered program. ``backward_one_chunk`` returns early when the stage has
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
their threads while the interpreter is fully alive.
"""

from __future__ import annotations


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


def release_mesh_process_groups() -> int:
    """Drop every live ``DeviceMesh``'s references to its process groups (call at shutdown, once no mesh
    is used again). Returns how many references were dropped."""
    import gc

    from torch.distributed.device_mesh import DeviceMesh

    dropped = 0
    for obj in gc.get_objects():
        if isinstance(obj, DeviceMesh):
            registry = getattr(obj, "_pg_registry", None)
            if isinstance(registry, dict):
                dropped += len(registry)
                registry.clear()
    return dropped
