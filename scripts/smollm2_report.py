#!/usr/bin/env python
"""The report of a SmolLM2 study's sweep folder (docs/results/smollm2-table1/README.md): Table 1's cells, or the
r_max sweep's Figure 6, with the paired accuracy tests:

    python scripts/smollm2_report.py docs/results/smollm2-table1/study1

Thin entry point: the logic is ``timelyfreeze.experiments.studies.smollm2_table1`` (its docstring says what it
writes).
"""

import sys

from timelyfreeze.experiments.studies.smollm2_table1 import main

if __name__ == "__main__":
    sys.exit(main())
