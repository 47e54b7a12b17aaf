"""Trainer of the overhead benchmark (``timelyfreeze.experiments.runtime.bench``): in the stable phase it
interleaves steps with the freezing runtime's hooks detached (TorchTitan's own ``train_step``) with full
TimelyFreeze steps at ratio 0.

Run with ``[freeze] r_max = 0``: the plan freezes nothing, so an attached step does all of the runtime's
work at ratio 0 (stage hooks, per-action profiler, freezing hook, trace flush, the per-step gather,
metrics, the drift check of online re-planning, a re-plan if one comes due) and computes exactly what a
detached step computes. Steps up to the end of the ramp run normally (monitoring, the plan).

Two figures per step go to ``<dump_folder>/bench_overhead.json`` (global rank 0):

* ``s``: the step's wall time (the slowest rank's); the bench compares attached with detached steps;
* ``direct_s`` (attached steps): the time spent inside the runtime's own code on the rank that spent most, i.e.
  ``begin_step`` and ``end_step``, plus every action's frame around its compute call, plus the runtime's calls inside
  the step (``begin_batch``, where the freezing hook draws the masks on a CPU, ``add_batch`` and ``after_backward``).
  An action's frame is all of the stage hooks' ``_run`` but the compute call: from entering ``_run`` to the
  profiler's start mark and from its end mark to leaving ``_run`` (``_TimedRun``, a wrapper of ``_run`` for the
  step), so it holds the stage hooks' own lines, both listeners' calls (the freezing hook's switches among them) and
  the profiler's own work; of the bench, only its two clock reads. (Up to 9ab9a4d the bench timed the two listeners'
  calls instead, each through a wrapper: the stage hooks' own lines were not counted, the wrappers' frames partly
  were.) The CPU profiler's marks are ``perf_counter`` readings, the bench's clock (the bench runs on CPU). It misses
  indirect costs (cache effects, waits a slower rank causes), and has none of the step-to-step noise of the wall
  times. It includes the time a rank waits in the per-step gather for the other ranks; ``wait_s`` is that wait (the
  rank that waited most) and ``own_s`` the runtime's time without it (per rank ``direct - wait``, the rank that spent
  most): a rank that reaches the gather first waits for what the others still compute, their own code (counted in
  their ``own``) and the step's imbalance between ranks, which a step without the runtime has too.
  ``own_actions_s``, ``own_draws_s`` and ``own_step_s`` split that rank's ``own`` into the actions' frames, the
  freezing hook's draws in ``begin_batch`` (``FreezingHook.prepare``) and the rest (``begin_step``, ``end_step``
  without the wait, and the other calls). Rows of the older bench have ``own_hook_s`` (the hook's listener calls and
  draws), ``own_profiler_s`` (the profiler listener's calls) and ``own_step_s`` instead.

The stable steps cycle attached, detached, detached (``CYCLES``). With ``TIMELYFREEZE_OVERHEAD_MODE=probe`` in
the environment (``bench_runtime.py --overhead-probe``) they cycle attached, detached, *probe*, detached,
detached: a probe step runs the stages' hooked class with
listeners that do nothing and none of the runtime's per-step work, so its difference from its detached
neighbours is what the hook mechanism itself costs.

With ``TIMELYFREEZE_OVERHEAD_MODE=masked`` (``bench_runtime.py --overhead-masked``, run at a plan's ratios,
``r_max > 0``) they cycle attached, *masked*, masked. A masked step is the fair detached step when a plan is in
force: it freezes what the plan says, without the runtime. Before its clock starts, the freezing hook's own
``draw`` picks the frozen tensors of every (local stage, microbatch) of the step (the same method, the same plan in
force, the same draw as an attached step's); during the step a minimal stage-hook listener only switches
``requires_grad`` on them before each action, by the hook's rule and through its ``ParamSwitch`` (every tensor on
again after a stage's last backward): no profiler, trace, gather, metrics or drift check. Each masked row also
has ``draw_s`` (the draw, timed) and ``switch_s`` (the switches, timed),
each the rank that spent most, and ``ratio`` (the mean applied freeze ratio over the step's (stage,
microbatch)s, by elements over every rank's stages, as the metrics' ``freeze_ratio``), as attached rows have
``ratio`` (rows of the older bench also ``hook_s``, the freezing hook's calls: draw and switches inside the full
runtime). One accumulation batch per step (the bench's layouts).
"""

