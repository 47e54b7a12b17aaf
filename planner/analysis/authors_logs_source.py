"""The paper authors' logs this repository keeps, and how they were taken from their fork (issue 49).

    python scripts/extract_authors_logs.py GIT_DIR --out docs/results/authors-logs/logs

``GIT_DIR``: a git directory (bare or not) of ``orangingq/torchtitan`` holding :data:`COMMIT`.  For every run
log it selects (below), the lines the importer reads (:func:`planner.trace.authors_log.needed_lines`) are
written gzip-compressed to ``<out>/<path under logs/>.gz``; ``sources.csv`` names each kept file's path in the
fork, its git blob and its line counts, ``excluded.csv`` every other TimelyFreeze-family log with the reason,
and the fork's ``LICENSE`` is copied beside them.

Which runs (a mechanical choice, from the file names and the importer alone, not changed after scoring):

* **development**: the 12 TimelyFreeze-family runs (``fullrand7`` = TimelyFreeze, ``timelyapf``,
  ``timelyauto``) and the 4 no-freezing runs of ``logs/h200/260102_llama8b/`` (LLaMA-3.1-8B, 4x H200): the
  prediction model's rules, the lower-bound cliff included, were designed while reading these.
* **test** (held out): every other TimelyFreeze-family run log under ``logs/`` (not under an ``old`` or ``eval``
  folder) that the importer turns into a trace with a measured block in the stable window.  At
  :data:`COMMIT` these are the LLaMA-3.2-1B runs on ``dmserver1`` (another model on other GPUs).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import os
import posixpath
import subprocess
import sys

from planner.errors import PlannerError
from planner.fileio import replace_atomically
from planner.trace.authors_log import log_to_trace, needed_lines, parse_text

REPO = "orangingq/torchtitan"
"""The paper authors' public fork of TorchTitan on GitHub."""
COMMIT = "6c4fee9ee024b6428575f3af3b79989b8f6b285b"
"""The fork's commit the kept lines were read from (2026-01-12)."""
DEV_FOLDER = "logs/h200/260102_llama8b"
METHODS = ("fullrand7", "timelyapf", "timelyauto")
"""TimelyFreeze (``fullrand7``) and its two hybrids: the runs that print an LP plan."""
STABLE = (400, 1900)
"""Steps whose measured blocks make a run's measured stable batch."""


def run_method(name: str) -> str | None:
    """The method a log's file name names (``260102_GPipe_fullrand7.log`` -> ``fullrand7``), or None."""
    parts = posixpath.basename(name).removesuffix(".gz").removesuffix(".log").split("_")
    m = parts[2] if len(parts) > 2 else None
    return m if m in (*METHODS, "nofreeze") else None


def _git(git_dir: str, *args: str) -> bytes:
    try:
        return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        err = getattr(e, "stderr", b"") or b""
        raise PlannerError(f"{git_dir}: git {' '.join(args[:2])} failed: {err.decode(errors='replace').strip() or e}")


def select(
    git_dir: str, commit: str = COMMIT
) -> tuple[list[tuple[str, str, str, list[str], int]], list[tuple[str, str]]]:
    """``(kept, excluded)`` of the fork's ``commit``: kept ``(set, path, blob, lines, total_lines)`` and excluded
    ``(path, reason)`` (module docstring)."""
    listing = _git(git_dir, "ls-tree", "-r", commit, "logs").decode().splitlines()
    kept, excluded = [], []
    for row in listing:
        meta, path = row.split("\t", 1)
        blob = meta.split()[2]
        parts = path.split("/")
        method = run_method(path)
        if not path.endswith(".log") or method is None or any(p in ("eval", "old") for p in parts):
            continue
        dev = posixpath.dirname(path) == DEV_FOLDER
        if method == "nofreeze" and not dev:
            continue
        text = _git(git_dir, "cat-file", "blob", blob).decode("utf-8", errors="replace")
        lines = needed_lines(text)
        total = len(text.splitlines())
        if dev:
            kept.append(("dev", path, blob, lines, total))
            continue
        try:
            log = parse_text("\n".join(lines), path)
            log_to_trace(log)
        except PlannerError as e:
            excluded.append((path, str(e).removeprefix(f"{path}").lstrip(":0123456789 ")))
            continue
        if not any(STABLE[0] <= b.step <= STABLE[1] for b in log.measured()):
            excluded.append((path, f"no measured block in steps {STABLE[0]}-{STABLE[1]}"))
            continue
        kept.append(("test", path, blob, lines, total))
    return kept, excluded


def write_gz(path: str, lines: list[str]) -> None:
    """``lines`` gzip-compressed with no time stamp or name in the header (the same bytes every time)."""

    def write(tmp: str) -> None:
        with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as g:
            g.write(("\n".join(lines) + "\n").encode("utf-8"))

    os.makedirs(os.path.dirname(path), exist_ok=True)
    replace_atomically(path, write)


def write_csv(path: str, header: list[str], rows: list[list]) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(header)
            w.writerows(rows)

    replace_atomically(path, write)


def kept_path(out: str, fork_path: str) -> str:
    """Where a fork's log is kept under ``out``: its path under ``logs/``, plus ``.gz``."""
    return os.path.join(out, *fork_path.removeprefix("logs/").split("/")) + ".gz"


def read_sources(out: str) -> list[dict]:
    """The rows of ``<out>/sources.csv`` (``set``, ``path``, ``blob``, ``lines``, ``kept_lines``)."""
    path = os.path.join(out, "sources.csv")
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    except OSError as e:
        raise PlannerError(f"{path}: cannot read: {e.strerror or e}") from None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("git_dir", metavar="GIT_DIR")
    p.add_argument("--out", required=True)
    p.add_argument("--commit", default=COMMIT, help=f"the fork's commit to read (default {COMMIT[:7]}, the kept one)")
    args = p.parse_args(argv)
    try:
        kept, excluded = select(args.git_dir, args.commit)
        for _, path, _, lines, _ in kept:
            write_gz(kept_path(args.out, path), lines)
        write_csv(
            os.path.join(args.out, "sources.csv"),
            ["set", "path", "blob", "lines", "kept_lines"],
            [[s, path, blob, total, len(lines)] for s, path, blob, lines, total in kept],
        )
        write_csv(os.path.join(args.out, "excluded.csv"), ["path", "reason"], [list(x) for x in excluded])
        lic = _git(args.git_dir, "cat-file", "blob", f"{args.commit}:LICENSE")

        def write_licence(tmp: str) -> None:
            with open(tmp, "wb") as f:
                f.write(lic)

        replace_atomically(os.path.join(args.out, "LICENSE"), write_licence)
    except PlannerError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"{sum(k[0] == 'dev' for k in kept)} development and {sum(k[0] == 'test' for k in kept)} test logs kept")
    return 0
