"""``python -m planner``: see :mod:`planner.cli`."""

import sys

from planner.cli import main

sys.exit(main())