import cProfile
import functools
import json
import os
import time
from pathlib import Path

from timelyfreeze.titan import cpu_shims

cpu_shims.apply_if_needed()

import torch.distributed as dist  # noqa: E402
from torchtitan.train import Trainer  # noqa: E402

from planner.schedule.actions import parse_action  # noqa: E402
from timelyfreeze import train  # noqa: E402
from timelyfreeze.experiments.runtime.analysis import CYCLES, MODE_ENV, PROFILE_ENV  # noqa: E402
from timelyfreeze.hooks import stage_hooks  # noqa: E402
from timelyfreeze.titan.trainer import TimelyFreezeTrainer  # noqa: E402


class _NoListener:
    def before_action(self, stage: int, kind: str, microbatch: int) -> None:
        pass

    def after_action(self, stage: int, kind: str, microbatch: int) -> None:
        pass


class _TimedCall:
    """A call of the runtime's, its time added to ``clock[0]``; with a profiler, profiled too."""

    def __init__(self, call, clock: list[float], prof: cProfile.Profile | None = None):
        self.call, self.clock, self.prof = call, clock, prof

    def __call__(self, *args):
        t = time.perf_counter()
        try:
            if self.prof is None:  # the call alone between the two clock reads (no frame of the bench's own)
                return self.call(*args)
            return _profiled(self.prof, self.call, *args)
        finally:
            dt = time.perf_counter() - t
            self.clock[0] += dt


class _ProfiledListener:
    """A stage-hook listener whose inner listener's calls each run inside ``prof`` (the diagnostic profile; their time
    is counted in the actions' frames, :class:`_TimedRun`)."""

    def __init__(self, inner, prof: cProfile.Profile):
        self.before_action = functools.partial(_profiled, prof, inner.before_action)
        self.after_action = functools.partial(_profiled, prof, inner.after_action)


class _TimedRun:
    """``stage_hooks._run`` (``run``) with each action's frame (``direct_s`` in the module docstring) added to
    ``clock[0]`` and ``actions[0]``: set on the module for an attached step, put back after it. The frame ends at the
    start mark the profiler's ``before_action`` reads and starts again at its end mark (the entry ``after_action``
    appends to the profiler's list during the call: one thread runs the actions, as in every bench schedule)."""

    def __init__(self, run, profiler, clock: list[float], actions: list[float]):
        self.run, self.profiler, self.clock, self.actions = run, profiler, clock, actions

    def __call__(self, stage, kind: str, mb: int, fn, *args, **kwargs):
        ended = self.profiler._ended
        n = len(ended)
        t = time.perf_counter()
        try:
            return self.run(stage, kind, mb, fn, *args, **kwargs)
        finally:
            end = time.perf_counter()
            if len(ended) > n:  # (timed by the profiler: autograd on)
                _, start, stop = ended[n]
                dt = (start - t) + (end - stop)
                self.clock[0] += dt
                self.actions[0] += dt


_RUN = stage_hooks._run
"""The stage hooks' own ``_run``, which an attached step's :class:`_TimedRun` wraps."""

_BATCH_CALLS = ("begin_batch", "add_batch", "after_backward")
"""The runtime's calls the trainer makes inside a step, between ``begin_step`` and ``end_step``."""


class _TimedGather:
    """``JobGroup.start_gather_floats`` of one rank, with the time spent waiting in each gather's ``result``
    added to ``clock[0]`` (set on the job instance for an attached step, removed after it)."""

    def __init__(self, start, clock: list[float]):
        self.start, self.clock = start, clock

    def __call__(self, values):
        return _TimedResult(self.start(values), self.clock)


