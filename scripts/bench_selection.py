#!/usr/bin/env python
"""How far a backward action's frozen *elements* land from ``ratio`` x the stage's elements, for the two
ways of drawing the frozen tensors (``timelyfreeze.methods.selection``): ``uniform_subset`` (a random set of
``floor/ceil(r n)`` tensors) and ``balanced_subset`` (TimelyFreeze's: systematic sampling along the
tensors sorted by size). Both freeze every tensor with probability ``r``. Stages of the embedded default
(llama3 debug model, 6 layers, PP=2: the first stage holds the embedding and blocks 0-2, the second
blocks 3-5, the final norm and the output projection), the first stage's anchor tensor left out as the
runtime does. Pure computation (no training), deterministic seeds.

    python scripts/bench_selection.py [--draws 2000]
"""

from __future__ import annotations

import argparse
import math
import sys

from timelyfreeze.methods.selection import action_generator, balanced_subset, uniform_subset


def debug_model_stages() -> list[dict[str, int]]:
    import torch
    from torchtitan.models.llama3 import llama3_args
    from torchtitan.models.llama3.model.model import Transformer

    with torch.device("meta"):
        model = Transformer(llama3_args["debugmodel"])
    sizes = {n: p.numel() for n, p in model.named_parameters()}
    first = {
        n: s
        for n, s in sizes.items()
        if n.startswith("tok_embeddings") or any(n.startswith(f"layers.{i}.") for i in range(3))
    }
    first.pop("layers.0.attention_norm.weight")  # the anchor: never frozen
    last = {n: s for n, s in sizes.items() if n not in first and n != "layers.0.attention_norm.weight"}
    return [first, last]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draws", type=int, default=2000)
    args = ap.parse_args()
    if args.draws < 2:
        raise SystemExit(f"error: --draws: must be >= 2, got {args.draws}")
    lines = [
        "| stage | tensors | largest tensor (share of elements) | r | uniform: RMS / max deviation | "
        "balanced: RMS / max deviation |",
        "|---|---|---|---|---|---|",
    ]
    for s, stage in enumerate(debug_model_stages()):
        names, numels = list(stage), list(stage.values())
        total = sum(numels)
        for r in (0.2, 0.5, 0.8):
            dev = {"uniform": [], "balanced": []}
            for d in range(args.draws):
                for kind, pick in (
                    ("uniform", lambda g: uniform_subset(names, r, g)),
                    ("balanced", lambda g: balanced_subset(names, numels, r, g)),
                ):
                    chosen = pick(action_generator(0, d, s, 0))
                    dev[kind].append(sum(stage[x] for x in chosen) / total - r)
            cells = []
            for kind in ("uniform", "balanced"):
                v = dev[kind]
                cells.append(
                    f"{100 * math.sqrt(sum(x * x for x in v) / len(v)):.1f} % / {100 * max(abs(x) for x in v):.1f} %"
                )
            lines.append(f"| {s} | {len(names)} | {100 * max(numels) / total:.0f} % | {r} | {cells[0]} | {cells[1]} |")
    print(f"Frozen-element share minus r over {args.draws} draws per row (percentage points of the stage's elements).")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
