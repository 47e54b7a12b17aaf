"""An Egeria training job whose decisions follow a script instead of the plasticity readings, so that two runs
(activation cache on and off) freeze the same prefix at the same steps: ``EGERIA_SCRIPT="3:1,6:3,10:0,12:5"``
sets the frozen boundary after those steps' optimizer updates (``0``: everything unfrozen, as after an LR drop,
a new generation). Used by ``tests/test_egeria_cache_torchrun.py``; launched by torchrun like
``timelyfreeze.train``."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timelyfreeze.titan import cpu_shims

cpu_shims.apply_if_needed()

from timelyfreeze import train  # noqa: E402
from timelyfreeze.methods.egeria.method import Egeria  # noqa: E402

SCRIPT = {int(s): int(b) for s, b in (p.split(":") for p in os.environ["EGERIA_SCRIPT"].split(","))}


def scripted_after_optimizer_step(self, step: int) -> None:
    self.ctrl.bootstrapped = True
    if step in SCRIPT:
        if SCRIPT[step] == 0:
            self.ctrl.generation += 1
        self.ctrl.cur = SCRIPT[step]
        self.ctrl.events.append((step, "scripted", SCRIPT[step]))


Egeria.after_optimizer_step = scripted_after_optimizer_step
Egeria.begin_step = lambda self, step: (self._ensure_layout(), self._cache_boundary(step))

if __name__ == "__main__":
    train.main()  # the default trainer: only the method is scripted
