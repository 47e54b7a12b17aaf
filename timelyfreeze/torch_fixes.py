"""A targeted fix for a torch 2.13 pipelining bug (not CPU-specific, so applied on every host).

``_PipelineScheduleRuntime.eval()`` on a V-shaped schedule (ZBVZeroBubble, DualPipeV) still walks
the backward actions of its lowered program. ``backward_one_chunk`` returns early when the stage has
no backward, but the V-schedule's local hand-off between the two stages on a rank then calls
``stage.get_local_bwd_output``, which asserts "can't steal_bwd_input if this stage doesn't have
backward" -- so TorchTitan's validation crashes every ZBV run. In eval there is no backward, so the
hand-off has nothing to pass: make both sides of it no-ops while ``has_backward`` is False.
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
