"""The table of the development check in docs/results/smollm2-table1/dev-zbv-weight-grad/README.md: per job of
``scripts/smollm2_zbv_w_check.sh``, rank 0's and rank 1's forward (F) and weight-gradient (W) time per step and the
step time, each the median over steps 2-10 (``yardstick.kind_times``; ``metrics.jsonl``)."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

from planner.trace.archive import TRACE_NAME, find_trace
from timelyfreeze.experiments.sweep.report import md_table
from timelyfreeze.experiments.sweep.results import num, read_metrics
from timelyfreeze.experiments.sweep.yardstick import kind_times

STEPS = tuple(range(2, 11))
"""Every step but the first (its start-up) of the check's 10-step jobs."""
COLUMNS = ["job", "rank 0 F (s)", "rank 0 W (s)", "rank 1 F (s)", "rank 1 W (s)", "step (s)"]


def rows(folder: str | Path) -> list[dict[str, Any]]:
    """One row per finished job folder (``<n>_<name>`` with a ``summary.json``), in the check's order."""
    out = []
    for d in sorted(p for p in Path(folder).iterdir() if (p / "timelyfreeze" / "summary.json").is_file()):
        tf = d / "timelyfreeze"
        trace = find_trace(tf / TRACE_NAME)
        kt = kind_times(trace, STEPS) if trace is not None else {}
        steps = [
            m["step_ms"] for m in read_metrics(tf / "metrics.jsonl") if m["step"] in STEPS and num(m.get("step_ms"))
        ]
        row = {"job": d.name, "step (s)": f"{statistics.median(steps) / 1e3:.2f}" if steps else ""}
        for rank in (0, 1):
            for kind in ("F", "W"):
                ms = kt.get((rank, kind))
                row[f"rank {rank} {kind} (s)"] = "" if ms is None else f"{ms / 1e3:.2f}"
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_dir():
        print(f"error: expected the check's folder, got {' '.join(args) or 'nothing'}", file=sys.stderr)
        return 2
    path = Path(args[0]) / "results.md"
    path.write_text(
        "Rank 0's and rank 1's forward (F) and weight-gradient (W) time per step (the sum over the step's actions of "
        "that kind) and the step time, each the median over steps 2-10; one run per job "
        "(`python -m timelyfreeze.experiments.studies.zbv_w_check <folder>`).\n\n"
        + md_table(rows(args[0]), COLUMNS)
        + "\n"
    )
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
