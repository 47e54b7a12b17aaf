#!/usr/bin/env python
"""Compile benchmark (eager vs compiled, tensor vs block units): the logic and options are in
``timelyfreeze/experiments/studies/compile_bench.py``; ``python scripts/bench_compile.py --help``."""

import sys

from timelyfreeze.experiments.studies.compile_bench import main

if __name__ == "__main__":
    sys.exit(main())
