"""The runtime does not import the experiments: ``timelyfreeze.experiments`` is tooling built on the runtime
(sweeps, benchmarks, their trainer ``overhead_trainer``, the pre-training), never the other way round. Read
from the source with ``ast``: no torch needed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "timelyfreeze"
EXPERIMENTS = "timelyfreeze.experiments"


def runtime_files() -> list[Path]:
    """Every module of the runtime: ``timelyfreeze/*.py`` and its subpackages but ``experiments/``."""
    return sorted(p for p in PACKAGE.rglob("*.py") if "experiments" not in p.relative_to(PACKAGE).parts[:-1])


def imported_modules(path: Path, root: Path = PACKAGE.parent) -> list[str]:
    """Every module an ``import``/``from ... import`` statement in ``path`` (a module under the folder
    ``root``) names, relative ones resolved (``from timelyfreeze import experiments`` counts as
    ``timelyfreeze.experiments``), lazy ones inside functions included."""
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            names += [base, *(f"{base}.{a.name}" for a in node.names)]
    return names


def test_the_runtime_imports_nothing_from_the_experiments():
    files = runtime_files()
    assert PACKAGE / "titan" / "trainer.py" in files and PACKAGE / "methods" / "registry.py" in files
    assert not any("experiments" in p.parts for p in files)
    offenders = [
        f"{p.relative_to(PACKAGE.parent)}: {name}"
        for p in files
        for name in imported_modules(p)
        if name == EXPERIMENTS or name.startswith(EXPERIMENTS + ".")
    ]
    assert offenders == []


def test_the_check_sees_every_way_of_importing(tmp_path):
    fake = tmp_path / "timelyfreeze" / "methods" / "x.py"
    fake.parent.mkdir(parents=True)
    fake.write_text(
        "import timelyfreeze.experiments.sweep.runner\nfrom timelyfreeze import experiments\n"
        "from ..experiments import grid\n\ndef f():\n    from timelyfreeze.experiments.sweep.cli import main\n"
    )
    names = imported_modules(fake, tmp_path)
    assert "timelyfreeze.experiments.sweep.runner" in names and "timelyfreeze.experiments" in names
    assert "timelyfreeze.experiments.grid" in names and "timelyfreeze.experiments.sweep.cli.main" in names


def package_edges(package: Path = PACKAGE) -> dict[str, set[str]]:
    """{package: the other packages of ``package`` (``timelyfreeze`` or ``planner``) it imports}, a package being
    a folder (or a module) right under it; lazy imports inside functions count."""
    edges: dict[str, set[str]] = {}
    for p in sorted(package.rglob("*.py")):
        src = p.relative_to(package).parts[0].removesuffix(".py")
        for name in imported_modules(p):
            parts = name.split(".")
            if parts[0] == package.name and len(parts) > 1 and parts[1] not in (src, "__init__"):
                if (package / parts[1]).is_dir() or (package / f"{parts[1]}.py").is_file():
                    edges.setdefault(src, set()).add(parts[1])
    return edges


@pytest.mark.parametrize("package", ["timelyfreeze", "planner"])
def test_the_packages_import_each_other_without_a_loop(package):
    edges = package_edges(PACKAGE.parent / package)
    sample = {
        "timelyfreeze": ("runtime", {"plan", "outputs", "hooks", "methods", "job"}),
        "planner": ("trace", {"schedule"}),
    }
    assert edges[sample[package][0]] >= sample[package][1]  # the check sees the real graph

    def reaches(a: str, b: str) -> bool:
        seen, todo = set(), [a]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt == b:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    loops = sorted({tuple(sorted((a, b))) for a in edges for b in edges[a] if reaches(b, a)})
    assert loops == []


def test_the_ground_floor_imports_nothing_of_the_project_above_it():
    assert "job" not in package_edges()  # timelyfreeze/job/ imports only torch, planner and the standard library
