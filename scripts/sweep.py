#!/usr/bin/env python
"""Run a grid of TimelyFreeze / baseline training jobs, one ``torchrun`` at a time, then report.

    python scripts/sweep.py run --config base.toml --grid grid.toml --out sweeps/s1 [--dry-run]
    python scripts/sweep.py report sweeps/s1

Thin entry point, the sweep's one door: the logic is ``timelyfreeze.experiments.sweep`` (``cli`` for the
options, ``grid`` for the grid file).
"""

import sys

from timelyfreeze.experiments.sweep.cli import main

if __name__ == "__main__":
    sys.exit(main())
