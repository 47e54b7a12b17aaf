#!/usr/bin/env python
"""Tables and plots of a sweep folder (``scripts/sweep.py``); the same as ``sweep.py report``.

    python scripts/sweep_report.py sweeps/s1 [--tta-step N] [--throughput stable|all] [--no-planner]

Thin entry point: the logic is ``timelyfreeze.experiments`` (``report`` says what it reads and writes).
"""

import sys

from timelyfreeze.experiments.sweep.cli import report_main

if __name__ == "__main__":
    sys.exit(report_main())
