#!/usr/bin/env python
"""Build (once) the pre-trained checkpoint of the embedded fine-tuning setting.

Trains the llama3 debug model without freezing on the stdlib "pretrain" split
(torchtitan_configs/llama3_debug_pretrain_cpu.toml, PP=2, CPU; about 5 minutes on 2 cores) into
``$TIMELYFREEZE_CACHE/pretrained-llama3-debugmodel-py<ver>/``. Does nothing when it already exists
(``--force`` rebuilds). Fine-tuning configs load it with
``[checkpoint] initial_load_path = "pystdlib-pretrained"``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from timelyfreeze import corpus  # noqa: E402


def ensure_pretrained(force: bool = False, extra: list[str] | None = None) -> Path:
    ckpt = corpus.pretrained_checkpoint()
    if ckpt is not None and not force:
        print(f"pre-trained checkpoint: {ckpt} (cached)", flush=True)
        return ckpt
    out = corpus.pretrained_dir()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--rdzv-backend=c10d",
           "--rdzv-endpoint=localhost:0", "-m", "timelyfreeze.train",
           "--job.config_file", str(ROOT / "torchtitan_configs" / corpus.PRETRAIN_CONFIG),
           "--job.dump_folder", str(out), *(extra or [])]
    print("pre-training the debug model once (cached for later runs): " + " ".join(cmd), flush=True)
    t0 = time.time()
    with open(out / "pretrain.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
        for line in proc.stdout:
            log.write(line)
            if ("step:" in line or "validate" in line) and "loss: -" not in line:
                print("  " + re.sub(r"\x1b\[[0-9;]*m", "", line.split(" - root - INFO - ")[-1].rstrip()), flush=True)
        rc = proc.wait()
    if rc != 0:
        raise SystemExit(f"pre-training failed (exit {rc}); see {out / 'pretrain.log'}")
    (out / "DONE").write_text(f"{time.time() - t0:.0f} s\n")
    ckpt = corpus.pretrained_checkpoint()
    print(f"pre-trained checkpoint: {ckpt} ({time.time() - t0:.0f} s)", flush=True)
    return ckpt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--force", action="store_true", help="rebuild even if cached")
    args, extra = ap.parse_known_args()
    ensure_pretrained(args.force, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
