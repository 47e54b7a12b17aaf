#!/usr/bin/env python
"""The pre-trained checkpoint of the fine-tuning setting: the committed one, or built here once.

Entry point of ``timelyfreeze.experiments.pretrain`` (``python scripts/pretrain.py --help``)."""

import sys

from timelyfreeze.experiments.pretrain import main

if __name__ == "__main__":
    sys.exit(main())
