"""``python -m planner``: see :mod:`planner.cli`."""

import sys

from .cli import main

sys.exit(main())
