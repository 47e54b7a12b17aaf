"""Start-up precision checks: the warning for pure bf16 weights with a learning rate too small to move them,
and APF refused where its fp32 copies would not fit the device (``timelyfreeze.titan.precision``)."""

from __future__ import annotations

import tomllib

import pytest
import torch

from timelyfreeze.job.errors import FreezeConfigError
from timelyfreeze.titan import precision
from timelyfreeze.titan.launch import CONFIGS


def test_rule_is_two_to_the_minus_8_of_a_typical_weight():
    assert precision.MIN_BF16_LR == 0.02 / 256
    # the rule's premise: a step of MIN_BF16_LR moves a 0.02 bf16 weight, a step of a third of it does not
    w = torch.tensor(0.02, dtype=torch.bfloat16)
    assert (w + precision.MIN_BF16_LR).to(torch.bfloat16) != w
    assert (w + precision.MIN_BF16_LR / 3).to(torch.bfloat16) == w


def test_warning_only_for_pure_bf16_with_a_small_lr():
    line = precision.bf16_lr_warning([torch.bfloat16], 3e-6)
    assert line is not None and "3e-06" in line and "\n" not in line
    assert precision.bf16_lr_warning([torch.bfloat16], 1e-4) is None
    assert precision.bf16_lr_warning([torch.float32], 3e-6) is None  # fp32 masters: nothing lost


def test_apf_refused_where_its_copies_do_not_fit():
    stage = 2_270_000_000  # the largest stage of Llama-3-8B at PP=4
    h100 = 80 * 2**30
    with pytest.raises(FreezeConfigError) as e:
        precision.check_apf_memory("apf", stage, h100)
    msg = str(e.value)
    assert msg.startswith("[freeze] method = 'apf'") and "25.4 GiB" in msg and "\n" not in msg
    with pytest.raises(FreezeConfigError):
        precision.check_apf_memory("timelyfreeze_apf", stage, h100)
    precision.check_apf_memory("apf", 100_000_000, h100)  # 1.1 GiB: fine
    precision.check_apf_memory("apf", stage, None)  # host memory (CPU): no limit
    precision.check_apf_memory("timelyfreeze", stage, h100)


def test_8b_config_keeps_fp32_masters_and_a_learning_rate_that_moves_bf16():
    cfg = tomllib.loads((CONFIGS / "llama3_8b_gpu.toml").read_text())
    assert cfg["training"].get("dtype", "float32") == "float32"
    assert cfg["training"]["mixed_precision_param"] == "bfloat16"
    assert cfg["training"]["mixed_precision_reduce"] == "float32"
    assert cfg["parallelism"]["data_parallel_shard_degree"] > 1  # FSDP: TorchTitan's mixed precision with PP
    # below MIN_BF16_LR, but the steps add up in the fp32 master and reach the bf16 compute copy within a few
    lr = cfg["optimizer"]["lr"]
    master = torch.tensor(0.02, dtype=torch.float32)
    compute = master.to(torch.bfloat16)
    steps = 0
    while master.to(torch.bfloat16) == compute:
        master -= lr
        steps += 1
    assert steps <= 8 and (torch.tensor(0.02, dtype=torch.bfloat16) - lr).to(torch.bfloat16) == compute
