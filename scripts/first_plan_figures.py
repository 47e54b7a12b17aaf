#!/usr/bin/env python
"""Issue 39's figures: the stable phase against the first plan, with the re-anchored and F-corrected figures
beside it. ``python scripts/first_plan_figures.py pack DUMPS JOBS`` packs finished bench jobs (trace included);
``python scripts/first_plan_figures.py table JOBS`` prints the tables. Logic:
``timelyfreeze.experiments.runtime.first_plan``."""

import sys

from timelyfreeze.experiments.runtime.first_plan import main

if __name__ == "__main__":
    sys.exit(main())