class _TimedResult:
    def __init__(self, pending, clock: list[float]):
        self.pending, self.clock = pending, clock

    def result(self):
        t = time.perf_counter()
        try:
            return self.pending.result()
        finally:
            self.clock[0] += time.perf_counter() - t


class _MaskListener:
    """The minimal freezing path of a masked step: the step's pre-drawn tensors of (stage, microbatch) off for each of
    its actions, switched as the freezing hook switches them (``ParamSwitch.move``, every tensor on again after the
    stage's last backward of the batch); the switches timed."""

    def __init__(self, hook, masks: dict[tuple[int, int], tuple[str, ...]], clock: list[float]):
        self.switch, self.backward_ended, self.clock = hook.switch, hook.backward_ended, clock
        self.masks = {(st, mb): hook.switch[st].bits(f) for (st, mb), f in masks.items()}  # as the hook keeps them

    def before_action(self, stage: int, kind: str, microbatch: int) -> None:
        t = time.perf_counter()
        self.switch[stage].move(self.masks.get((stage, microbatch), 0))
        self.clock[0] += time.perf_counter() - t

    def after_action(self, stage: int, kind: str, microbatch: int) -> None:
        if kind == "B" or kind == "W":
            t = time.perf_counter()
            self.backward_ended(stage)
            self.clock[0] += time.perf_counter() - t


def _no_draws(step: int, accum: int) -> None:
    """``FreezingHook.prepare`` in a detached step: the trainer still calls the runtime's ``begin_batch``."""


def _profiled(prof: cProfile.Profile | None, call, *args):
    """``call(*args)``, inside ``prof`` when there is one (``PROFILE_ENV``)."""
    if prof is None:
        return call(*args)
    prof.enable()
    try:
        return call(*args)
    finally:
        prof.disable()


def _applied_elements(hook, applied: dict[str, list[tuple[float, int]]]) -> tuple[float, float]:
    """(frozen, trainable) elements over an attached step's backward records (``FreezingHook.applied``)."""

    frozen = total = 0.0
    for name, recs in applied.items():
        stage_total = hook.ratio_total(parse_action(name).stage)
        for r, _ in recs:
            frozen, total = frozen + r * stage_total, total + stage_total
    return frozen, total


