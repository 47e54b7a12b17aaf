"""A stage's forward timing starts after FSDP2's all-gather of its parameters (``hooks.fsdp_unshard``), in one
process (gloo, world size 1): a listener's ``before_action`` of every forward finds the stage's parameters
unsharded (plain tensors; FSDP2's sharded parameters are DTensors), so the wait for the all-gather is not in
the first forward's time. A module that reshards after every forward is left to FSDP2."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import get_schedule_class
from torch.distributed.tensor import DTensor

from tests.single_rank import process_group  # noqa: F401 (module-scoped, autouse)
from timelyfreeze.hooks import stage_hooks


def sharded_model(reshard_after_forward: bool):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 1))
    mesh = init_device_mesh("cpu", (1,))
    for blk in model[:2]:
        fully_shard(blk, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model


class SeesParameters:
    """A listener: at each forward's start, whether every parameter of the stage is unsharded."""

    def __init__(self, model):
        self.model, self.unsharded = model, []

    def before_action(self, stage, kind, microbatch):
        if kind == "F":
            self.unsharded.append(all(not isinstance(p, DTensor) for p in self.model.parameters()))

    def after_action(self, stage, kind, microbatch):
        pass


def one_step(reshard_after_forward: bool, hooked: bool):
    """One 1F1B step of two microbatches on a one-stage pipeline; the listener (or None) and the gradients."""
    model = sharded_model(reshard_after_forward)
    stage = PipelineStage(model, 0, 1, torch.device("cpu"), group=dist.group.WORLD)
    sched = get_schedule_class("1F1B")(stage, n_microbatches=2, loss_fn=lambda out, y: ((out - y) ** 2).mean())
    seen = SeesParameters(model) if hooked else None
    if hooked:
        stage_hooks.install(stage, [seen])
    gen = torch.Generator().manual_seed(1)
    sched.step(torch.randn(4, 8, generator=gen), target=torch.randn(4, 1, generator=gen))
    grads = [p.grad.full_tensor() for p in model.parameters()]
    return seen, grads


def test_every_forward_starts_with_the_stage_unsharded():
    seen, grads = one_step(reshard_after_forward=False, hooked=True)
    assert seen.unsharded == [True, True]  # the first forward too: its all-gather ran before its start
    _, reference = one_step(reshard_after_forward=False, hooked=False)
    assert all(torch.equal(g, r) for g, r in zip(grads, reference))


def test_a_stage_resharded_after_each_forward_is_left_to_fsdp():
    """Its forward all-gathers one unit at a time (unsharding them all at once would raise the peak memory)."""
    seen, _ = one_step(reshard_after_forward=True, hooked=True)
    assert seen.unsharded[0] is False
