#!/usr/bin/env python
"""Runtime benchmark (plan vs reality, overhead, load change, CPU pinning): the logic and every option are in
``timelyfreeze/experiments/runtime_bench.py``; ``python scripts/bench_runtime.py --help``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timelyfreeze.experiments.runtime_bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
