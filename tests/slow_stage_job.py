"""A TimelyFreeze training job whose pipeline rank ``SLOW_RANK`` turns slow from step ``SLOW_FROM`` on: every
forward of its stages sleeps ``SLOW_MS`` ms more (a co-tenant, a throttled device). Used by the online
re-planning test (``tests/test_replan_torchrun.py``); launched by torchrun like ``timelyfreeze.train``."""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timelyfreeze.titan import cpu_shims

cpu_shims.apply_if_needed()

import torch  # noqa: E402

from timelyfreeze import train  # noqa: E402
from timelyfreeze.titan.trainer import TimelyFreezeTrainer  # noqa: E402

SLOW_FROM = int(os.environ["SLOW_FROM"])
SLOW_MS = float(os.environ["SLOW_MS"])
SLOW_RANK = int(os.environ.get("SLOW_RANK", "1"))


class SlowStageTrainer(TimelyFreezeTrainer):
    def __init__(self, job_config):
        super().__init__(job_config)
        if self.parallel_dims.get_mesh("pp").get_local_rank() == SLOW_RANK:
            for part in self.model_parts:
                part.register_forward_hook(self._slow)

    def _slow(self, *_):
        if torch.is_grad_enabled() and self.step >= SLOW_FROM:
            time.sleep(SLOW_MS / 1e3)


if __name__ == "__main__":
    train.main(SlowStageTrainer)
