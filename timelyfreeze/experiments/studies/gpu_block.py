"""Part (c) of the GPU check: F, B, I and W times of one Llama transformer block (TorchTitan 0.2.2's
``TransformerBlock``), with nothing and with everything frozen, and W's measured share of F+B against its
FLOP share.

    python -m timelyfreeze.experiments.studies.gpu_block --result block.json [--device cuda|cpu]
                                                         [--hidden 4096] [--seq 1024] [--repeats 10]

At the defaults it is one Llama-3-8B block (hidden 4096, sequence 1024) in bf16 on CUDA. ``--device cpu`` (float32)
with small sizes runs the same code in seconds: the test suite does that, so the part cannot break unseen
(``tests/test_gpu_check.py``). The times go to the ``--result`` file as JSON, and nowhere else: the GPU check
reads that file, never the process's output (``gpu_check.run_block``), and a missing file is a failed part.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from planner.fileio import write_json_atomically

FLOP_W_SHARE = 0.32
"""W's share of F+B FLOPs in a Llama block: F = 1 unit, B = 2 (I and W one each) would give 1/3; with
attention's score products (no weights) in F and I only, about 32 % at hidden 4096, sequence 1024."""
DEVICES = ("cuda", "cpu")


@dataclass(frozen=True)
class BlockSize:
    """The block's dimensions: 8B's by default (hidden 4096, 32 heads of 128, 8 KV heads, sequence 1024)."""

    hidden: int = 4096
    seq: int = 1024
    repeats: int = 10

    @property
    def heads(self) -> int:
        return max(1, self.hidden // 128)

    @property
    def kv_heads(self) -> int:
        return max(1, self.heads // 4)


def _timer(device: str):
    """``timed(fn) -> ms`` of one call: CUDA events on the current stream on CUDA, the host clock on CPU."""
    import torch

    if device == "cuda":

        def timed(fn) -> float:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b)

        return timed

    def timed_cpu(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    return timed_cpu


def block_times(device: str = "cuda", size: BlockSize = BlockSize()) -> dict:
    """F, B (I and W together), I (input gradient) and W (weight gradient) of one block, ms (median of
    ``size.repeats`` after 2 warm-up calls); B again with every parameter frozen (then it is I only)."""
    import torch
    from torchtitan.models.llama3.model.args import TransformerModelArgs  # deferred: only this part builds a block
    from torchtitan.models.llama3.model.model import TransformerBlock, precompute_freqs_cis

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    args = TransformerModelArgs(dim=size.hidden, n_layers=1, n_heads=size.heads, n_kv_heads=size.kv_heads,
                                ffn_dim_multiplier=1.3, multiple_of=1024, rope_theta=500000,
                                max_seq_len=size.seq)  # fmt: skip
    dev = torch.device(device)
    block = TransformerBlock(0, args).to(dev, dtype)
    with torch.no_grad():  # TorchTitan initialises in place; the parameters are leaves that require grad
        block.init_weights()
    freqs = precompute_freqs_cis(args.dim // args.n_heads, size.seq, args.rope_theta).to(dev)
    x = torch.randn(1, size.seq, size.hidden, device=dev, dtype=dtype, requires_grad=True)
    params = [p for p in block.parameters() if p.requires_grad]
    once = _timer(device)

    def timed(fn) -> float:
        out = sorted([once(fn) for _ in range(size.repeats + 2)][2:])
        return out[len(out) // 2]

    def fwd():
        return block(x, freqs, None)  # causal SDPA: no attention masks

    f_ms = timed(fwd)
    g = torch.randn_like(fwd())
    i_ms = timed(lambda: torch.autograd.grad(fwd(), x, g)) - f_ms
    w_ms = timed(lambda: torch.autograd.grad(fwd(), params, g)) - f_ms
    b_ms = timed(lambda: torch.autograd.grad(fwd(), [x, *params], g)) - f_ms
    for p in params:
        p.requires_grad_(False)
    b_frozen = timed(lambda: torch.autograd.grad(fwd(), x, g)) - f_ms
    return {
        "device": device, **asdict(size), "dtype": str(dtype).removeprefix("torch."),
        "F_ms": f_ms, "B_ms": b_ms, "I_ms": i_ms, "W_ms": w_ms, "B_all_frozen_ms": b_frozen,
        "W_share_of_F_plus_B": (b_ms - b_frozen) / (f_ms + b_ms), "W_flop_share": FLOP_W_SHARE,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--result", type=Path, required=True, help="the JSON file the times are written to")
    ap.add_argument("--device", choices=DEVICES, default="cuda")
    ap.add_argument("--hidden", type=int, default=BlockSize.hidden)
    ap.add_argument("--seq", type=int, default=BlockSize.seq)
    ap.add_argument("--repeats", type=int, default=BlockSize.repeats)
    a = ap.parse_args(argv)
    for name in ("hidden", "seq", "repeats"):
        if getattr(a, name) < 1:
            print(f"error: --{name} = {getattr(a, name)}: must be at least 1", file=sys.stderr)
            return 2
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("error: --device cuda: no CUDA device (use --device cpu)", file=sys.stderr)
            return 2
    write_json_atomically(a.result, block_times(a.device, BlockSize(a.hidden, a.seq, a.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
