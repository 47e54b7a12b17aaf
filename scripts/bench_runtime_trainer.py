"""Trainer for the overhead benchmark: alternates steps with the freezing hooks detached (TorchTitan's
compute through this trainer subclass) with TimelyFreeze steps.

Odd steps run the full freezing runtime at ratio 0 (``[freeze] method = "none"``: stage hooks,
per-action profiler, freezing hook, trace flush, per-step gather and metrics); even steps detach
the hooks and run TorchTitan's own ``train_step``. Step wall times of both kinds go to
``<dump_folder>/bench_overhead.json`` (pipeline rank 0). Pairing neighbouring steps cancels drift.
Launched by scripts/bench_runtime.py.
"""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timelyfreeze import cpu_shims  # noqa: E402

cpu_shims.apply_if_needed()

import torch.distributed as dist  # noqa: E402
from torchtitan.train import Trainer, main  # noqa: E402

from timelyfreeze.trainer import TimelyFreezeTrainer  # noqa: E402


class OverheadBenchTrainer(TimelyFreezeTrainer):
    def train_step(self, data_iterator):
        rt = self.freeze_rt
        t0 = time.perf_counter()
        if self.step % 2 == 1:
            rt.attach_hooks()
            super().train_step(data_iterator)
            kind = "hooks"
        else:
            rt.detach_hooks()
            Trainer.train_step(self, data_iterator)
            kind = "plain"
        dt = time.perf_counter() - t0
        times = [None] * dist.get_world_size()
        dist.all_gather_object(times, dt)
        self._bench = getattr(self, "_bench", []) + [{"step": self.step, "kind": kind, "s": max(times)}]
        if dist.get_rank() == 0:
            out = Path(self.job_config.job.dump_folder) / "bench_overhead.json"
            out.write_text(json.dumps(self._bench))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main(OverheadBenchTrainer)
    import gc

    gc.collect()  # destroy the process groups now, not during interpreter shutdown (see timelyfreeze/train.py)
