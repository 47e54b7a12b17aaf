"""``metrics.jsonl``: one JSON line per step (and per validation), written by pipeline rank 0.

A resumed run re-does the steps after its checkpoint, so the first write of a process keeps only the
lines of earlier steps (a fresh run, step 1, starts the file anew). Rows also go to TensorBoard as
``timelyfreeze/<field>`` when a TensorBoard logger is given. See ``docs/run-outputs.md``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable


class MetricsLog:
    def __init__(self, path: Path, *, write: bool, tb_log: Callable[[dict, int], None] | None = None):
        self.path = Path(path)
        self.write = write
        """Only one rank writes the file (pipeline rank 0); every rank may call ``append``."""
        self.tb_log = tb_log
        self._ready = False
        self._f = None
        """The file, open from the first row on (appended and flushed per row: nothing is lost in a crash)."""

    def append(self, row: dict) -> None:
        """Append ``row`` (it has a ``step``) to the file and its numbers to TensorBoard."""
        if self.tb_log is not None and "phase" in row:
            self.tb_log(
                {
                    f"timelyfreeze/{k}": v
                    for k, v in row.items()
                    if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"
                },
                row["step"],
            )
        if not self.write:
            return
        if not self._ready:
            self._ready = True
            self._start_at(row["step"])
        if self._f is None or self._f.closed:
            self._f = open(self.path, "a", encoding="utf-8")
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()

    def close(self) -> None:
        """Close the file (a later ``append`` opens it again)."""
        if self._f is not None:
            self._f.close()

    def _start_at(self, first: int) -> None:
        if not self.path.exists():
            return
        if first <= 1:
            self.path.unlink()
            return
        keep = [line for line in self.path.read_text().splitlines(True) if _step_of(line) < first]
        self.path.write_text("".join(keep))


def _step_of(line: str) -> int:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return 1 << 60
