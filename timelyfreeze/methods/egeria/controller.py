"""Egeria's freezing decisions: Algorithm 1 (smoothed plasticity, slope, tolerance, stale counter),
bootstrapping on the training loss, and unfreezing everything after a 10x learning-rate drop.

Free of torch and threads: every rank feeds the controller the same gathered numbers and so reaches the
same decisions. Its ``state_dict`` is plain data (numbers, lists, tuples), stored in checkpoints as JSON.
"""

import copy
import math
from typing import Any

from timelyfreeze.methods.egeria.sp_loss import linear_slope


class EgeriaController:
    """Egeria's decision state (Algorithm 1 + bootstrapping + LR unfreezing), free of torch and threads:
    every rank feeds it the same gathered numbers and so reaches the same decisions."""

    def __init__(
        self,
        window: int,
        tolerance_coef: float,
        tolerance_readings: int,
        bootstrap_loss_rate: float,
        unfreeze_lr_drop: float,
    ):
        """The arguments are ``EgeriaConfig`` fields that have passed its ``validate`` (``window >= 2``)."""
        self.window = int(window)
        self.window_eff = int(window)
        self.tolerance_coef = float(tolerance_coef)
        self.tolerance_readings = max(1, int(tolerance_readings))
        self.bootstrap_loss_rate = float(bootstrap_loss_rate)
        self.unfreeze_lr_drop = float(unfreeze_lr_drop)
        self.last_layer: int | None = None
        """Index of the head; never frozen. Set once the layout is known."""
        self.bootstrapped = False
        self.prev_loss: float | None = None
        self.cur = 0
        """Frontmost active module: layers ``< cur`` are frozen."""
        self.generation = 0
        """Bumped on every unfreeze-all; readings of an older generation are dropped."""
        self.freeze_lr: float | None = None
        self.events: list[tuple[int, str, int]] = []
        self._reset_module()

    def _reset_module(self) -> None:
        self.raw: list[float] = []
        self.smoothed: list[float] = []
        self.first_slopes: list[float] = []
        self.tolerance: float | None = None
        self.stale = 0
        self.last_slope: float | None = None

    @property
    def done(self) -> bool:
        return self.last_layer is not None and self.cur >= self.last_layer

    def observe_loss(self, step: int, loss: float | None, may_end: bool) -> bool:
        """Bootstrapping check with the mean loss of the last interval. True when bootstrapping ends now."""
        if self.bootstrapped or loss is None or not math.isfinite(loss):
            return False
        prev, self.prev_loss = self.prev_loss, loss
        if prev is None or prev == 0:
            return False
        rate = abs(prev - loss) / abs(prev)
        if may_end and rate < self.bootstrap_loss_rate:
            self.bootstrapped = True
            self.events.append((step, "bootstrap_end", -1))
            return True
        return False

    def observe_plasticity(self, step: int, module: int, generation: int, value: float, lr: float) -> bool:
        """One plasticity reading. True when it froze module ``cur``."""
        if not self.bootstrapped or self.done or module != self.cur or generation != self.generation:
            return False
        if not math.isfinite(value):
            return False
        w = self.window_eff
        self.raw.append(value)
        self.smoothed.append(sum(self.raw[-w:]) / len(self.raw[-w:]))
        if len(self.smoothed) < 2:
            return False
        s = abs(linear_slope(self.smoothed[-w:]))
        self.last_slope = s
        if self.tolerance is None:
            self.first_slopes.append(s)
            if len(self.first_slopes) >= self.tolerance_readings:
                self.tolerance = self.tolerance_coef * max(self.first_slopes)
        if self.tolerance is not None:
            self.stale = self.stale + 1 if s < self.tolerance else 0
            if self.stale >= w:
                if self.freeze_lr is None:
                    self.freeze_lr = float(lr)
                self.events.append((step, "freeze", self.cur))
                self.cur += 1
                self._reset_module()
                return True
        return False

    def check_lr(self, step: int, lr: float) -> bool:
        """Unfreeze everything when the LR fell by ``unfreeze_lr_drop`` since the first freeze."""
        if self.freeze_lr is None or self.cur == 0:
            return False
        if lr <= self.freeze_lr / self.unfreeze_lr_drop:
            self.events.append((step, "unfreeze_all", self.cur))
            self.cur = 0
            self.freeze_lr = None
            self.window_eff = max(2, self.window_eff // 2)
            self.generation += 1
            self._reset_module()
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        return {k: copy.deepcopy(v) for k, v in vars(self).items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, copy.deepcopy(v))
