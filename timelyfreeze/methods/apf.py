"""APF (Chen et al., ICDCS'21 / TPDS'23) as a step-level freezing baseline, and its metric for the hybrid.

Per parameter tensor: effective perturbation P = |EMA(D)| / EMA(|D|) of the cumulative update D since the
last check; tensors with P below the threshold are frozen for a TCP-like (additive increase,
multiplicative decrease) period.

Faithfulness notes:
- APF's own metric is element-wise (anchors 1.2). We keep element-wise EMAs and aggregate per tensor as
  P = sum_j |EMA(D_j)| / sum_j EMA(|D_j|), the |D|-weighted mean of the element-wise P_j (also in [0, 1]).
  The TimelyFreeze fork instead takes mean(D) over the tensor's elements before the EMA, which cancels signs
  *across elements* and so calls trending tensors stable; we do not copy that.
- Period rule as in the fork (digest 1.10): stable -> period += check_every; unstable -> period //= 2, and 0
  if it falls below check_every. A stable tensor is frozen for steps (t, t + period] after check t.
- A tensor is evaluated at a check only when it is not frozen at that step; while frozen it does not
  change, so its snapshot stays the reference of the next evaluated update.
- Memory: an fp32 snapshot and two fp32 EMA buffers per tensor (3x the stage's parameters), on the
  parameters' device.
"""

from dataclasses import dataclass
from typing import Any

import torch

from timelyfreeze.job.fields import check_section
from timelyfreeze.job.stage_view import StageView
from timelyfreeze.methods.base import FreezeMethod, MethodContext
from timelyfreeze.methods.common import warmup_of


@dataclass
class APFConfig:
    threshold: float = 0.01
    """Stability threshold phi on the effective perturbation |EMA(D)|/EMA(|D|) in [0, 1]. 0.01 is the value
    TimelyFreeze used for LLaMA-3.2-1B (digest 1.10/6; 0.0001 for 8B/13B, 0.005 for ViT/ConvNeXt); the
    authors' fork defaults to 0.05, the original APF release to 0.1."""
    ema_alpha: float = 0.99
    """EMA decay of the update statistics (digest 1.10: authors' fork, comment "paper: 0.99")."""
    check_every: int = 10
    """Steps between stability checks; also the unit by which a stable tensor's freezing period grows
    (digest 1.10/6: fork's ``stability_check_freq`` = 10)."""

    def validate(self, section: str = "freeze.apf") -> None:
        """``FreezeConfigError`` naming the first field whose type or value cannot work. ``ema_alpha`` lies
        strictly inside (0, 1): at 0 the EMAs are the last update alone, so P = |D|/|D| = 1 and nothing ever
        freezes; at 1 they stay at zero and P = 0 freezes everything."""
        check_section(
            self,
            section,
            (
                ("threshold", lambda v: v >= 0.0, "must be >= 0"),
                ("ema_alpha", lambda v: 0.0 < v < 1.0, "must lie in (0, 1)"),
                ("check_every", lambda v: v >= 1, "must be >= 1"),
            ),
        )


