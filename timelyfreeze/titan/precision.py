"""Start-up checks of a job's precision and memory: a learning rate too small to move pure bf16 weights, and
APF's extra copies against the device's memory.

**bf16 and the learning rate.** A bf16 number has 8 significant bits: the weights next to ``w`` lie
``|w| * 2^-7`` to ``|w| * 2^-8`` apart, so rounding to nearest keeps ``w`` unless an update moves it by about
``|w| * 2^-8`` or more. Adam's update of an element is about ``lr`` in size (its normalised step), so with the
parameters themselves in bf16 (``[training] dtype = "bfloat16"``, or PP without FSDP, where TorchTitan turns
mixed precision off) a weight of the typical magnitude ``TYPICAL_WEIGHT = 0.02`` moves only when
``lr >= 0.02 * 2^-8 = 7.8e-5`` (``MIN_BF16_LR``). Below that most updates round away (at lr 3e-6, a few % of
N(0, 0.02) weights move at all; RMSNorm weights near 1 never do): the run would not learn, and the
warning line says so. With fp32 parameters (FSDP mixed precision keeps fp32 masters and computes in bf16)
nothing is lost and nothing is said.

**APF's copies.** APF keeps three fp32 tensors per parameter it watches (a snapshot and two moving averages,
``timelyfreeze.methods.apf``): 12 bytes per element on the device, on top of the training state. At 8B with PP=4
a stage holds about 2.3B parameters, so +27 GB per GPU. We refuse it, in one ``error:`` line with the figure,
when the copies would take more than ``APF_DEVICE_SHARE`` (a quarter) of the device's memory: keeping them on
the host would add a device-host copy of every parameter at every check (GBs over PCIe, which would distort
the very step times the comparison is about), and bounding them to a subset of tensors would no longer be APF.
On CPU (host memory) there is no such limit.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from timelyfreeze.job.errors import FreezeConfigError

BF16_SPACING = 2.0**-8
"""Relative spacing of bf16 numbers, at the lower end (round to nearest keeps a weight below about this)."""
TYPICAL_WEIGHT = 0.02
"""A typical weight magnitude (Llama's initialisation std)."""
MIN_BF16_LR = TYPICAL_WEIGHT * BF16_SPACING
"""The smallest learning rate that moves a typical pure bf16 weight (module docstring)."""
APF_COPIES = 3
"""fp32 tensors APF keeps per watched parameter."""
APF_DEVICE_SHARE = 0.25
"""The share of the device's memory APF's copies may take."""


def bf16_lr_warning(param_dtypes: Iterable[torch.dtype], lr: float) -> str | None:
    """The start-up warning when trainable parameters are pure bf16 and ``lr`` is below ``MIN_BF16_LR``; None
    otherwise."""
    if torch.bfloat16 not in set(param_dtypes) or lr >= MIN_BF16_LR:
        return None
    return (
        f"[freeze] warning: parameters are pure bf16 and lr {lr:g} < {MIN_BF16_LR:.2g} (a weight of magnitude "
        f"{TYPICAL_WEIGHT} moves only by steps >= {TYPICAL_WEIGHT} x 2^-8): most updates round away and the run "
        "will barely learn; keep fp32 master weights (FSDP mixed precision: [parallelism] "
        'data_parallel_shard_degree > 1 with [training] dtype = "float32") or raise the learning rate'
    )


def apf_extra_bytes(trainable_elements: int) -> int:
    """Bytes of APF's fp32 copies for ``trainable_elements`` watched elements."""
    return APF_COPIES * 4 * trainable_elements


def check_apf_memory(method: str, trainable_elements: int, device_bytes: int | None) -> None:
    """Refuse APF (and its hybrid) when its copies would take more than ``APF_DEVICE_SHARE`` of the device's
    ``device_bytes`` (None: host memory, no limit) in one line with the figures and the reason."""
    if "apf" not in method or device_bytes is None:
        return
    need = apf_extra_bytes(trainable_elements)
    if need > APF_DEVICE_SHARE * device_bytes:
        raise FreezeConfigError(
            f"[freeze] method = {method!r}: APF keeps {APF_COPIES} fp32 copies of this rank's "
            f"{trainable_elements / 1e9:.2f}B trainable parameters ({need / 2**30:.1f} GiB), more than "
            f"{APF_DEVICE_SHARE:.0%} of the device's {device_bytes / 2**30:.0f} GiB; refused (host copies would add "
            "a device-host transfer of every parameter per check and distort the timings compared): use more "
            "pipeline stages or a smaller model"
        )
