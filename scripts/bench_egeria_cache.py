#!/usr/bin/env python
"""Egeria's activation cache benchmark (no freezing / Egeria / Egeria with the cache, several seeds, interleaved):
the logic and every option are in ``timelyfreeze/experiments/studies/egeria_cache_bench.py``;
``python scripts/bench_egeria_cache.py --help``."""

import sys

from timelyfreeze.experiments.studies.egeria_cache_bench import main

if __name__ == "__main__":
    sys.exit(main())
