#!/usr/bin/env python
"""Issue 27's figures (stable span vs the plan in force, upper span vs the no-freeze prediction, shares,
re-plans) of finished runs: ``python scripts/span_figures.py FOLDER...``. Logic:
``timelyfreeze.experiments.runtime.span_figures``."""

import sys

from timelyfreeze.experiments.runtime.span_figures import main

if __name__ == "__main__":
    sys.exit(main())
