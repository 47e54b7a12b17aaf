"""The pre-trained checkpoint of the embedded fine-tuning setting: the committed one, or built here.

The repository ships one (``checkpoints/llama3-debugmodel-py311/``, ``corpus.COMMITTED_PRETRAINED``): every
machine with the same tokenizer starts its fine-tuning runs from the same weights, so results from different
machines compare.
Where it does not apply (another Python, another tokenizer), this trains the llama3 debug model without
freezing on the stdlib "pretrain" split (torchtitan_configs/llama3_debug_pretrain_cpu.toml, PP=2, CPU; about
3-5 minutes on 2 cores) into ``$TIMELYFREEZE_CACHE/pretrained-llama3-debugmodel-py<ver>/``, once.
``--force`` rebuilds that cache; ``--force --install`` then replaces the committed checkpoint with it.
Fine-tuning configs load the checkpoint with ``[checkpoint] initial_load_path = "pystdlib-pretrained"``.

``scripts/pretrain.py`` is the command line (``main``); the sweep calls ``ensure_pretrained``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from pathlib import Path

from timelyfreeze.data import corpus
from timelyfreeze.titan import launch


def ensure_pretrained(force: bool = False, extra: list[str] | None = None) -> Path:
    """The checkpoint fine-tuning starts from (``corpus.pretrained_checkpoint``), pre-trained here first when
    there is none or ``force``; ``extra``: arguments for the pre-training run."""
    if not force:
        why_not = corpus.committed_pretrained_mismatch()
        ckpt = corpus.pretrained_checkpoint()
        if why_not is None:
            print(f"pre-trained checkpoint: {ckpt} (committed)", flush=True)
            return ckpt
        if ckpt is not None:
            print(
                f"pre-trained checkpoint: {ckpt} (built on this machine; the committed one does not apply: {why_not})",
                flush=True,
            )
            return ckpt
        print(f"the committed pre-trained checkpoint does not apply here ({why_not})", flush=True)
    out = corpus.pretrained_dir()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    cmd = launch.torchrun_command(launch.CONFIGS / corpus.PRETRAIN_CONFIG, *(extra or []), dump_folder=out)
    print("pre-training the debug model once (cached for later runs): " + " ".join(cmd), flush=True)
    t0 = time.time()

    def show(line: str) -> None:
        if ("step:" in line or "validate" in line) and "loss: -" not in line:
            print("  " + re.sub(r"\x1b\[[0-9;]*m", "", line.split(" - root - INFO - ")[-1].rstrip()), flush=True)

    rc = launch.run(cmd, out / "pretrain.log", on_line=show)
    if rc != 0:
        raise SystemExit(f"pre-training failed (exit {rc}); see {out / 'pretrain.log'}")
    (out / "DONE").write_text(f"{time.time() - t0:.0f} s\n")
    ckpt = corpus.last_checkpoint(out / "checkpoint")
    print(f"pre-trained checkpoint: {ckpt} ({time.time() - t0:.0f} s)", flush=True)
    return ckpt


def install(ckpt: Path) -> Path:
    """Replace the committed checkpoint with ``ckpt`` (+ the tokenizer's sha256 and the pre-training log)."""
    dest = corpus.COMMITTED_PRETRAINED
    tmp = dest.with_name(dest.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(ckpt, tmp / "checkpoint" / ckpt.name)
    shutil.copy2(ckpt.parents[1] / "pretrain.log", tmp / "pretrain.log")
    (tmp / "tokenizer.sha256").write_text(corpus.tokenizer_sha256() + "  tokenizer.json\n")
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    print(f"installed as the committed checkpoint: {dest} (fingerprint {corpus.start_fingerprint()})", flush=True)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="pretrain.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--force", action="store_true", help="pre-train here even when a checkpoint exists")
    ap.add_argument(
        "--install",
        action="store_true",
        help="with --force: make the new checkpoint the committed one (then commit it)",
    )
    args, extra = ap.parse_known_args(argv)
    if args.install and not args.force:
        print("error: --install needs --force (it installs a checkpoint pre-trained by this run)", file=sys.stderr)
        return 2
    ckpt = ensure_pretrained(args.force, extra)
    if args.install:
        install(ckpt)
    return 0
