"""Trainer of the overhead benchmark (``timelyfreeze.experiments.runtime_bench``): in the stable phase it
alternates steps with the freezing runtime's hooks detached (TorchTitan's own ``train_step``) with full
TimelyFreeze steps at ratio 0.

Run with ``[freeze] r_max = 0``: the plan freezes nothing, so an attached step does all of the runtime's
work at ratio 0 (stage hooks, per-action profiler, freezing hook, trace flush, the per-step gather,
metrics, the drift check of online re-planning, a re-plan if one comes due) and computes exactly what a
detached step computes. Steps up to the end of the ramp run normally (monitoring, the plan). Every step's
wall time (the slowest rank's) goes to ``<dump_folder>/bench_overhead.json`` (global rank 0). Pairing
neighbouring steps cancels slow drift of the machine.

    torchrun ... -m timelyfreeze.experiments.overhead_trainer --job.config_file X.toml --freeze.r_max 0 ...
"""

import json
import time
from pathlib import Path

from timelyfreeze import cpu_shims

cpu_shims.apply_if_needed()

import torch.distributed as dist  # noqa: E402
from torchtitan.train import Trainer  # noqa: E402

from timelyfreeze import train  # noqa: E402
from timelyfreeze.trainer import TimelyFreezeTrainer  # noqa: E402


class OverheadBenchTrainer(TimelyFreezeTrainer):
    def train_step(self, data_iterator):
        rt = self.freeze_rt
        t0 = time.perf_counter()
        if self.step <= rt.phases.ramp_end or self.step % 2 == 1:
            rt.attach_hooks()
            super().train_step(data_iterator)
            kind = "hooks" if self.step > rt.phases.ramp_end else "cycle"
        else:
            rt.detach_hooks()
            Trainer.train_step(self, data_iterator)
            kind = "plain"
        dt = time.perf_counter() - t0
        times = [None] * dist.get_world_size()
        dist.all_gather_object(times, dt)
        self._bench = getattr(self, "_bench", []) + [{"step": self.step, "kind": kind, "s": max(times)}]
        if dist.get_rank() == 0:
            (Path(self.job_config.job.dump_folder) / "bench_overhead.json").write_text(json.dumps(self._bench))


if __name__ == "__main__":
    train.main(OverheadBenchTrainer)
