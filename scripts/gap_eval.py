#!/usr/bin/env python
"""The gap study: where a measured batch's time goes and how well the gap model predicts it, offline over
finished jobs' dumps; writes ``docs/results/runtime/gap_model.md`` and ``.csv``.

    python scripts/gap_eval.py [--jobs docs/results/comparison/jobs] [--pattern '*timelyfreeze*'] [--out FILE.md]

Thin entry point: the logic is ``timelyfreeze.experiments.studies.gap_report`` (and ``planner.timing.gaps``,
``planner.analysis.gap_analysis``).
"""

import sys

from timelyfreeze.experiments.studies.gap_report import main

if __name__ == "__main__":
    sys.exit(main())
