#!/usr/bin/env python
"""A TimelyFreeze cycle with every pipeline rank on ONE GPU: a smoke test of the CUDA path on a host
with fewer GPUs than ranks (one GPU lent for a test, a workstation). Not a way to train.

    python scripts/gpu_shared_cycle.py --config torchtitan_configs/llama3_debug_1f1b_gpu.toml [--freeze.r_max 0.5 ...]

With one GPU per rank, use ``torchrun -m timelyfreeze.train`` as usual; nothing here is needed. With one
GPU for all ranks, three things stand in the way, and this harness handles them in its own processes
only (the library is unchanged):

1. TorchTitan puts rank ``i`` on ``cuda:<LOCAL_RANK>``. The ranks are started here, not by torchrun,
   with ``LOCAL_RANK=0`` each (``RANK`` and ``WORLD_SIZE`` as usual).
2. NCCL refuses two ranks on one device ("Duplicate GPU detected"). The process groups use gloo:
   ``Backend.default_device_backend_map["cuda"] = "gloo"`` before TorchTitan starts them. Gloo reduces
   and broadcasts CUDA tensors (through host memory),
3. but its send/recv take host memory only, so the pipeline's activations and gradients go through
   host buffers: ``isend`` copies to the host, ``irecv`` receives into a host buffer and copies to the
   GPU when the schedule waits for it.

What this measures is therefore a pipeline whose two stages time-share one GPU, with host-staged
transfers; the freeze planner sees that in its traces like any other timing. The summary at the end is
the one ``make run`` prints (predicted vs measured batch time, phases, ratios).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class _HostStagedRecv:
    """The work of an ``irecv`` into a host buffer: ``wait`` copies the buffer into the GPU tensor."""

    def __init__(self, work, host, target):
        self._work, self._host, self._target = work, host, target

    def wait(self, *args, **kwargs):
        import torch

        ok = self._work.wait(*args, **kwargs)
        with torch.no_grad():  # the stage's receive buffers are leaves that require grad
            self._target.copy_(self._host)
        return ok

    def is_completed(self):
        return self._work.is_completed()


def _stage_p2p_through_host() -> None:
    """Point 3 of the module docstring: wrap ``isend``/``irecv`` where torch looks them up."""
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    orig_isend, orig_irecv = c10d.isend, c10d.irecv

    def isend(tensor, *args, **kwargs):
        if tensor.is_cuda:
            tensor = tensor.to("cpu")
        return orig_isend(tensor, *args, **kwargs)

    def irecv(tensor, *args, **kwargs):
        if not tensor.is_cuda:
            return orig_irecv(tensor, *args, **kwargs)
        host = torch.empty_like(tensor, device="cpu")
        return _HostStagedRecv(orig_irecv(host, *args, **kwargs), host, tensor)

    c10d.isend = dist.isend = isend
    c10d.irecv = dist.irecv = irecv


def worker(extra: list[str]) -> None:
    import torch
    import torch.distributed as dist

    dist.Backend.default_device_backend_map["cuda"] = "gloo"
    _stage_p2p_through_host()
    print(
        f"[gpu_shared_cycle] rank {os.environ['RANK']}: {torch.cuda.get_device_name(0)}, torch "
        f"{torch.__version__}, gloo with host-staged send/recv",
        flush=True,
    )
    from timelyfreeze.train import main as train_main

    sys.argv = ["timelyfreeze.train", *extra]
    train_main()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(config: str, extra: list[str]) -> int:
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA device: this harness runs the ranks on one GPU (use `make run` on CPU)", file=sys.stderr)
        return 2
    from timelyfreeze.outputs.summary import format_summary
    from timelyfreeze.titan.launch import dump_folder_of, nproc_of

    os.chdir(ROOT)
    n = nproc_of(config, extra)
    dump = Path(dump_folder_of(config, extra))
    dump.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        WORLD_SIZE=str(n),
        LOCAL_WORLD_SIZE=str(n),
        LOCAL_RANK="0",
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
    )
    cmd = [sys.executable, __file__, "--worker", "--job.config_file", config, *extra]
    print("$ " + " ".join(cmd) + f"   (x{n}, RANK 0..{n - 1}, LOCAL_RANK 0)", flush=True)
    t0 = time.time()
    logs = [open(dump / f"rank{r}.log", "w") for r in range(n)]
    procs = [
        subprocess.Popen(cmd, env=dict(env, RANK=str(r)), stdout=logs[r], stderr=subprocess.STDOUT) for r in range(n)
    ]
    rcs = [p.wait() for p in procs]
    for f in logs:
        f.close()
    print(f"wall time {time.time() - t0:.1f} s, exit codes {rcs}, logs: {dump}/rank*.log")
    summary_path = dump / "timelyfreeze" / "summary.json"
    if any(rcs) or not summary_path.exists():
        print(f"training failed; see {dump}/rank*.log", file=sys.stderr)
        return max(rcs) or 1
    print(format_summary(json.loads(summary_path.read_text())))
    return 0


def main() -> int:
    if "--worker" in sys.argv:
        worker([a for a in sys.argv[1:] if a != "--worker"])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="torchtitan_configs/llama3_debug_1f1b_gpu.toml")
    args, extra = ap.parse_known_args()
    return launch(args.config, extra)


if __name__ == "__main__":
    sys.exit(main())
