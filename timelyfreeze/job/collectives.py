"""Collectives of the freezing runtime: over one pipeline (``PipelineGroup``) and over the whole job, every
replica of the pipeline (``JobGroup``). Every rank in the group calls them at the same point of a step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import AllgatherOptions


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


class JobGroup:
    """Every rank of the job: all data-parallel (and tensor-parallel) replicas of the pipeline.

    Each replica is one pipeline: the ranks of one pipeline-parallel process group. A rank's place is
    ``(replica, pipeline rank)``; replicas are numbered by the lowest global rank of their pipeline, so
    global rank 0 is pipeline rank 0 of replica 0. Collectives here are over the whole job (every rank
    calls them at the same point of a step); ``pipeline`` is this rank's own pipeline.
    """

    def __init__(self, pp_group):
        self.pipeline = PipelineGroup(pp_group)
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()
        first = min(dist.get_process_group_ranks(pp_group))
        places: list[Any] = [None] * self.size
        dist.all_gather_object(places, (first, self.pipeline.rank))
        firsts = sorted({f for f, _ in places})
        self.places: list[tuple[int, int]] = [(firsts.index(f), r) for f, r in places]
        """(replica, pipeline rank) of every global rank."""
        self.replica = self.places[self.rank][0]
        self.replicas = len(firsts)
        self._device = _collective_device()
        self._rows: dict[int, tuple[torch.Tensor, list[torch.Tensor], torch.Tensor | None, np.ndarray | None]] = {}
        """Per row length, the (world size x length) float64 buffer of ``all_gather_floats``, its rows, and on the CPU
        this rank's row and its numpy view, through which it is written in place (None elsewhere)."""
        self._world = dist.group.WORLD
        self._async = AllgatherOptions()
        self._async.asyncOp = True
        """The default process group and the options of an asynchronous all-gather on it: ``start_gather_floats``
        calls the group as ``dist.all_gather(..., async_op=True)`` does after its argument checks (torch 2.13), which
        took about 60 us a call warm on the 2-core CPU machine and hold nothing here (the buffer's rows and the row
        have the same dtype and device, made here)."""

    def all_gather(self, obj: Any) -> list[Any]:
        """``obj`` of every rank of the job, in global rank order, on every rank."""
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def all_gather_floats(self, values: Sequence[float]) -> list[list[float]]:
        """``values`` (the same length on every rank) of every rank of the job, in global rank order: one
        fixed-size float64 tensor collective, exact for Python floats (no pickling, one round instead of
        ``all_gather_object``'s two)."""
        return self.start_gather_floats(values).result()

    def start_gather_floats(self, values: Sequence[float]) -> PendingFloats:
        """:meth:`all_gather_floats` started, not waited for: the caller does its own work while the other ranks
        catch up, then takes :meth:`PendingFloats.result` (before the next gather of the same length, whose
        buffers it shares)."""
        n = len(values)
        if n not in self._rows:
            buf = torch.empty((self.size, n), dtype=torch.float64, device=self._device)
            row = torch.empty(n, dtype=torch.float64) if self._device.type == "cpu" else None
            self._rows[n] = (buf, list(buf.unbind(0)), row, None if row is None else row.numpy())
        buf, rows, row, host = self._rows[n]
        if host is not None:  # on the CPU: this rank's row written in place (the same float64 values)
            host[:] = values
        else:
            row = torch.tensor(values, dtype=torch.float64, device=self._device)
        work = self._world.allgather([rows], [row], self._async)
        return PendingFloats(work, buf)

    def gather_to_zero(self, obj: Any) -> dict[tuple[int, int], Any] | None:
        """``obj`` of every rank by its (replica, pipeline rank), on global rank 0 (None elsewhere)."""
        out = [None] * self.size if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0)
        return None if out is None else {self.places[g]: o for g, o in enumerate(out)}

    def broadcast(self, obj: Any) -> Any:
        """Global rank 0's ``obj`` on every rank."""
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


class PendingFloats:
    """An :meth:`JobGroup.start_gather_floats` in flight."""

    def __init__(self, work, buf: torch.Tensor):
        self._work, self._buf = work, buf

    def result(self) -> list[list[float]]:
        """Every rank's values, in global rank order, once the collective is done (waits for it)."""
        self._work.wait()
        return self._buf.tolist()


def _collective_device() -> torch.device:
    """Where the default process group takes tensors: the CPU under gloo (or a CPU backend beside NCCL),
    the current CUDA device under NCCL alone (as ``all_gather_object`` chooses)."""
    try:
        # deferred: a private helper, only for object collectives
        from torch.distributed.distributed_c10d import _get_object_coll_device

        kind = _get_object_coll_device()
    except ImportError:  # pragma: no cover - (a torch without the helper)
        backend = str(dist.get_backend())
        kind = "cuda" if "nccl" in backend and "gloo" not in backend else "cpu"
    return torch.device("cuda", torch.cuda.current_device()) if kind == "cuda" else torch.device(kind)
