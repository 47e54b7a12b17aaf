"""Entry point: ``torchrun ... -m timelyfreeze.train --job.config_file torchtitan_configs/X.toml``.

CPU-only hosts get the shims of ``timelyfreeze.titan.cpu_shims`` before TorchTitan is imported. A bad
``[freeze]`` setting or saved freezing state ends the run with one line naming the field (exit code 2),
not a traceback. A finished run exits through normal interpreter teardown (atexit handlers, log flushes).
"""

import faulthandler
import gc
import os
import sys
import time
from typing import NoReturn

from timelyfreeze.titan import cpu_shims


def main(trainer_cls: type | None = None) -> None:
    """Train with ``trainer_cls`` (a ``TimelyFreezeTrainer`` subclass; the default is that class)."""
    # A native abort (SIGABRT/SIGSEGV) prints every Python thread's stack before the process dies, so a
    # crash in teardown names the thread that was running.
    faulthandler.enable(all_threads=True)
    cpu_shims.apply_if_needed()
    from torchtitan.train import main as titan_main  # deferred: TorchTitan only after the CPU shims

    from timelyfreeze.titan.help import print_help, wants_help

    if wants_help(sys.argv[1:]):
        print_help(sys.argv[1:])  # the old [freeze] names hidden; exits

    from timelyfreeze.job.errors import FreezeConfigError, FreezeStateError
    from timelyfreeze.titan.trainer import TimelyFreezeTrainer

    try:
        titan_main(trainer_cls or TimelyFreezeTrainer)
    except (FreezeConfigError, FreezeStateError) as e:
        _report_and_exit(e, int(os.environ.get("RANK", "0")))
    # The trainer's reference cycles (closures, stage <-> schedule) still hold the pipeline's process group;
    # left to the interpreter's shutdown, gloo's threads are destroyed mid-finalization, which aborted about
    # one finished run in twenty. Collect them now, while everything is alive: destroy_process_group() has
    # run, so the groups go and their threads are joined here (see timelyfreeze.titan.torch_fixes).
    gc.collect()


# How long a rank other than 0 waits, after a bad setting, for rank 0 to report it and torchrun to stop the job.
OTHER_RANK_GRACE_S = 30.0


def _wait(seconds: float) -> None:
    time.sleep(seconds)


def _report_and_exit(error: Exception, rank: int) -> NoReturn:
    """End the run on a bad setting with one ``error:`` line and exit code 2.

    Every rank checks the same settings, so normally every rank fails and the job should print the line once.
    Rank 0 prints it at once. Any other rank waits ``OTHER_RANK_GRACE_S`` first, its process groups still up: had
    it exited at once, torchrun's agent could stop rank 0 before rank 0 printed (the line was lost in CI). By
    then rank 0 has normally failed too and torchrun has stopped this rank. If not, this rank prints the line
    itself, naming its rank: the failure may be its own (e.g. its stage's memory), or rank 0 runs under another
    agent (another node, another launcher), where each rank other than 0 that failed prints its own line.
    Only then does it release its process groups, so that rank 0, possibly waiting in a collective, is not
    torn down with a traceback before this rank's line is out."""
    if rank == 0:
        print(f"error: {error}", file=sys.stderr, flush=True)
    else:
        _wait(OTHER_RANK_GRACE_S)
        print(f"error: {error} (rank {rank})", file=sys.stderr, flush=True)
    _release_process_groups()
    sys.exit(2)


def _release_process_groups() -> None:
    """After an error that ended the run early: destroy the process groups and join their threads now
    (TorchTitan destroys them only on success), for the same reason as the ``gc.collect()`` above. The
    trainer has released its meshes' references to them (``close``, or its constructor on failure)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()


if __name__ == "__main__":
    main()
