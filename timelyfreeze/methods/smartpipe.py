"""SmartPipe (Niknami, Sawwan, Wu) as a step-level prefix-freezing baseline.

Per global layer, at every check step the gradient-norm difference eta = ||g(t-1) - g(t)|| / ||g(t-1)||
(Def. 2; L2 norms over all the layer's tensors; g(t-1) is the gradient kept from the previous check). After
e1 warm-up steps, each check freezes the longest prefix of active layers with eta < tau (Def. 3), capped at
max(1, floor(lambda * |active|)) layers (Def. 4: "freezes lambda fraction of the remaining active layers";
the floor keeps it "at most", the 1 lets freezing progress once few layers remain). The last layer (final
norm + output) is never frozen, so the model always trains something. Monotonic, no unfreezing (the paper
has none). The ranks exchange the per-layer eta so every rank takes the same decision.
Memory: one copy of the active layers' gradients on their device.
"""

from dataclasses import dataclass
from typing import Any

import torch

from timelyfreeze.job.fields import check_section
from timelyfreeze.methods.base import FreezeMethod, MethodContext
from timelyfreeze.methods.common import Prefix, merge_layer_stats, warmup_of


@dataclass
class SmartPipeConfig:
    tau: float = 1.0
    """tau: a layer may freeze when its gradient-norm difference ||g(t-1) - g(t)|| / ||g(t-1)|| is below this.
    Not stated in the paper (digest 3.5/6); 1.0 is our choice: with noise-dominated minibatch gradients
    the ratio sits near sqrt(2), and it drops below 1 only when consecutive gradients clearly agree."""
    lam: float = 0.25
    """lambda: freezing rate, at most this fraction of the remaining active layers freezes per check (at
    least one, so freezing can progress). The paper only constrains it to (0, 1) (digest 3.2/6); 0.25 is our
    "conservative" choice."""
    e1: int = 0
    """Warm-up steps without freezing (the paper's e1, not stated there); freezing starts after
    max(freeze.warmup_steps, e1)."""
    check_every: int = 10
    """Steps between gradient collections/checks ("regular time intervals t", value not stated in the paper;
    10 matches the other baselines' check frequency)."""

    def validate(self, section: str = "freeze.smartpipe") -> None:
        """``FreezeConfigError`` naming the first field whose type or value cannot work. ``lam`` lies in the
        paper's open interval (0, 1) (Def. 4, digest 3.2): at 1 the cap is every remaining active layer, so
        one check may freeze the whole run of layers below ``tau`` at once, which is no rate at all."""
        check_section(
            self,
            section,
            (
                ("tau", lambda v: v >= 0.0, "must be >= 0"),
                ("lam", lambda v: 0.0 < v < 1.0, "must lie in (0, 1)"),
                ("e1", lambda v: v >= 0, "must be >= 0"),
                ("check_every", lambda v: v >= 1, "must be >= 1"),
            ),
        )


def smartpipe_boundary(eta: dict[int, float], boundary: int, last_layer: int, tau: float, lam: float) -> int:
    """SmartPipe's step: from ``boundary`` (layers in front are frozen), freeze the longest run of layers
    with ``eta < tau``, at most ``max(1, floor(lam * active))`` of them, never ``last_layer``.
    ``active`` = number of layers from ``boundary`` to ``last_layer`` inclusive."""
    active = last_layer + 1 - boundary
    if active <= 1:
        return boundary
    cap = max(1, int(lam * active + 1e-9))
    new = boundary
    while new < last_layer and new - boundary < cap and eta.get(new, float("inf")) < tau:
        new += 1
    return new


