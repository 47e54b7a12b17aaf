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
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from timelyfreeze.summary import format_summary  # noqa: E402

DEFAULT_CONFIG = "torchtitan_configs/llama3_debug_1f1b_cpu.toml"


def dump_folder_of(config: str, extra: list[str]) -> str:
    for i, a in enumerate(extra):
        if a.startswith("--job.dump_folder"):
            return a.split("=", 1)[1] if "=" in a else extra[i + 1]
    text = Path(config).read_text()
    m = re.search(r'^\s*dump_folder\s*=\s*"([^"]+)"', text, re.M)
    return m.group(1) if m else "./outputs"


def nproc_of(config: str, extra: list[str]) -> int:
    for i, a in enumerate(extra):
        if a.startswith("--parallelism.pipeline_parallel_degree"):
            return int(a.split("=", 1)[1] if "=" in a else extra[i + 1])
    m = re.search(r"^\s*pipeline_parallel_degree\s*=\s*(\d+)", Path(config).read_text(), re.M)
    return int(m.group(1)) if m else 2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=DEFAULT_CONFIG)
    args, extra = ap.parse_known_args()
    os.chdir(ROOT)
    dump = Path(dump_folder_of(args.config, extra))
    dump.mkdir(parents=True, exist_ok=True)
    log_path = dump / "run.log"
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc_of(args.config, extra)}",
           "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "-m", "timelyfreeze.train",
           "--job.config_file", args.config, *extra]
    print("$ " + " ".join(cmd), flush=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    t0 = time.time()
    shown = re.compile(r"\[freeze\] (step|plan|planning|restored|re-plan)|validate step|Error|error:")
    with open(log_path, "w") as log, subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    ) as proc:
        for line in proc.stdout:
            log.write(line)
            clean = re.sub(r"\x1b\[[0-9;]*m", "", line.rstrip())
            if shown.search(clean) and "lspci" not in clean and "loss: -0.0005" not in clean:
                print(re.sub(r"^\[titan\] \S+ \S+ - root - \w+ - ", "", clean), flush=True)
        rc = proc.wait()
    print(f"\nwall time {time.time() - t0:.1f} s, full log: {log_path}")
    summary_path = dump / "timelyfreeze" / "summary.json"
    if rc != 0 or not summary_path.exists():
        print(f"training failed (exit code {rc}); see {log_path}", file=sys.stderr)
        return rc or 1
    print(format_summary(json.loads(summary_path.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
