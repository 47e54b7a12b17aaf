"""The one-command GPU check (``python scripts/gpu_check.py``): at most about 8 minutes on one lent GPU, its
results and its command under ``docs/results/gpu/<date>/``.

(a) TimelyFreeze cycles of 1F1B and ZBV with both ranks on the one GPU (``scripts/gpu_shared_cycle.py``:
    gloo, host-staged pipeline transfers), trace start times present, spans and the gap model on, the
    summary's predicted against measured batch time; (b) the same 1F1B cycle under ``torch.compile`` with
    block units; (c) one transformer block at 8B dimensions (hidden 4096, sequence 1024, bf16): F, B and W
    times with nothing and with everything frozen, and the measured weight-gradient share of F+B against the
    32 % FLOP share.

**Never run** (written where no GPU was at hand): every CUDA-only call is behind ``torch.cuda.is_available()``;
each part runs in its own subprocess with its own deadline, and a part that fails is recorded as failed with
the end of its log, not fatal to the others. Without CUDA: one ``error:`` line, exit code 2.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from planner.errors import PlannerError
from planner.fileio import write_json_atomically
from planner.trace.archive import TRACE_NAME, find_trace
from planner.trace.load import load_trace

ROOT = Path(__file__).resolve().parents[3]
SHARED = ROOT / "scripts" / "gpu_shared_cycle.py"
CYCLE = ["--training.steps", "14", "--freeze.warmup_steps", "2", "--freeze.monitor_steps", "3",
         "--freeze.ramp_steps", "2", "--validation.freq", "14", "--validation.steps", "1"]  # fmt: skip
PART_TIMEOUT_S = {"1f1b": 120, "zbv": 120, "1f1b_compile": 150, "block": 60}
"""Deadline of each part (s): about 7.5 minutes in all."""
FLOP_W_SHARE = 0.32
"""W's share of F+B FLOPs in a Llama block: F = 1 unit, B = 2 (I and W one each) would give 1/3; with
attention's score products (no weights) in F and I only, about 32 % at hidden 4096, sequence 1024."""


def _run(name: str, cmd: list[str], out: Path) -> dict:
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=PART_TIMEOUT_S[name])
        rc, log = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, log = 124, f"{e.stdout or ''}{e.stderr or ''}\n(killed after {PART_TIMEOUT_S[name]} s)"
        log = log if isinstance(log, str) else str(log)
    (out / f"{name}.log").write_text(log if isinstance(log, str) else str(log))
    return {"command": " ".join(cmd), "rc": rc, "seconds": round(time.monotonic() - t0, 1), "log_tail": log[-2000:]}


def _cycle(name: str, config: str, out: Path, *extra: str) -> dict:
    dump = out / name
    res = _run(name, [sys.executable, str(SHARED), "--config", config, *CYCLE,
                      "--job.dump_folder", str(dump), *extra], out)  # fmt: skip
    summary = dump / "timelyfreeze" / "summary.json"
    trace = find_trace(dump / "timelyfreeze" / TRACE_NAME)  # the folder, or its trace.tar.gz once packed
    if summary.exists():
        s = json.loads(summary.read_text())
        res["summary"] = {k: s.get(k) for k in ("predicted_batch_ms", "span_ms", "speedup", "failures") if k in s}
    if trace is not None:
        try:
            recs = [r for r in load_trace(trace).records if r.rank == 0 and r.replica == 0]
            res["start_ms_present"] = bool(recs) and all(r.start_ms is not None for r in recs)
        except PlannerError as e:
            res["trace_error"] = str(e)
    plan = dump / "timelyfreeze" / "plan.json"
    if plan.exists():
        p = json.loads(plan.read_text())
        res["plan"] = {k: p.get(k) for k in ("batch_time_ms", "gaps", "comm") if k in p}
    return res


