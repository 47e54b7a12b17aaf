"""The step's loss read back: plain tensors in one copy, DTensors (tensor parallelism) each as DTensor reads it;
the sum is the same either way (in-process, a world-size-1 gloo group)."""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate

from tests.single_rank import process_group  # noqa: F401 (autouse fixture)
from timelyfreeze.outputs.metrics_row import loss_sum


def test_dtensor_losses_are_summed_like_plain_ones():
    """PP x TP hands the metrics DTensor losses, which refuse tolist(): the TP torchrun cycle failed on it."""
    values = [0.25, 1.5, 3.125]
    mesh = init_device_mesh("cpu", (1,))
    dtensors = [DTensor.from_local(torch.tensor(v), mesh, [Replicate()]) for v in values]
    assert loss_sum(dtensors) == loss_sum([torch.tensor(v) for v in values]) == sum(values)
    assert loss_sum([]) is None and loss_sum([2.0, 0.5]) == 2.5
