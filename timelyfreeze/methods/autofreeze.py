"""AutoFreeze (Liu, Agarwal, Venkataraman 2021) as a step-level prefix-freezing baseline, and its metric.

Per global layer (embedding, each block, head): the L1 gradient norm summed over the steps since the last
check; at a check its change ratio |prev - cur| / prev. The ranks exchange the per-layer figures, so every
rank sees the whole model and takes the same decision: threshold = the p-th percentile of the ratios of the
active layers (those at or behind the frozen prefix), the prefix boundary moves to the first active layer
whose ratio is at or above the threshold, and every layer in front of it is frozen (official code's rule,
anchors 1.3 / digest 1.10). Monotonic: nothing unfreezes. Also home of the prefix helpers the other
prefix methods (SmartPipe, Egeria) use.
"""

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from timelyfreeze.job.fields import check_section
from timelyfreeze.job.stage_view import StageView
from timelyfreeze.methods.base import FreezeMethod, MethodContext
from timelyfreeze.methods.common import Prefix, merge_layer_stats, warmup_of


@dataclass
class AutoFreezeConfig:
    percentile: float = 80.0
    """p: a block freezes (in prefix order) while its gradient-norm change is below the p-th percentile of
    the changes of the still-active layers. 80 is what TimelyFreeze used for all five models (digest
    1.10/6); the authors' fork and PipeTransformer default to 50."""
    check_every: int = 10
    """Steps between checks (digest 1.10/6: fork's ``stability_check_freq`` = 10). A layer's gradient norm
    at a check is the per-step L1 gradient norm summed over the steps since the previous check, as the
    official AutoFreeze code accumulates it (anchors 1.3)."""

    def validate(self, section: str = "freeze.autofreeze") -> None:
        """``FreezeConfigError`` naming the first field whose type or value cannot work."""
        check_section(
            self,
            section,
            (
                ("percentile", lambda v: 0.0 <= v <= 100.0, "must lie in [0, 100]"),
                ("check_every", lambda v: v >= 1, "must be >= 1"),
            ),
        )


def autofreeze_boundary(ratios: dict[int, float], boundary: int, percentile: float) -> int:
    """AutoFreeze's prefix rule. ``ratios``: change ratio of every active layer (index >= ``boundary``;
    ``inf`` where it cannot be computed). Returns the new boundary: the first active layer whose ratio is
    at or above the p-th percentile of the active ratios (everything in front of it freezes)."""
    active = sorted(k for k in ratios if k >= boundary)
    if not active:
        return boundary
    vals = np.array([ratios[k] for k in active], dtype=np.float64)
    finite = vals[np.isfinite(vals)]
    if finite.size == 0:
        return boundary
    # inf ratios (no previous norm) rank above every finite one: they never count as stable.
    thr = _percentile_with_inf(vals, percentile)
    start = boundary
    for k in active:
        if ratios[k] >= thr:
            break
        start = k + 1
    return start


def _percentile_with_inf(vals: np.ndarray, percentile: float) -> float:
    """np.percentile with +inf entries treated as the largest values (np.percentile gives nan on inf-inf)."""
    if np.isfinite(vals).all():
        return float(np.percentile(vals, percentile))
    s = np.sort(vals)
    pos = (len(s) - 1) * percentile / 100.0
    lo, hi = int(np.floor(pos)), int(np.ceil(pos))
    if lo == hi or s[lo] == s[hi]:
        return float(s[lo])
    if not np.isfinite(s[hi]):
        return float("inf") if pos > lo else float(s[lo])
    return float(s[lo] + (s[hi] - s[lo]) * (pos - lo))


