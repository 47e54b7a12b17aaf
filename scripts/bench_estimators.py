#!/usr/bin/env python
"""Which node-weight estimator predicts the stable phase better, out of sample, on recorded runs (no new runs).

    python scripts/bench_estimators.py [SWEEP_FOLDER ...] [--out docs/results/runtime]

Default folders: docs/results/comparison and docs/results/rmax. Writes estimators.md and estimators.csv.
Thin entry point: the logic is ``timelyfreeze.experiments.studies.estimator_eval``.
"""

import sys

from timelyfreeze.experiments.studies.estimator_eval import main

if __name__ == "__main__":
    sys.exit(main())