class OverheadBenchTrainer(TimelyFreezeTrainer):
    def train_step(self, data_iterator):
        rt = self.freeze_rt
        clock, draw_clock, switch_clock, wait_clock, actions_clock = [0.0], [0.0], [0.0], [0.0], [0.0]
        extra: dict[str, float] = {}
        cycle = CYCLES[os.environ.get(MODE_ENV) or "plain"]
        kind = "cycle" if self.step <= rt.phases.ramp_end else cycle[(self.step - rt.phases.ramp_end - 1) % len(cycle)]
        if kind == "masked":  # drawn before the step's clock starts, timed on its own
            rt.detach_hooks()
            t = time.perf_counter()
            masks = {
                (stage, mb): rt.hook.draw(self.step, stage, mb)
                for stage in rt.hook.views
                for mb in range(rt.method.ctx.num_microbatches)
            }
            extra["draw_s"] = time.perf_counter() - t
            extra["frozen_el"] = sum(rt.hook.ratio_of(st, f) * rt.hook.ratio_total(st) for (st, _), f in masks.items())
            extra["total_el"] = sum(rt.hook.ratio_total(st) for st, _ in masks)
            masked = _MaskListener(rt.hook, masks, switch_clock)  # its tensors bound before the clock, as drawn
        t0 = time.perf_counter()
        if kind in ("cycle", "hooks"):
            prof = self._profiler() if kind == "hooks" else None
            rt.attach_hooks()  # the runtime's listeners, as it installs them
            if prof is not None:  # (the diagnostic profile: each listener call inside cProfile)
                for st in self._pp_stages():
                    stage_hooks.install(st, [_ProfiledListener(x, prof) for x in (rt.hook, rt.profiler)])
            stage_hooks._run = _TimedRun(_RUN, rt.profiler, clock, actions_clock)
            t = time.perf_counter()
            _profiled(prof, rt.begin_step, self.step)
            self._batch_in_step = 0
            clock[0] += time.perf_counter() - t
            for name in _BATCH_CALLS:  # the runtime's calls inside the step, each timed (set on the instance)
                setattr(rt, name, _TimedCall(getattr(rt, name), clock, prof=prof))
            rt.hook.prepare = _TimedCall(rt.hook.prepare, draw_clock)  # (inside begin_batch: the hook's part of it)
            try:
                Trainer.train_step(self, data_iterator)
            finally:
                stage_hooks._run = _RUN
                for name in _BATCH_CALLS:
                    delattr(rt, name)  # the class's own methods again
                del rt.hook.prepare
            extra["frozen_el"], extra["total_el"] = _applied_elements(rt.hook, rt.hook.applied)
            rt.job.start_gather_floats = _TimedGather(rt.job.start_gather_floats, wait_clock)
            t = time.perf_counter()
            try:
                _profiled(prof, rt.end_step, self.step)
            finally:
                clock[0] += time.perf_counter() - t
                del rt.job.start_gather_floats  # the class's own method again
        else:
            rt.detach_hooks()
            if kind == "probe":
                for st in self._pp_stages():
                    stage_hooks.install(st, [_NoListener(), _NoListener()])
            if kind == "masked":
                for st in self._pp_stages():
                    stage_hooks.install(st, [masked])
            rt.hook.prepare = _no_draws  # a detached step draws nothing (a masked one drew before its clock)
            try:
                Trainer.train_step(self, data_iterator)
            finally:
                del rt.hook.prepare
            rt.detach_hooks()
        dt = time.perf_counter() - t0
        extra |= {"draws_s": draw_clock[0], "switch_s": switch_clock[0], "wait_s": wait_clock[0]}
        extra["actions_s"] = actions_clock[0]
        times = [None] * dist.get_world_size()
        dist.all_gather_object(times, (dt, clock[0], extra))
        row = {"step": self.step, "kind": kind, "s": max(t[0] for t in times)}
        if kind in ("cycle", "hooks"):
            row["direct_s"] = max(t[1] for t in times)
            row["wait_s"] = max(t[2]["wait_s"] for t in times)
            row["own_s"] = max(t[1] - t[2]["wait_s"] for t in times)
            # the split of the rank with the most own time: the actions' frames, the draws, the rest (begin/end_step)
            top = max(times, key=lambda t: t[1] - t[2]["wait_s"])
            row["own_actions_s"], row["own_draws_s"] = top[2]["actions_s"], top[2]["draws_s"]
            row["own_step_s"] = top[1] - top[2]["wait_s"] - top[2]["actions_s"] - top[2]["draws_s"]
        if kind == "masked":
            row["draw_s"] = max(t[2]["draw_s"] for t in times)
            row["switch_s"] = max(t[2]["switch_s"] for t in times)
        if kind in ("cycle", "hooks", "masked"):
            row["ratio"] = sum(t[2]["frozen_el"] for t in times) / max(1.0, sum(t[2]["total_el"] for t in times))
        self._bench = getattr(self, "_bench", []) + [row]
        if dist.get_rank() == 0:
            (Path(self.job_config.job.dump_folder) / "bench_overhead.json").write_text(json.dumps(self._bench))
        if getattr(self, "_prof", None) is not None and self.step == self.job_config.training.steps:
            out = Path(os.environ[PROFILE_ENV])
            out.mkdir(parents=True, exist_ok=True)
            self._prof.dump_stats(out / f"profile_rank{dist.get_rank()}.pstats")

    def _profiler(self) -> cProfile.Profile | None:
        """With ``PROFILE_ENV`` set, the one profiler of this rank's attached stable steps (the runtime's own code
        only: ``begin_step``, every listener call, ``end_step``), written there after the last step as
        ``profile_rank<r>.pstats``. A diagnostic: its own cost enters the direct figures of that job."""
        if not os.environ.get(PROFILE_ENV):
            return None
        if getattr(self, "_prof", None) is None:
            self._prof = cProfile.Profile()
        return self._prof


if __name__ == "__main__":
    train.main(OverheadBenchTrainer)
