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
    """``set(names, flag)`` on one stage module's parameters (by their names in the module)."""

    def __init__(self, module: torch.nn.Module, params: dict[str, torch.nn.Parameter]):
        self._params = params
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

    def bind(self, names) -> tuple:
        """What :meth:`flip` switches for ``names``, looked up once: the parameters themselves without FSDP (the loop
        then touches no name), the names under FSDP (whose unsharded copies are found at each switch)."""
        if not self._fsdp:
            return tuple(map(self._params.__getitem__, names))
        return tuple(names)

    def flip(self, bound: tuple, flag: bool) -> None:
        """``set`` of the names ``bound`` was made from (:meth:`bind`)."""
        if not self._fsdp:  # (the attribute's setter: the checks of ``requires_grad_``, without its argument parsing)
            for p in bound:
                p.requires_grad = flag
            return
        self.set(bound, flag)

    def set(self, names, flag: bool) -> None:
        if not self._fsdp:
            self.flip(self.bind(names), flag)
            return
        for n in names:
            fp = self._fsdp.get(n)
            if fp is None:
                self._params[n].requires_grad_(flag)
                continue
            for t in (
                fp.sharded_param,
                getattr(fp, "_unsharded_param", None),
                getattr(fp, "_sharded_post_forward_param", None),
            ):
                if t is not None and t.requires_grad != flag:
                    t.requires_grad_(flag)
