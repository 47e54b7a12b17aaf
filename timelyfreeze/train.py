"""Entry point: ``torchrun ... -m timelyfreeze.train --job.config_file torchtitan_configs/X.toml``.

CPU-only hosts get the shims of ``timelyfreeze.cpu_shims`` before TorchTitan is imported. A bad
``[freeze]`` setting ends the run with one line naming the field (exit code 2), not a traceback.
"""

import os
import sys

from timelyfreeze import cpu_shims


def main() -> None:
    cpu_shims.apply_if_needed()
    from torchtitan.train import main as titan_main

    from timelyfreeze.config import FreezeConfigError
    from timelyfreeze.state_codec import FreezeStateError
    from timelyfreeze.trainer import TimelyFreezeTrainer

    try:
        titan_main(TimelyFreezeTrainer)
    except (FreezeConfigError, FreezeStateError) as e:
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    # Training finished, every output is written and flushed, the process group is destroyed. About one
    # run in twenty then aborted in interpreter teardown ("terminate called without an active exception",
    # no Python frame: a native thread destroyed while joinable), failing a completed run. Skip teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