class APFMetric:
    """APF's stability bookkeeping over this rank's stages; shared by ``APF`` and ``TimelyAPF``.

    ``update(step)`` is called after every optimizer step; on check steps it updates the EMAs and the
    freezing periods. ``marked(stage, step)`` is the set APF freezes at ``step``.
    """

    def __init__(self, cfg: APFConfig, stages: list[StageView], warmup_steps: int = 0):
        """``cfg`` has passed ``APFConfig.validate``."""
        self.threshold = float(cfg.threshold)
        self.alpha = float(cfg.ema_alpha)
        self.check_every = int(cfg.check_every)
        self.warmup_steps = int(warmup_steps)
        self.views = {v.stage: v for v in stages}
        keys = [(v.stage, n) for v in stages for n in v.params if n != v.anchor]
        self.keys = keys
        self.period: dict[tuple[int, str], int] = {k: 0 for k in keys}
        self.frozen_until: dict[tuple[int, str], int] = {k: 0 for k in keys}
        self.perturbation: dict[tuple[int, str], float] = {}
        self._snap: dict[tuple[int, str], torch.Tensor] = {}
        self._ema: dict[tuple[int, str], torch.Tensor] = {}
        self._abs_ema: dict[tuple[int, str], torch.Tensor] = {}
        self.checks = 0
        self._cache: tuple[int, dict[int, frozenset[str]]] | None = None

    def _param(self, key: tuple[int, str]) -> torch.Tensor:
        stage, name = key
        return self.views[stage].params[name]

    def is_frozen(self, key: tuple[int, str], step: int) -> bool:
        return step <= self.frozen_until[key]

    def marked(self, stage: int, step: int) -> frozenset[str]:
        """Names of ``stage``'s tensors APF currently holds frozen at ``step``."""
        if self._cache is None or self._cache[0] != step:
            by_stage: dict[int, set[str]] = {s: set() for s in self.views}
            for key in self.keys:
                if step <= self.frozen_until[key]:
                    by_stage[key[0]].add(key[1])
            self._cache = (step, {s: frozenset(v) for s, v in by_stage.items()})
        return self._cache[1].get(stage, frozenset())

    @torch.no_grad()
    def update(self, step: int) -> None:
        """Call after the optimizer step of ``step``; acts only on check steps."""
        if not self._snap:  # first call: the reference point of the first update
            for key in self.keys:
                p = self._param(key)
                self._snap[key] = p.detach().to(torch.float32, copy=True)
                self._ema[key] = torch.zeros_like(self._snap[key])
                self._abs_ema[key] = torch.zeros_like(self._snap[key])
            return
        if step % self.check_every != 0:
            return
        self.checks += 1
        may_freeze = step >= self.warmup_steps  # frozen steps start at step + 1 > warmup
        a = self.alpha
        evaluated, sums = [], []
        for key in self.keys:
            if self.is_frozen(key, step):
                continue
            cur = self._param(key).detach().to(torch.float32)
            delta = cur - self._snap[key]
            self._snap[key].copy_(cur)
            ema, abs_ema = self._ema[key], self._abs_ema[key]
            ema.mul_(a).add_(delta, alpha=1 - a)
            abs_ema.mul_(a).add_(delta.abs_(), alpha=1 - a)
            evaluated.append(key)
            sums.append(torch.stack([ema.abs().sum(), abs_ema.sum()]))
        if not evaluated:
            return
        dev = sums[0].device
        figures = torch.stack([x.to(dev) for x in sums]).tolist()  # one host sync per check
        for key, (num, denom) in zip(evaluated, figures):
            p_eff = num / denom if denom > 0 else 0.0
            self.perturbation[key] = p_eff
            if not may_freeze:
                continue
            if p_eff < self.threshold:
                self.period[key] += self.check_every
                self.frozen_until[key] = step + self.period[key]
            else:
                half = self.period[key] // 2
                self.period[key] = half if half >= self.check_every else 0
        self._cache = None

    def state_dict(self) -> dict[str, Any]:
        def cpu(d: dict) -> dict:
            return {f"{s}/{n}": t.detach().cpu().clone() for (s, n), t in d.items()}

        return {
            "period": {f"{s}/{n}": v for (s, n), v in self.period.items()},
            "frozen_until": {f"{s}/{n}": v for (s, n), v in self.frozen_until.items()},
            "perturbation": {f"{s}/{n}": v for (s, n), v in self.perturbation.items()},
            "snap": cpu(self._snap),
            "ema": cpu(self._ema),
            "abs_ema": cpu(self._abs_ema),
            "checks": self.checks,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        def key(k: str) -> tuple[int, str]:
            s, n = k.split("/", 1)
            return int(s), n

        known = set(self.keys)
        self.period.update({key(k): int(v) for k, v in state["period"].items() if key(k) in known})
        self.frozen_until.update({key(k): int(v) for k, v in state["frozen_until"].items() if key(k) in known})
        self.perturbation = {key(k): float(v) for k, v in state["perturbation"].items() if key(k) in known}
        for name, target in (("snap", self._snap), ("ema", self._ema), ("abs_ema", self._abs_ema)):
            target.clear()
            for k, t in state[name].items():
                if key(k) in known:
                    target[key(k)] = t.to(self._param(key(k)).device, torch.float32).clone()
        if set(self._snap) != known:  # incomplete state: restart the statistics from the current weights
            self._snap.clear(), self._ema.clear(), self._abs_ema.clear()
        self.checks = int(state["checks"])
        self._cache = None

    def frozen_fraction(self, step: int) -> float:
        """Fraction of this rank's freezable tensors held frozen at ``step``."""
        if not self.keys:
            return 0.0
        return sum(step <= self.frozen_until[k] for k in self.keys) / len(self.keys)


class APF(FreezeMethod):
    """APF baseline: every microbatch of a step freezes the tensors APF currently holds frozen."""

    name = "apf"

    def __init__(self, cfg: Any, ctx: MethodContext):
        super().__init__(cfg, ctx)
        self.warmup_steps = warmup_of(cfg, ctx)
        self.metric = APFMetric(cfg.apf, ctx.stages, self.warmup_steps)
        self._last_step = 0

    def phase(self, step: int) -> str:
        return "warmup" if step <= self.warmup_steps else "active"

    def frozen_tensors(self, step: int, stage: int, microbatch: int, accum: int = 0) -> frozenset[str]:
        if step <= self.warmup_steps:
            return frozenset()
        return self.metric.marked(stage, step)

    def after_optimizer_step(self, step: int) -> None:
        self._last_step = step
        self.metric.update(step)

    def state_dict(self) -> dict[str, Any]:
        return {"metric": self.metric.state_dict(), "last_step": self._last_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.metric.load_state_dict(state["metric"])
        self._last_step = int(state.get("last_step", 0))

    def summary(self) -> dict[str, Any]:
        vals = list(self.metric.perturbation.values())
        return {
            "checks": self.metric.checks,
            "threshold": self.metric.threshold,
            "frozen_fraction_last_step": self.metric.frozen_fraction(self._last_step + 1),
            "max_period": max(self.metric.period.values(), default=0),
            "mean_perturbation": sum(vals) / len(vals) if vals else None,
        }