class AutoFreezeMetric:
    """AutoFreeze's per-layer gradient-norm bookkeeping and prefix decision; shared by ``AutoFreeze`` and
    ``TimelyAutoFreeze``. ``accumulate(step)`` after every backward (local gradients); ``check(step,
    all_gather)`` on check steps (all ranks, same steps); ``boundary`` is the frozen prefix."""

    def __init__(self, cfg: AutoFreezeConfig, stages: list[StageView], warmup_steps: int = 0):
        """``cfg`` has passed ``AutoFreezeConfig.validate``."""
        self.percentile = float(cfg.percentile)
        self.check_every = int(cfg.check_every)
        self.warmup_steps = int(warmup_steps)
        self.prefix = Prefix(stages)
        self.boundary = 0
        self.acc: dict[int, float] = {k: 0.0 for k in self.prefix.local_layers}
        self._pending: dict[int, list[torch.Tensor]] = {}
        self.prev: dict[int, float] | None = None
        self.last_ratios: dict[int, float] = {}
        self.num_layers: int | None = None
        self.checks = 0
        self.history: list[tuple[int, int]] = []  # (step, boundary) whenever it moved

    def is_check(self, step: int) -> bool:
        return step % self.check_every == 0

    @torch.no_grad()
    def accumulate(self) -> None:
        """Add the local layers' L1 gradient norms of this step (tensors without a gradient count 0).
        Sums stay on the gradients' device (no host sync per step) until the next check."""
        for layer in self.acc:
            if layer < self.boundary:
                continue
            norms = [
                p.grad.detach().abs().sum(dtype=torch.float32)
                for p in self.prefix.layer_params(layer)
                if p.grad is not None
            ]
            if norms:
                self._pending.setdefault(layer, []).append(torch.stack(norms).sum())

    def _flush(self) -> None:
        items = [(layer, t) for layer, parts in self._pending.items() for t in parts]
        self._pending = {}
        if not items:
            return
        dev = items[0][1].device
        values = torch.stack([t.to(dev) for _, t in items]).tolist()  # one host sync per check
        for (layer, _), v in zip(items, values):
            self.acc[layer] += v

    def check(self, step: int, all_gather: Callable[[Any], list[Any]]) -> bool:
        """Exchange the accumulated norms and maybe move the prefix. Returns True if the boundary moved."""
        self.checks += 1
        self._flush()
        cur = merge_layer_stats(all_gather(dict(self.acc)))
        self.acc = {k: 0.0 for k in self.acc}
        if cur:
            self.num_layers = max(self.num_layers or 0, max(cur) + 1)
        prev, self.prev = self.prev, cur
        if prev is None:
            return False
        ratios = {}
        for k, c in cur.items():
            if k < self.boundary:
                continue
            p = prev.get(k, 0.0)
            ratios[k] = abs(p - c) / p if p > 0 else float("inf")
        self.last_ratios = ratios
        if step < self.warmup_steps:
            return False
        new = autofreeze_boundary(ratios, self.boundary, self.percentile)
        if new > self.boundary:
            self.boundary = new
            self.history.append((step, new))
            return True
        return False

    def marked(self, stage: int) -> frozenset[str]:
        return self.prefix.names(stage, self.boundary)

    def state_dict(self) -> dict[str, Any]:
        self._flush()
        return {
            "boundary": self.boundary,
            "acc": dict(self.acc),
            "prev": None if self.prev is None else dict(self.prev),
            "num_layers": self.num_layers,
            "checks": self.checks,
            "history": list(self.history),
            "last_ratios": dict(self.last_ratios),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.boundary = int(state["boundary"])
        self.acc = {k: float(state["acc"].get(k, 0.0)) for k in self.acc}
        self.prev = None if state["prev"] is None else {int(k): float(v) for k, v in state["prev"].items()}
        self.num_layers = state["num_layers"]
        self.checks = int(state["checks"])
        self.history = [tuple(x) for x in state["history"]]
        self.last_ratios = dict(state.get("last_ratios", {}))


class AutoFreeze(FreezeMethod):
    """AutoFreeze baseline: every microbatch of a step freezes the current global prefix of layers."""

    name = "autofreeze"

    def __init__(self, cfg: Any, ctx: MethodContext):
        super().__init__(cfg, ctx)
        self.warmup_steps = warmup_of(cfg, ctx)
        self.metric = AutoFreezeMetric(cfg.autofreeze, ctx.stages, self.warmup_steps)

    def phase(self, step: int) -> str:
        return "warmup" if step <= self.warmup_steps else "active"

    def frozen_tensors(self, step: int, stage: int, microbatch: int, accum: int = 0) -> frozenset[str]:
        if step <= self.warmup_steps:
            return frozenset()
        return self.metric.marked(stage)

    def after_backward(self, step: int) -> None:
        self.metric.accumulate()
        if self.metric.is_check(step):
            self.metric.check(step, self.ctx.all_gather)

    def state_dict(self) -> dict[str, Any]:
        return {"metric": self.metric.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.metric.load_state_dict(state["metric"])

    def summary(self) -> dict[str, Any]:
        return {
            "checks": self.metric.checks,
            "percentile": self.metric.percentile,
            "frozen_layers": self.metric.boundary,
            "num_layers": self.metric.num_layers,
            "boundary_history": [list(x) for x in self.metric.history],
        }
