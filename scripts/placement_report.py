#!/usr/bin/env python
"""The placement report of a sweep folder of ``scripts/placement_grid.toml``: TimelyFreeze against random
freezing matched to its per-stage shares, paired differences with 95 % intervals, and the planner's prediction.

    python scripts/placement_report.py docs/results/placement

Thin entry point: the logic is ``timelyfreeze.experiments.studies.placement`` (its docstring says what it writes).
"""

import sys

from timelyfreeze.experiments.studies.placement import build_placement_report

if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: placement_report.py SWEEP_FOLDER", file=sys.stderr)
        sys.exit(2)
    print(build_placement_report(sys.argv[1]))
