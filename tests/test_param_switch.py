"""``ParamSwitch`` on FSDP2-sharded modules, in one process (gloo, world size 1).

Freezing switches ``requires_grad`` on the tensors the module computes with: FSDP2's unsharded copies
too, and FSDP2's one-time initialisation must have seen every tensor trainable, or a block frozen at the
module's first forward (a run resumed in the lower-bound phase) breaks its bf16 gradients. The
multi-rank exactness of freezing under FSDP2 is ``tests/parallel_exact_job.py``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from tests.single_rank import process_group  # noqa: F401 (module-scoped, autouse)
from timelyfreeze.config.freeze import FreezeConfigError
from timelyfreeze.hooks.param_switch import ParamSwitch


def sharded_model(param_dtype=torch.bfloat16):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 1))
    mesh = init_device_mesh("cpu", (1,))
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for blk in model[:2]:
        fully_shard(blk, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    return model


def test_a_block_frozen_at_the_first_forward_trains_with_bf16():
    model = sharded_model()
    params = dict(model.named_parameters())
    switch = ParamSwitch(model, params)  # initialises FSDP2 while everything is trainable
    assert switch.sharded
    frozen = [n for n in params if n.startswith("0.")]
    switch.set(frozen, False)  # the first forward with block 0 frozen (lower-bound phase) ...
    model(torch.randn(4, 8)).sum().backward()
    switch.set(frozen, True)
    assert all(params[n].grad is None for n in frozen)
    model(torch.randn(4, 8)).sum().backward()  # ... then a step that trains it
    for n, p in params.items():
        assert p.grad is not None and p.grad.dtype == torch.float32, n
    assert all(p.requires_grad for p in params.values())


def test_the_unsharded_copy_is_switched_for_later_microbatches():
    """Microbatch 1 runs with the stage already unsharded (as under PP): the freeze must still hold."""
    model = sharded_model(torch.float32)
    params = dict(model.named_parameters())
    switch = ParamSwitch(model, params)
    model.set_reshard_after_backward(False)  # as torch's pipelining does until the step's last backward
    model.set_requires_gradient_sync(False)
    x = torch.randn(4, 8)
    model(x).sum().backward()  # microbatch 0: nothing frozen; leaves the stage unsharded
    frozen = ["1.weight"]
    switch.set(frozen, False)
    model(x).sum().backward()  # microbatch 1: 1.weight frozen
    switch.set(frozen, True)
    model.set_requires_gradient_sync(True)
    model.set_reshard_after_backward(True)
    model(x).sum().backward()  # microbatch 2: nothing frozen, then the gradients are reduced
    reference = sharded_model(torch.float32)  # same seed: same weights, no freezing, one microbatch
    reference(x).sum().backward()
    for (n, p), q in zip(params.items(), reference.parameters()):
        g, once = p.grad.full_tensor(), q.grad.full_tensor()
        assert torch.allclose(g, (2 if n in frozen else 3) * once), n


def test_a_parameter_fsdp_does_not_manage_is_refused():
    model = sharded_model(torch.float32)
    params = dict(model.named_parameters())
    params["extra.weight"] = nn.Parameter(torch.zeros(2))
    with pytest.raises(FreezeConfigError, match="'extra.weight': not managed by FSDP2"):
        ParamSwitch(model, params)


def test_without_fsdp_the_tensor_itself_is_switched():
    model = nn.Linear(3, 3)
    params = dict(model.named_parameters())
    switch = ParamSwitch(model, params)
    assert not switch.sharded
    switch.set(["weight"], False)
    assert not model.weight.requires_grad and model.bias.requires_grad
    switch.set(["weight"], True)
    assert model.weight.requires_grad


def test_a_move_switches_off_exactly_the_target_and_keeps_count():
    """``move`` goes from the tensors off now to the target's, whatever came before; ``set`` changes only its names."""
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    params = dict(model.named_parameters())
    switch = ParamSwitch(model, params)
    names = list(params)
    for target in (["0.weight", "1.bias"], ["1.bias", "1.weight"], [], names, ["0.bias"]):
        switch.move(switch.bits(target))
        assert {n for n, p in params.items() if not p.requires_grad} == set(target)
        assert switch.off == switch.bits(target)
    switch.set(["1.weight"], False)
    assert {n for n, p in params.items() if not p.requires_grad} == {"0.bias", "1.weight"}
    switch.set(["0.bias", "0.weight"], True)
    assert {n for n, p in params.items() if not p.requires_grad} == {"1.weight"}
    assert switch.off == switch.bits(["1.weight"])
