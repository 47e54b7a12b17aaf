#!/usr/bin/env python
"""Run a grid of TimelyFreeze / baseline training jobs, one ``torchrun`` at a time, then report.

    python scripts/sweep.py run --config base.toml --grid grid.toml --out sweeps/s1 [--dry-run]
    python scripts/sweep.py report sweeps/s1

Thin entry point: the logic is ``timelyfreeze.experiments`` (``cli`` for the options, ``grid`` for the
grid file); ``python -m timelyfreeze.experiments`` does the same.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runs without `pip install -e .` too

from timelyfreeze.experiments.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
