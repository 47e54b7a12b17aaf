"""``torch_fixes.patch_titan_clipping``: TorchTitan's gradient clipping on a rank whose parameters have no
gradient (everything frozen) all-reduces over the pipeline group a zero on the parameters' device, in their
dtype -- not torch's CPU float32 ``tensor(0.0)``, which NCCL refuses ("no backend for cpu") while the other
ranks hang in the all-reduce. CPU only: parameters on the ``meta`` device show which device the norm is on."""

from __future__ import annotations

import types

import pytest
import torch

from timelyfreeze.titan import cpu_shims

cpu_shims.apply_if_needed()  # before TorchTitan is imported

from torchtitan.distributed import utils as dist_utils  # noqa: E402

from tests.single_rank import process_group  # noqa: E402, F401 (module-scoped, autouse)
from timelyfreeze.titan.torch_fixes import patch_titan_clipping  # noqa: E402


@pytest.fixture
def clip(monkeypatch):
    """TorchTitan's ``clip_grad_norm_`` as the trainer's step calls it (patched; restored after the test), and
    the tensors its pipeline all-reduce receives."""
    monkeypatch.setattr(dist_utils, "clip_grad_norm_", dist_utils.clip_grad_norm_)
    reduced = []
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda t, op=None, group=None: reduced.append(t))
    patch_titan_clipping()
    pp_mesh = types.SimpleNamespace(get_group=lambda: None)

    def fn(params, foreach=None, ep_enabled=False):
        return dist_utils.clip_grad_norm_(params, 1.0, foreach=foreach, pp_mesh=pp_mesh, ep_enabled=ep_enabled)

    return fn, reduced


def frozen(device, dtype):
    model = torch.nn.Linear(4, 3, device=device, dtype=dtype)
    model.requires_grad_(False)
    return list(model.parameters())


def test_no_gradients_reduce_a_zero_on_the_parameters_device(clip):
    fn, reduced = clip
    norm = fn(frozen("meta", torch.float32))
    assert [t.device.type for t in reduced] == ["meta"]
    assert norm.device.type == "meta"


def test_no_gradients_reduce_a_zero_in_the_parameters_dtype(clip):
    fn, reduced = clip
    norm = fn(frozen("cpu", torch.bfloat16), foreach=True)
    assert [t.dtype for t in reduced] == [torch.bfloat16]
    assert norm.dtype == torch.bfloat16 and norm.item() == 0.0


@pytest.mark.parametrize("ep_enabled", [False, True])
def test_no_gradients_of_sharded_parameters_reduce_a_zero_on_their_device(clip, ep_enabled):
    """DTensor parameters (FSDP2; expert parallelism, whose clipping takes DTensors only): the zero is a
    replicated DTensor, made whole without a collective; the pipeline all-reduce gets it on their device."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    fn, reduced = clip
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("ep" if ep_enabled else "dp_shard",))
    local = torch.zeros(4, 3, device="meta")
    param = torch.nn.Parameter(DTensor.from_local(local, mesh, [Shard(0)], run_check=False), requires_grad=False)
    norm = fn([param], ep_enabled=ep_enabled)
    assert [(type(t), t.device.type) for t in reduced] == [(torch.Tensor, "meta")]
    assert norm.device.type == "meta"


def test_gradients_present_are_clipped_as_before(clip):
    fn, reduced = clip
    params = frozen("cpu", torch.float32)
    params[0].grad = torch.full_like(params[0], 2.0)  # 12 entries of 2: norm sqrt(48)
    norm = fn(params, foreach=True)
    assert norm.item() == pytest.approx(48**0.5)
    assert len(reduced) == 1 and params[1].grad is None
    assert torch.linalg.vector_norm(params[0].grad).item() == pytest.approx(1.0, rel=1e-4)


def test_the_patch_is_applied_once(clip):
    once = dist_utils.clip_grad_norm_
    patch_titan_clipping()
    assert dist_utils.clip_grad_norm_ is once
