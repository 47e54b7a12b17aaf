#!/usr/bin/env python
"""Predict the measured stable batch of the paper authors' own runs from their monitoring windows.

    python scripts/authors_logs.py LOGS_DIR --out docs/results/authors-logs

Thin entry point: the logic is ``planner.analysis.authors_logs`` (and ``planner.trace.authors_log``).
"""

import sys

from planner.analysis.authors_logs import main

if __name__ == "__main__":
    sys.exit(main())
