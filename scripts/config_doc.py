#!/usr/bin/env python
"""Write docs/config.md from the ``[freeze]`` dataclasses' field docstrings (``timelyfreeze.config.doc``).

python scripts/config_doc.py            # rewrite docs/config.md
python scripts/config_doc.py --check    # exit 1 if docs/config.md is not what the docstrings give
"""

from __future__ import annotations

import argparse

from timelyfreeze.config import doc as config_doc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    if args.check:
        same = config_doc.DOC_PATH.is_file() and config_doc.DOC_PATH.read_text(encoding="utf-8") == config_doc.render()
        print(f"{config_doc.DOC_PATH}: {'up to date' if same else 'out of date: run python scripts/config_doc.py'}")
        return 0 if same else 1
    print(f"wrote {config_doc.write()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
