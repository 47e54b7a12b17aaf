"""TimelyFreeze: how much each backward action freezes comes from the plan; which tensors, uniformly at random.

Phases (``timelyfreeze.job.phases.Phases``): warm-up (nothing frozen, nothing used) -> upper-bound
monitoring (nothing frozen) -> lower-bound monitoring (every freezable tensor frozen) -> the plan
is made (by the trainer, which owns the measurements and the process group; see ``set_plan``) ->
progressive ramp (each action's ratio rises linearly from 0 to its planned value) -> stable.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from planner.schedule.actions import FREEZABLE_KINDS, parse_action
from timelyfreeze.job.phases import Phases
from timelyfreeze.methods.base import FreezeMethod, MethodContext
from timelyfreeze.methods.common import Units
from timelyfreeze.methods.selection import action_generator


class TimelyFreezeMethod(FreezeMethod):
    name = "timelyfreeze"
    monitor_phases = ("upper", "lower")
    masks_fixed_in_batch = True  # the plan, the phase and (hybrids) the metric's marks change between steps

    def __init__(self, cfg: Any, ctx: MethodContext):
        super().__init__(cfg, ctx)
        if ctx.phases is None:
            raise ValueError(f"method {self.name!r} needs the phases the runtime derives (MethodContext.phases)")
        self.phases: Phases = ctx.phases
        self._units = {v.stage: Units(v) for v in ctx.stages}
        """Per stage, what a draw picks from (tensors, or whole blocks with ``[freeze] unit = "block"``)."""
        self.compile_step = self.phases.warmup_end if ctx.compiled else None
        """Under ``torch.compile``, the last warm-up step freezes every unit, so that the frozen variant of every
        compiled block is compiled there and not inside the lower-bound window (``docs/compile.md``)."""
        self.planned_ratio: dict[tuple[int, int], float] | None = None
        """(stage, microbatch) -> planned ratio of that action's B or W; None before the plan."""
        self.plan_failed: str | None = None

    # -- plan -------------------------------------------------------------------------------
    def needs_plan(self, step: int) -> bool:
        """True at the end of the last lower-bound step, when the trainer must call ``set_plan``."""
        return self.planned_ratio is None and self.plan_failed is None and step >= self.phases.lower_end

    def set_plan(self, action_ratios: dict[str, float] | None, failure: str | None = None) -> None:
        """Install the plan's per-action ratios (``{"1B3": 0.4, ...}``), or record why there is none."""
        if action_ratios is None:
            self.plan_failed = failure or "no plan"
            return
        ratios: dict[tuple[int, int], float] = {}
        for name, r in action_ratios.items():
            a = parse_action(name)
            if a.kind in FREEZABLE_KINDS:
                ratios[(a.stage, a.microbatch)] = float(r)
        self.planned_ratio = ratios

    def steady_phases(self, seen: set[str]) -> tuple[str, ...]:
        return ("stable",)

    # -- decisions --------------------------------------------------------------------------
    def phase(self, step: int) -> str:
        p = self.phases.phase(step)
        if p in ("progressive", "stable") and self.planned_ratio is None:
            return "noplan"
        return p

    def _freezes_all(self, step: int, phase: str | None = None) -> bool:
        """The lower-bound window, and under compile the last warm-up step: every unit frozen (``phase``: the step's,
        where the caller read it already)."""
        return (phase or self.phases.phase(step)) == "lower" or step == self.compile_step

    def action_ratio(self, step: int, stage: int, microbatch: int) -> float:
        p = self.phases.phase(step)
        if self._freezes_all(step, p):
            return 1.0
        if (p == "progressive" or p == "stable") and self.planned_ratio is not None:
            return self.planned_ratio.get((stage, microbatch), 0.0) * self.phases.ramp(step)
        return 0.0

    def mask_step(self, step: int) -> int:
        """The step whose seed draws the masks: a fresh draw every ``resample_every`` steps."""
        every = max(1, int(self.cfg.advanced.resample_every))
        return ((step - 1) // every) * every + 1

    def generator(self, seed: int, step: int, stage: int, microbatch: int, accum: int = 0) -> torch.Generator:
        """``action_generator(seed, step, stage, microbatch, accum)``: this thread's one generator, reseeded (a
        generator per thread: DualPipeV's overlap callback may run a pair's two parts in two threads)."""
        gens = self.__dict__.get("_gens")
        if gens is None:  # made on first use (also for subclasses that skip __init__)
            gens = self._gens = threading.local()
        gen = getattr(gens, "gen", None)
        if gen is None:
            gen = gens.gen = torch.Generator()
        return action_generator(seed, step, stage, microbatch, accum, into=gen)

    def select(self, step: int, stage: int, microbatch: int, ratio: float, accum: int = 0) -> frozenset[str]:
        if ratio >= 1.0:  # what the balanced draw gives at ratio 1, without seeding a generator it would not read
            return self._units[stage].all_tensors()
        gen = self.generator(self.cfg.seed, self.mask_step(step), stage, microbatch, accum)
        return self._units[stage].balanced(ratio, gen)

    def frozen_tensors(self, step: int, stage: int, microbatch: int, accum: int = 0) -> frozenset[str]:
        ratio = self.action_ratio(step, stage, microbatch)
        if ratio <= 0.0:
            return frozenset()
        if self._freezes_all(step):
            return self._units[stage].all_tensors()
        return self.select(step, stage, microbatch, ratio, accum)

    # -- checkpoint -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "planned_ratio": None if self.planned_ratio is None else dict(self.planned_ratio),
            "plan_failed": self.plan_failed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pr = state["planned_ratio"]
        if pr is not None:
            bad = [
                (k, v)
                for k, v in pr.items()
                if not (
                    isinstance(k, tuple)
                    and len(k) == 2
                    and 0 <= k[0] < self.ctx.num_stages
                    and 0 <= k[1] < self.ctx.num_microbatches
                    and isinstance(v, (int, float))
                    and 0 <= v <= 1
                )
            ]
            if bad:
                raise ValueError(f"planned_ratio entry {bad[0]} is not (stage, microbatch) -> ratio in [0, 1]")
            pr = {(int(s), int(m)): float(v) for (s, m), v in pr.items()}
        self.planned_ratio = pr
        self.plan_failed = state["plan_failed"]

    def summary(self) -> dict[str, Any]:
        return {"plan_failed": self.plan_failed}
