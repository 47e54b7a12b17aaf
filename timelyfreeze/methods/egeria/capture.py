"""Taking one microbatch's activations off the training thread for an Egeria evaluation.

``StageCapture`` hooks a stage for one step and keeps, as fp32 CPU copies, the stage input of the first
microbatch that runs and the output of one layer module during that same forward. ``Copier`` makes those
copies without stalling training (pinned memory + ``non_blocking`` on CUDA, with one event the worker
waits on). ``first_tensor`` picks the activation out of whatever a module returns.
"""

from typing import Any

import torch
from torch.utils._pytree import tree_map_only


def first_tensor(out: Any) -> torch.Tensor | None:
    """The first tensor in a module output (a tensor, or nested tuples / lists / dicts)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        for x in out:
            t = first_tensor(x)
            if t is not None:
                return t
    if isinstance(out, dict):
        for x in out.values():
            t = first_tensor(x)
            if t is not None:
                return t
    return None


class Copier:
    """Copies tensors to CPU without stalling the training thread: on CUDA into pinned memory with
    ``non_blocking`` and one event the worker waits on; on CPU a plain clone."""

    def __init__(self) -> None:
        self.cuda = False

    def __call__(self, t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        t = t.detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        if t.is_cuda:
            self.cuda = True
            dst = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            dst.copy_(t, non_blocking=True)
            return dst
        return t.clone()

    def event(self) -> Any:
        """A CUDA event recorded after every copy issued so far (None when nothing was on CUDA)."""
        if not self.cuda:
            return None
        ev = torch.cuda.Event()
        ev.record()
        return ev


class StageCapture:
    """Forward hooks on ``stage_module`` (pre + post) and ``layer_module`` (post) for one step. The first
    forward to start is captured: its args/kwargs and the layer's first output tensor, fp32 on CPU.
    Later microbatches are ignored. ``close()`` removes the hooks."""

    def __init__(
        self,
        stage_module: torch.nn.Module,
        layer_module: torch.nn.Module,
        *,
        stage: int,
        layer: int,
        step: int,
        name: str,
    ):
        self.stage, self.layer, self.step, self.name = stage, layer, step, name
        self.state = "idle"
        """idle -> capturing (inside the captured forward) -> done (that forward returned)."""
        self.copier = Copier()
        self.args: Any = None
        self.kwargs: Any = None
        self.a_t: torch.Tensor | None = None
        self._hooks = [
            stage_module.register_forward_pre_hook(self._pre, with_kwargs=True),
            layer_module.register_forward_hook(self._layer_out),
            stage_module.register_forward_hook(self._post),
        ]

    @property
    def complete(self) -> bool:
        return self.state == "done" and self.a_t is not None

    def _pre(self, _m: Any, args: Any, kwargs: Any) -> None:
        if self.state == "idle":
            self.state = "capturing"
            self.args, self.kwargs = tree_map_only(
                torch.Tensor, lambda t: self.copier(t, torch.float32), (args, kwargs)
            )

    def _layer_out(self, _m: Any, _a: Any, out: Any) -> None:
        if self.state == "capturing" and self.a_t is None:
            t = first_tensor(out)
            if t is not None:
                self.a_t = self.copier(t, torch.float32)

    def _post(self, _m: Any, _a: Any, _out: Any) -> None:
        if self.state == "capturing":
            self.state = "done"

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
