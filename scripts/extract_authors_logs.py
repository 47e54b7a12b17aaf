#!/usr/bin/env python
"""Keep the lines the importer reads of the paper authors' logs (issue 49).

    python scripts/extract_authors_logs.py GIT_DIR --out docs/results/authors-logs/logs

Thin entry point: the logic and the choice of runs are ``planner.analysis.authors_logs_source``.
"""

import sys

from planner.analysis.authors_logs_source import main

if __name__ == "__main__":
    sys.exit(main())
