"""A pipeline run optimises the same loss as one process: the per-token mean over the whole batch.

TorchTitan 0.2.2's PP path runs backward on each microbatch's summed loss and divides only the logged loss, so
its gradients were the batch's token count times one process's (pytorch/torchtitan#2972). The trainer's
``forward_backward_step`` is driven here twice on one batch: through a real ``torch.distributed.pipelining``
schedule with the model split into two stages (both on this rank: world size 1), and through TorchTitan's
one-process path on the unsplit model, with the loss built from the llama3 ``TrainSpec`` the trainer
registers. Gradients, their norm (what ``max_norm`` clips) and the returned loss agree to float rounding; a
quarter of the labels are ignored, unevenly over the microbatches, so a mean of microbatch means would not.
"""

from __future__ import annotations

import contextlib
import copy
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import get_schedule_class
from torchtitan.components.loss import IGNORE_INDEX

from tests.single_rank import process_group  # noqa: F401 (module-scoped, autouse)
from tests.test_freezing_exact import N_MB, SEQ, V, build_parts
from timelyfreeze.titan import spec as titan_spec
from timelyfreeze.titan.trainer import TimelyFreezeTrainer

RTOL = 1e-5


def llama3_loss():
    """The loss a trainer of the llama3 model gets: TorchTitan's builder through the spec we register."""
    from torchtitan.protocols.train_spec import get_train_spec

    titan_spec.use_freeze_spec("llama3")
    job = SimpleNamespace(compile=SimpleNamespace(enable=False, components=[]))
    return get_train_spec("llama3").build_loss_fn(job)


def trainer(model_parts, pp_schedule=None) -> TimelyFreezeTrainer:
    """A trainer with just what ``forward_backward_step`` reads (TorchTitan's attributes, no freezing)."""
    t = TimelyFreezeTrainer.__new__(TimelyFreezeTrainer)
    t.freeze_rt = None
    t.model_parts = model_parts
    t.parallel_dims = SimpleNamespace(pp_enabled=pp_schedule is not None, cp_enabled=False)
    t.model_args = SimpleNamespace(attn_type="sdpa")
    t.tokenizer = None
    t.loss_fn = llama3_loss()
    t.train_context = contextlib.nullcontext
    t.maybe_enable_amp = contextlib.nullcontext()
    t.pp_schedule = pp_schedule
    t.pp_has_first_stage = t.pp_has_last_stage = True
    t.device = torch.device("cpu")
    return t


def grad_norm(modules) -> torch.Tensor:
    return torch.linalg.vector_norm(torch.stack([p.grad.norm() for m in modules for p in m.parameters()]))


# the token count is a tensor, or an int where TorchTitan all-reduced it over data-parallel replicas (dist_sum)
@pytest.mark.parametrize("count", [torch.Tensor.float, int], ids=["tensor", "int"])
def test_pp2_gradient_norm_equals_one_process_on_one_batch(count):
    parts = build_parts(2, ac=False)
    whole = nn.Sequential(*copy.deepcopy(parts))
    pp = trainer(parts)
    # as TorchTitan's build_pipeline_schedule: the trainer's loss function, no division of the gradients
    stages = [PipelineStage(p, i, 2, torch.device("cpu")) for i, p in enumerate(parts)]
    schedule = get_schedule_class("Interleaved1F1B")
    pp.pp_schedule = schedule(stages, n_microbatches=N_MB, loss_fn=pp.loss_fn, scale_grads=False)
    pp.parallel_dims.pp_enabled = True
    one = trainer([whole])

    g = torch.Generator().manual_seed(5)
    x = torch.randint(0, V, (N_MB, SEQ), generator=g)
    y = torch.randint(0, V, (N_MB, SEQ), generator=g)
    y[0, : SEQ // 2] = IGNORE_INDEX  # microbatches of 4, 6, 8 and 8 valid tokens
    y[1, : SEQ // 4] = IGNORE_INDEX
    tokens = count((y != IGNORE_INDEX).sum())  # TorchTitan's global_valid_tokens

    losses = [
        t.forward_backward_step(input_dict={"input": x.clone()}, labels=y.clone(), global_valid_tokens=tokens)
        for t in (pp, one)
    ]
    mean = nn.functional.cross_entropy(whole(x).flatten(0, 1), y.flatten(), ignore_index=IGNORE_INDEX)
    assert torch.allclose(losses[0], mean, rtol=RTOL) and torch.allclose(losses[1], mean, rtol=RTOL)
    assert torch.allclose(grad_norm(parts), grad_norm([whole]), rtol=RTOL), (grad_norm(parts), grad_norm([whole]))
    for (name, a), b in zip([(n, p) for m in parts for n, p in m.named_parameters()], whole.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=RTOL, atol=1e-8), name
    assert pp.loss_fn.divisor is None  # validation after the step gets the sum it divides itself


def test_loss_divides_only_inside_dividing_by():
    loss = titan_spec.TokenMeanLoss(lambda pred, labels: pred.sum())
    pred = torch.full((2, 3), 2.0)
    with loss.dividing_by(torch.tensor(4.0)):
        assert loss(pred, None).item() == 3.0
    assert loss(pred, None).item() == 12.0 and loss.divisor is None
    with pytest.raises(RuntimeError), loss.dividing_by(torch.tensor(4.0)):
        raise RuntimeError
    assert loss.divisor is None