class SmartPipe(FreezeMethod):
    """SmartPipe baseline: every microbatch of a step freezes the current global prefix of layers."""

    name = "smartpipe"

    def __init__(self, cfg: Any, ctx: MethodContext):
        super().__init__(cfg, ctx)
        sp = cfg.smartpipe  # validated: SmartPipeConfig.validate
        self.tau = float(sp.tau)
        self.lam = float(sp.lam)
        self.check_every = int(sp.check_every)
        self.start = max(warmup_of(cfg, ctx), int(sp.e1))
        self.prefix = Prefix(ctx.stages)
        self.boundary = 0
        self.num_layers: int | None = None
        self._prev: dict[int, list[torch.Tensor]] = {}
        self.last_eta: dict[int, float] = {}
        self.checks = 0
        self.history: list[tuple[int, int]] = []

    def phase(self, step: int) -> str:
        return "warmup" if step <= self.start else "active"

    def frozen_tensors(self, step: int, stage: int, microbatch: int, accum: int = 0) -> frozenset[str]:
        if step <= self.start:
            return frozenset()
        return self.prefix.names(stage, self.boundary)

    @torch.no_grad()
    def _local_eta(self) -> dict[int, float]:
        """eta of every local active layer that has a previous gradient; stores the current ones."""
        layers, sq = [], []
        for layer in self.prefix.local_layers:
            if layer < self.boundary:
                self._prev.pop(layer, None)
                continue
            params = self.prefix.layer_params(layer)
            cur = [
                (
                    p.grad.detach().to(torch.float32, copy=True)
                    if p.grad is not None
                    else torch.zeros(p.shape, dtype=torch.float32, device=p.device)
                )
                for p in params
            ]
            prev = self._prev.get(layer)
            if prev is not None:
                num = torch.stack([(a - b).pow(2).sum() for a, b in zip(prev, cur)]).sum()
                den = torch.stack([a.pow(2).sum() for a in prev]).sum()
                layers.append(layer)
                sq.append(torch.stack([num, den]))
            self._prev[layer] = cur
        if not layers:
            return {}
        dev = sq[0].device
        figures = torch.stack([x.to(dev) for x in sq]).tolist()  # one host sync per check
        return {layer: (num**0.5 / den**0.5 if den > 0 else float("inf")) for layer, (num, den) in zip(layers, figures)}

    def after_backward(self, step: int) -> None:
        if step % self.check_every != 0:
            return
        self.checks += 1
        local = self._local_eta()
        gathered = self.ctx.all_gather({"eta": local, "max_layer": max(self.prefix.local_layers, default=-1)})
        eta = merge_layer_stats([g["eta"] for g in gathered])
        self.num_layers = max(g["max_layer"] for g in gathered) + 1
        self.last_eta = eta
        if step < self.start or not eta:
            return
        new = smartpipe_boundary(eta, self.boundary, self.num_layers - 1, self.tau, self.lam)
        if new > self.boundary:
            self.boundary = new
            self.history.append((step, new))
            for layer in list(self._prev):
                if layer < new:
                    del self._prev[layer]

    def state_dict(self) -> dict[str, Any]:
        return {
            "boundary": self.boundary,
            "num_layers": self.num_layers,
            "prev": {k: [t.detach().cpu().clone() for t in v] for k, v in self._prev.items()},
            "checks": self.checks,
            "history": list(self.history),
            "last_eta": dict(self.last_eta),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.boundary = int(state["boundary"])
        self.num_layers = state["num_layers"]
        self._prev = {}
        for k, ts in state["prev"].items():
            params = self.prefix.layer_params(int(k))
            if len(params) == len(ts):
                self._prev[int(k)] = [t.to(p.device, torch.float32).clone() for t, p in zip(ts, params)]
        self.checks = int(state["checks"])
        self.history = [tuple(x) for x in state["history"]]
        self.last_eta = dict(state.get("last_eta", {}))

    def summary(self) -> dict[str, Any]:
        return {
            "checks": self.checks,
            "tau": self.tau,
            "lam": self.lam,
            "frozen_layers": self.boundary,
            "num_layers": self.num_layers,
            "boundary_history": [list(x) for x in self.history],
        }
