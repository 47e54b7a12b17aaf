"""Collectives over the pipeline group: every pipeline rank calls them at the same point of a step."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist


class PipelineGroup:
    """The process group of one pipeline (all its stage ranks), for small picklable objects."""

    def __init__(self, group):
        self.group = group
        self.rank = dist.get_rank(group)
        """This process's pipeline rank."""
        self.size = dist.get_world_size(group)

    def all_gather(self, obj: Any) -> list[Any]:
        """``obj`` of every pipeline rank, in rank order, on every rank."""
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def gather_to_zero(self, obj: Any) -> list[Any] | None:
        """``obj`` of every pipeline rank on pipeline rank 0 (None elsewhere)."""
        out = [None] * self.size if self.rank == 0 else None
        dist.gather_object(obj, out, group_dst=0, group=self.group)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Pipeline rank 0's ``obj`` on every rank."""
        box = [obj]
        dist.broadcast_object_list(box, group_src=0, group=self.group)
        return box[0]
