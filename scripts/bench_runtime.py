#!/usr/bin/env python
"""Runtime benchmark (plan vs reality, overhead, load change, CPU pinning): the logic and every option are in
``timelyfreeze/experiments/runtime/bench.py``; ``python scripts/bench_runtime.py --help``."""

import sys

from timelyfreeze.experiments.runtime.bench import main

if __name__ == "__main__":
    sys.exit(main())
