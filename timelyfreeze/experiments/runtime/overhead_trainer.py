"""Trainer of the overhead benchmark (``timelyfreeze.experiments.runtime.bench``): in the stable phase it
interleaves steps with the freezing runtime's hooks detached (TorchTitan's own ``train_step``) with full
TimelyFreeze steps at ratio 0.

Run with ``[freeze] r_max = 0``: the plan freezes nothing, so an attached step does all of the runtime's
work at ratio 0 (stage hooks, per-action profiler, freezing hook, trace flush, the per-step gather,
metrics, the drift check of online re-planning, a re-plan if one comes due) and computes exactly what a
detached step computes. Steps up to the end of the ramp run normally (monitoring, the plan).

Two figures per step go to ``<dump_folder>/bench_overhead.json`` (global rank 0):

* ``s``: the step's wall time (the slowest rank's); the bench compares attached with detached steps;
* ``direct_s`` (attached steps): the time spent inside the runtime's own code on the rank that spent
  most, i.e. ``begin_step`` and ``end_step`` plus every call of the stage-hook listeners (each listener
  is timed by a wrapper installed through ``stage_hooks.install``, the hooks' own extension point). It
  misses indirect costs (cache effects, waits a slower rank causes), and has none of the step-to-step
  noise of the wall times.

The stable steps cycle attached, detached, detached (``CYCLES``). With ``TIMELYFREEZE_OVERHEAD_PROBE=1`` in
the environment (``bench_runtime.py --overhead-probe``) they cycle attached, detached, *probe*, detached,
detached: a probe step runs the stages' hooked class with
listeners that do nothing and none of the runtime's per-step work, so its difference from its detached
neighbours is what the hook mechanism itself costs.
"""

import json
import os
import time
from pathlib import Path

from timelyfreeze.titan import cpu_shims

cpu_shims.apply_if_needed()

import torch.distributed as dist  # noqa: E402
from torchtitan.train import Trainer  # noqa: E402

from timelyfreeze import train  # noqa: E402
from timelyfreeze.experiments.runtime.analysis import CYCLES, PROBE_ENV  # noqa: E402
from timelyfreeze.hooks import stage_hooks  # noqa: E402
from timelyfreeze.titan.trainer import TimelyFreezeTrainer  # noqa: E402


class _NoListener:
    def before_action(self, stage: int, kind: str, microbatch: int) -> None:
        pass

    def after_action(self, stage: int, kind: str, microbatch: int) -> None:
        pass


class _TimedListener:
    """A stage-hook listener that adds the time its inner listener takes to ``clock[0]``."""

    def __init__(self, inner, clock: list[float]):
        self.inner, self.clock = inner, clock

    def before_action(self, stage: int, kind: str, microbatch: int) -> None:
        t = time.perf_counter()
        self.inner.before_action(stage, kind, microbatch)
        self.clock[0] += time.perf_counter() - t

    def after_action(self, stage: int, kind: str, microbatch: int) -> None:
        t = time.perf_counter()
        self.inner.after_action(stage, kind, microbatch)
        self.clock[0] += time.perf_counter() - t


class OverheadBenchTrainer(TimelyFreezeTrainer):
    def train_step(self, data_iterator):
        rt = self.freeze_rt
        clock = [0.0]
        cycle = CYCLES[os.environ.get(PROBE_ENV) == "1"]
        kind = "cycle" if self.step <= rt.phases.ramp_end else cycle[(self.step - rt.phases.ramp_end - 1) % len(cycle)]
        t0 = time.perf_counter()
        if kind in ("cycle", "hooks"):
            rt.attach_hooks()
            for st in self._pp_stages():  # same listeners, same order, each one timed
                stage_hooks.install(st, [_TimedListener(rt.hook, clock), _TimedListener(rt.profiler, clock)])
            t = time.perf_counter()
            rt.begin_step(self.step)
            self._batch_in_step = 0
            clock[0] += time.perf_counter() - t
            Trainer.train_step(self, data_iterator)
            t = time.perf_counter()
            rt.end_step(self.step)
            clock[0] += time.perf_counter() - t
        else:
            rt.detach_hooks()
            if kind == "probe":
                for st in self._pp_stages():
                    stage_hooks.install(st, [_NoListener(), _NoListener()])
            Trainer.train_step(self, data_iterator)
            rt.detach_hooks()
        dt = time.perf_counter() - t0
        times = [None] * dist.get_world_size()
        dist.all_gather_object(times, (dt, clock[0]))
        row = {"step": self.step, "kind": kind, "s": max(t[0] for t in times)}
        if kind in ("cycle", "hooks"):
            row["direct_s"] = max(t[1] for t in times)
        self._bench = getattr(self, "_bench", []) + [row]
        if dist.get_rank() == 0:
            (Path(self.job_config.job.dump_folder) / "bench_overhead.json").write_text(json.dumps(self._bench))


if __name__ == "__main__":
    train.main(OverheadBenchTrainer)
