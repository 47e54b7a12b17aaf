#!/usr/bin/env python
"""One command for a lent GPU (at most about 8 minutes): ``python scripts/gpu_check.py``; results under
``docs/results/gpu/<date>/``. Thin entry point: the logic is ``timelyfreeze.experiments.studies.gpu_check``.
Without CUDA: one ``error:`` line, exit code 2.
"""

import sys

from timelyfreeze.experiments.studies.gpu_check import main

if __name__ == "__main__":
    sys.exit(main())
