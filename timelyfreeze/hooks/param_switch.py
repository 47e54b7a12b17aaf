"""Switch ``requires_grad`` of a stage's parameter tensors, whether or not FSDP2 shards them.

Without FSDP a module computes with the very ``nn.Parameter`` it registers, so freezing a tensor for a
microbatch is ``p.requires_grad_(False)`` around that microbatch's actions.

FSDP2 (``fully_shard``) registers a *sharded* parameter on the module and, for the forward and
backward, swaps in an *unsharded* parameter built from an all-gather. The unsharded parameter copies
``requires_grad`` from the sharded one only when it is swapped in (``FSDPParam.to_unsharded``). Under
pipeline parallelism TorchTitan keeps a stage unsharded from its first forward to the end of the step
(``reshard_after_forward`` is off with PP), so every microbatch after the first would compute with the
flags of the first. The switch therefore sets the flag on both: the sharded parameter (read when the
stage is next unsharded) and the unsharded one the module computes with now. Autograd then records no
edge to a frozen tensor for that microbatch, FSDP's post-backward finds no gradient from it, and the
reduce-scatter at the end of the step sums only what the unfrozen microbatches produced.

FSDP2 also decides, once, at a root module's first forward ("lazy init"), which tensors of each group
need gradients and picks the group's gradient dtypes from those alone. If a freezing phase is on at that
first forward (a run resumed in the lower-bound phase, which freezes everything), a block whose tensors
are all frozen gets no gradient dtype and, with bf16 compute, its later gradients are refused. So the
switch runs that initialisation when it is built, while every tensor still requires a gradient.

FSDP2's ``FSDPParam`` objects are found through the module's FSDP state (private torch API, checked
against torch 2.13); without FSDP every tensor is switched directly. Under FSDP, a tensor the switch
cannot find in FSDP's state would be frozen only on its sharded copy (not exactly): that is an error.
"""

from __future__ import annotations

import torch

from timelyfreeze.job.errors import FreezeConfigError


def _fsdp_params_by_name(module: torch.nn.Module) -> dict[str, object]:
    """``FSDPParam`` of every FSDP-managed parameter under ``module``, by its name in ``module``."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover -- torch without FSDP2
        return {}
    prefix = {id(m): name for name, m in module.named_modules()}
    out: dict[str, object] = {}
    for m in module.modules():
        if not isinstance(m, FSDPModule):
            continue
        for group in m._get_fsdp_state()._fsdp_param_groups:
            for fp in group.fsdp_params:
                info = fp._module_info
                owner = prefix.get(id(info.module))
                if owner is not None:
                    out[f"{owner}.{info.param_name}" if owner else info.param_name] = fp
    return out


class ParamSwitch:
    """``requires_grad`` of one stage module's parameters (by their names in the module), switched from one set of
    tensors off to the next: :attr:`off` says which are off now, and :meth:`move` sets only the flags that differ."""

    def __init__(self, module: torch.nn.Module, params: dict[str, torch.nn.Parameter]):
        self._names = tuple(params)
        self._tensors = tuple(params.values())
        self._bit = {n: 1 << i for i, n in enumerate(params)}
        self.off = 0
        """The tensors off now, as :meth:`bits` writes them (every flag the switch set; 0: every tensor on)."""
        self._fsdp = _fsdp_params_by_name(module)
        if not self._fsdp:
            return
        unknown = [n for n in params if n not in self._fsdp]
        if unknown:
            raise FreezeConfigError(
                f"parameter {unknown[0]!r}: not managed by FSDP2 although its stage is "
                "sharded; the freezing runtime cannot freeze it exactly"
            )
        state = module._get_fsdp_state()  # the stage module is the FSDP root of its stage
        state._lazy_init()

    @property
    def sharded(self) -> bool:
        """True if FSDP2 manages (some of) the stage's parameters."""
        return bool(self._fsdp)

    def bits(self, names) -> int:
        """``names`` as one integer, looked up once: bit ``i`` for the ``i``-th tensor in registration order."""
        out = 0
        for n in names:
            out |= self._bit[n]
        return out

    def move(self, target: int) -> None:
        """Switch off exactly the tensors of ``target`` (:meth:`bits`), every other one on, from :attr:`off`: only the
        flags that differ are set (a tensor off in both stays off untouched)."""
        off = self.off
        if off == target:
            return
        self.off = target
        on, down = off & ~target, target & ~off
        if self._fsdp:
            self._set_fsdp(self._names_of(on), True)
            self._set_fsdp(self._names_of(down), False)
            return
        tensors = self._tensors  # (the attribute's setter: the checks of ``requires_grad_``, without its parsing)
        while on:
            low = on & -on
            tensors[low.bit_length() - 1].requires_grad = True
            on ^= low
        while down:
            low = down & -down
            tensors[low.bit_length() - 1].requires_grad = False
            down ^= low

    def set(self, names, flag: bool) -> None:
        """``requires_grad = flag`` on ``names``, the others as they are."""
        bits = self.bits(names)
        self.move(self.off & ~bits if flag else self.off | bits)

    def _names_of(self, bits: int) -> list[str]:
        return [n for i, n in enumerate(self._names) if bits >> i & 1]

    def _set_fsdp(self, names, flag: bool) -> None:
        """``requires_grad = flag`` on the sharded and unsharded copies of ``names`` (every name FSDP manages: the
        constructor refuses a stage where it does not)."""
        for n in names:
            fp = self._fsdp[n]
            for t in (
                fp.sharded_param,
                getattr(fp, "_unsharded_param", None),
                getattr(fp, "_sharded_post_forward_param", None),
            ):
                if t is not None and t.requires_grad != flag:
                    t.requires_grad_(flag)
