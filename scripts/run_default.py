#!/usr/bin/env python
"""`make run`: train the embedded default through a full TimelyFreeze cycle and summarise it.

Runs ``torchrun --nproc_per_node=2 -m timelyfreeze.train --job.config_file <config>`` (default:
torchtitan_configs/llama3_debug_1f1b_cpu.toml; extra arguments are passed through, e.g.
``--freeze.r_max 0.5``), shows one progress line per step, keeps the full log next to the outputs,
and ends with the summary: phases, predicted vs measured batch times, freeze ratio, losses, and the
paths of the trace, plan and timeline PNG.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

from timelyfreeze.outputs.summary import format_summary
from timelyfreeze.titan import launch

DEFAULT_CONFIG = "torchtitan_configs/llama3_debug_1f1b_cpu.toml"
SHOWN = re.compile(r"\[freeze\] (step|plan|planning|restored|re-plan)|validate step|Error|error:")


def show(line: str) -> None:
    """One progress line per step (and plans, validation, errors) of the training log."""
    clean = re.sub(r"\x1b\[[0-9;]*m", "", line.rstrip())
    if SHOWN.search(clean) and "lspci" not in clean and "loss: -0.0005" not in clean:
        print(re.sub(r"^\[titan\] \S+ \S+ - root - \w+ - ", "", clean), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=DEFAULT_CONFIG)
    args, extra = ap.parse_known_args()
    os.chdir(launch.REPO_ROOT)
    dump = Path(launch.dump_folder_of(args.config, extra))
    dump.mkdir(parents=True, exist_ok=True)
    log_path = dump / "run.log"
    cmd = launch.torchrun_command(args.config, *extra, nproc=launch.nproc_of(args.config, extra))
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.time()
    rc = launch.run(cmd, log_path, on_line=show)
    print(f"\nwall time {time.time() - t0:.1f} s, full log: {log_path}")
    summary_path = dump / "timelyfreeze" / "summary.json"
    if rc != 0 or not summary_path.exists():
        print(f"training failed (exit code {rc}); see {log_path}", file=sys.stderr)
        return rc or 1
    print(format_summary(json.loads(summary_path.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