def block_times(hidden: int = 4096, seq: int = 1024, repeats: int = 10) -> dict:
    """F, B (input gradient: I) and W (weight gradient) of one Llama-3-8B block in bf16, ms (median); B with
    nothing and with everything frozen (then the backward is I only)."""
    from torchtitan.models.llama3.model.args import TransformerModelArgs  # deferred: only the GPU check builds a block
    from torchtitan.models.llama3.model.model import TransformerBlock

    # (deferred: TorchTitan is only needed for this part)
    args = TransformerModelArgs(dim=hidden, n_layers=1, n_heads=32, n_kv_heads=8, ffn_dim_multiplier=1.3,
                                multiple_of=1024, rope_theta=500000, max_seq_len=seq)  # fmt: skip
    dev = torch.device("cuda")
    block = TransformerBlock(0, args).to(dev, torch.bfloat16)
    block.init_weights(buffer_device=dev) if hasattr(block, "init_weights") else None
    from torchtitan.models.llama3.model.model import precompute_freqs_cis  # deferred: only the GPU check builds a block

    freqs = precompute_freqs_cis(args.dim // args.n_heads, seq, args.rope_theta).to(dev)
    x = torch.randn(1, seq, hidden, device=dev, dtype=torch.bfloat16, requires_grad=True)
    params = [p for p in block.parameters() if p.requires_grad]

    def timed(fn) -> float:
        out = []
        for _ in range(repeats + 2):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        out = sorted(out[2:])
        return out[len(out) // 2]

    def fwd():
        return block(x, freqs)

    f_ms = timed(fwd)
    y = fwd()
    g = torch.randn_like(y)
    i_ms = timed(lambda: torch.autograd.grad(fwd(), x, g)) - f_ms
    w_ms = timed(lambda: torch.autograd.grad(fwd(), params, g)) - f_ms
    b_ms = timed(lambda: torch.autograd.grad(fwd(), [x, *params], g)) - f_ms
    for p in params:
        p.requires_grad_(False)
    b_frozen = timed(lambda: torch.autograd.grad(fwd(), x, g)) - f_ms
    return {
        "hidden": hidden, "seq": seq, "dtype": "bfloat16", "F_ms": f_ms, "B_ms": b_ms, "I_ms": i_ms, "W_ms": w_ms,
        "B_all_frozen_ms": b_frozen, "W_share_of_F_plus_B": (b_ms - b_frozen) / (f_ms + b_ms),
        "W_flop_share": FLOP_W_SHARE,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--block-only" in argv:  # the subprocess of part (c)
        print(json.dumps(block_times()))
        return 0
    if not torch.cuda.is_available():
        print("error: no CUDA device: scripts/gpu_check.py needs one GPU (nothing was run)", file=sys.stderr)
        return 2
    out = ROOT / "docs" / "results" / "gpu" / datetime.date.today().isoformat()
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"command": "python scripts/gpu_check.py", "device": torch.cuda.get_device_name(0),
                     "torch": torch.__version__}  # fmt: skip
    results["1f1b"] = _cycle("1f1b", "torchtitan_configs/llama3_debug_1f1b_gpu.toml", out)
    results["zbv"] = _cycle("zbv", "torchtitan_configs/llama3_debug_zbv_cpu.toml", out)
    results["1f1b_compile"] = _cycle("1f1b_compile", "torchtitan_configs/llama3_debug_1f1b_gpu.toml", out,
                                     "--compile.enable", "--freeze.unit", "block")  # fmt: skip
    res = _run("block", [sys.executable, "-m", "timelyfreeze.experiments.studies.gpu_check", "--block-only"], out)
    if res["rc"] == 0:
        try:
            res["times"] = json.loads(res["log_tail"].strip().splitlines()[-1])
        except (ValueError, IndexError):
            pass
    results["block"] = res
    write_json_atomically(out / "results.json", results)
    print(f"gpu check: results in {out.relative_to(ROOT)}/results.json")
    return 0 if all(results[k]["rc"] == 0 for k in ("1f1b", "zbv", "1f1b_compile", "block")) else 1


if __name__ == "__main__":
    sys.exit(main())
