"""``python -m timelyfreeze.experiments run|report ...`` (the same as ``scripts/sweep.py``)."""

import sys

from timelyfreeze.experiments.sweep.cli import main

sys.exit(main())
