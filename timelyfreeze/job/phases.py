"""The TimelyFreeze phases of a run: warm-up, upper- and lower-bound monitoring, progressive ramp, stable.

``derive_phases`` turns the ``[freeze]`` step counts (or, where they are -1, the LR warm-up) into the
inclusive last step of each phase; ``Phases`` answers which phase a step is in and how far the ramp is.
"""

import math
from dataclasses import dataclass
from typing import Protocol

from timelyfreeze.job.errors import FreezeConfigError


@dataclass(frozen=True)
class Phases:
    """Inclusive last step of each TimelyFreeze phase (steps are 1-based)."""

    warmup_end: int
    upper_end: int
    lower_end: int
    ramp_end: int

    def phase(self, step: int) -> str:
        if step <= self.warmup_end:
            return "warmup"
        if step <= self.upper_end:
            return "upper"
        if step <= self.lower_end:
            return "lower"
        if step <= self.ramp_end:
            return "progressive"
        return "stable"

    def ramp(self, step: int) -> float:
        """Fraction of the planned ratio applied at ``step`` (0 up to the plan, linear, then 1)."""
        if step <= self.lower_end:
            return 0.0
        if step >= self.ramp_end:
            return 1.0
        return (step - self.lower_end) / (self.ramp_end - self.lower_end)

    def ranges(self, total_steps: int) -> dict[str, tuple[int, int]]:
        bounds = [
            ("warmup", 1, self.warmup_end),
            ("upper", self.warmup_end + 1, self.upper_end),
            ("lower", self.upper_end + 1, self.lower_end),
            ("progressive", self.lower_end + 1, self.ramp_end),
            ("stable", self.ramp_end + 1, total_steps),
        ]
        return {name: (a, min(b, total_steps)) for name, a, b in bounds if a <= min(b, total_steps)}


class PhaseSettings(Protocol):
    """The ``[freeze]`` fields the phases come from (``timelyfreeze.config.freeze.Freeze``)."""

    warmup_steps: int
    monitor_steps: int
    ramp_steps: int
    plan: str


def derive_phases(cfg: PhaseSettings, total_steps: int, lr_warmup_steps: int) -> Phases:
    """Phase boundaries from the explicit fields, or from the LR warm-up where left at -1."""
    w, m, r = cfg.warmup_steps, cfg.monitor_steps, cfg.ramp_steps
    if cfg.plan:
        # A given plan skips monitoring entirely.
        m = 0
    if (w < 0 or m < 0 or r < 0) and lr_warmup_steps <= 0:
        raise FreezeConfigError(
            "[freeze] warmup_steps/monitor_steps/ramp_steps are derived from [lr_scheduler] warmup_steps, "
            "which is 0: set them explicitly"
        )
    if m < 0:
        m = max(2, math.ceil(0.1 * lr_warmup_steps))
    if w < 0:
        w = max(0, lr_warmup_steps - 2 * m)
    if r < 0:
        r = max(1, math.ceil(0.25 * lr_warmup_steps))
    return Phases(warmup_end=w, upper_end=w + m, lower_end=w + 2 * m, ramp_end=w + 2 * m + r)
