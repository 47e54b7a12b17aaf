"""pyproject.toml declares every third-party package that planner/ and timelyfreeze/ import."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imported_top_level_modules() -> dict[str, str]:
    """Third-party top-level module -> one file that imports it (function-level imports included)."""
    found: dict[str, str] = {}
    for package in ("planner", "timelyfreeze"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in ("planner", "timelyfreeze"):
                        found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def _normalise(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def test_every_imported_package_is_a_declared_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_normalise(re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0]) for d in project["dependencies"]}
    dists = importlib.metadata.packages_distributions()
    missing = {
        module: where
        for module, where in _imported_top_level_modules().items()
        if not any(_normalise(d) in declared for d in dists.get(module, [module]))
    }
    assert not missing, f"imported but not in [project] dependencies: {missing}"
