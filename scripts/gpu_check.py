#!/usr/bin/env python
"""One command for a lent GPU: ``python scripts/gpu_check.py [--out DIR]``; results under
``docs/results/gpu/<date>/`` (or ``DIR``). About 8 minutes on one GPU; with two or more it also runs the NCCL
parts. ``--device cpu --hidden 64 --seq 32`` runs part (c) alone on CPU. Thin entry point: the logic is
``timelyfreeze.experiments.studies.gpu_check``. Without CUDA (and not ``--device cpu``): one ``error:`` line,
exit code 2.
"""

import sys

from timelyfreeze.experiments.studies.gpu_check import main

if __name__ == "__main__":
    sys.exit(main())
