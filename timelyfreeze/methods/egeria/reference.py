"""The reference model Egeria compares a stage against: a CPU copy of the stage, built explicitly.

``build_reference(stage_module)`` constructs a fresh module tree of the same structure on CPU:

- every module is a new instance of the same class, set up by ``nn.Module.__init__`` alone, so all
  of nn.Module's own state (parameter / buffer / child registries and every hook registry: forward,
  backward, state-dict and load-state-dict hooks) starts empty; hooks on the training stage (whoever
  registered them) are therefore never carried over, by construction;
- the class's own configuration attributes (``vars(module)`` minus nn.Module's bookkeeping, e.g.
  ``n_heads``, ``eps``, ``model_args``) are deep-copied, so the class's ``forward`` works unchanged
  (a reference from such an attribute to a module or tensor of the stage maps to its reference copy);
- children are rebuilt recursively; activation-checkpoint / offload wrappers (``ActivationWrapper``,
  what TorchTitan's ``checkpoint_wrapper`` makes) are replaced by the module they wrap: the reference
  runs without autograd, where checkpointing changes nothing but cost. No other stateful wrapper can
  occur: the freezing runtime refuses FSDP, tensor/context parallelism and torch.compile (config.py);
- parameters are new, empty fp32 tensors (non-float ones keep their dtype), not requiring grad; modules
  and tensors shared within the stage stay shared;
- buffers are CPU copies (floating ones in fp32), with their persistence: non-persistent ones (RoPE's
  ``freqs_cis``) are not in a state dict and so come only from here.

The parameter values then come from the stage's ``state_dict()`` with ``load_state_dict(strict=True)``
(``load_snapshot``); the stage's state dict already names tensors as an unwrapped module does (the
checkpoint wrapper strips its prefix), so the keys match. ``build_int8_reference`` derives the int8
dynamically quantised copy (``nn.Linear`` only) that the worker evaluates.
"""

import copy
import warnings
from typing import Any

import torch
from torch import nn

try:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import ActivationWrapper

    _WRAPPERS: tuple[type, ...] = (ActivationWrapper,)
except ImportError:  # torch built without distributed: no checkpoint wrappers exist
    _WRAPPERS = ()

_WRAPPED_PREFIX = "_checkpoint_wrapped_module."
"""The name under which an ``ActivationWrapper`` holds its module (torch's ``_CHECKPOINT_PREFIX``)."""

_MODULE_OWN_ATTRS = frozenset(vars(nn.Module()))
"""Attributes nn.Module itself creates (registries, hook dicts, ``training``): rebuilt, never copied."""


def reference_name(name: str) -> str:
    """A submodule name of the training stage -> the same submodule's name in its reference."""
    return name.replace(_WRAPPED_PREFIX, "")


def _cpu_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float32 if t.is_floating_point() else t.dtype


def _unwrap(module: nn.Module) -> nn.Module:
    while _WRAPPERS and isinstance(module, _WRAPPERS):
        module = module._checkpoint_wrapped_module
    return module


def _rebuild(module: nn.Module, memo: dict[int, Any], pairs: list[tuple[nn.Module, nn.Module]]) -> nn.Module:
    """The module tree (children, parameters, buffers) of the reference; records every (live, new) pair
    and maps every live object to its counterpart in ``memo``."""
    live = _unwrap(module)
    if id(live) in memo:  # a module shared within the stage stays shared
        return memo[id(live)]
    cls = type(live)
    new = cls.__new__(cls)
    nn.Module.__init__(new)
    memo[id(module)] = memo[id(live)] = new
    pairs.append((live, new))
    for name, child in live._modules.items():
        new.add_module(name, None if child is None else _rebuild(child, memo, pairs))
    for name, p in live._parameters.items():
        if p is not None and id(p) not in memo:
            memo[id(p)] = nn.Parameter(torch.empty(p.shape, dtype=_cpu_dtype(p)), requires_grad=False)
        new.register_parameter(name, None if p is None else memo[id(p)])
    for name, b in live._buffers.items():
        if b is not None and id(b) not in memo:
            memo[id(b)] = b.detach().to("cpu", _cpu_dtype(b), copy=True)
        new.register_buffer(
            name, None if b is None else memo[id(b)], persistent=name not in live._non_persistent_buffers_set
        )
    return new


def build_reference(stage_module: nn.Module) -> nn.Module:
    """A fresh fp32 CPU module of ``stage_module``'s structure (see the module docstring), in eval mode.
    Parameters are empty until ``load_snapshot``; buffers are copied now."""
    memo: dict[int, Any] = {}
    pairs: list[tuple[nn.Module, nn.Module]] = []
    ref = _rebuild(stage_module, memo, pairs)
    # configuration attributes last, once the whole tree exists: through ``memo`` an attribute that
    # refers to a module or tensor of the stage gets the reference's counterpart, never a device copy
    for live, new in pairs:
        for name, value in vars(live).items():
            if name not in _MODULE_OWN_ATTRS:
                new.__dict__[name] = copy.deepcopy(value, memo)
    ref.eval()
    ref.requires_grad_(False)
    return ref


def load_snapshot(reference: nn.Module, snapshot: dict[str, torch.Tensor]) -> None:
    """Fill ``reference`` with a CPU copy of the stage's ``state_dict()`` (every key must match)."""
    with torch.no_grad():
        reference.load_state_dict(snapshot, strict=True)


def build_int8_reference(reference: nn.Module) -> nn.Module:
    """An int8 dynamically quantised copy of ``reference`` (its ``nn.Linear`` layers); raises where
    quantisation is unavailable (the caller falls back to the fp32 reference)."""
    from torch.ao.quantization import quantize_dynamic  # deferred: quantization only for Egeria's int8 reference

    with warnings.catch_warnings():  # torch 2.13 deprecates torch.ao.quantization (still works)
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*")
        return quantize_dynamic(reference, {nn.Linear}, dtype=torch.qint8, inplace=False)
