#!/usr/bin/env python
"""The placement report of a sweep folder of ``scripts/placement_grid.toml`` (TimelyFreeze against random freezing
matched to its per-stage shares, paired differences with 95 % intervals, and the planner's prediction), or of
``scripts/placement_bracketed_grid.toml`` (the same with each random job bracketed by two TimelyFreeze runs):

    python scripts/placement_report.py docs/results/placement
    python scripts/placement_report.py docs/results/placement-bracketed
    python scripts/placement_report.py --design docs/results/placement/report/placement_pairs.csv --blocks 15

Thin entry point: the logic is ``timelyfreeze.experiments.studies.placement`` and ``.placement_bracketed`` (their
docstrings say what they write).
"""

import sys

from timelyfreeze.experiments.studies.placement_bracketed import main

if __name__ == "__main__":
    sys.exit(main())
