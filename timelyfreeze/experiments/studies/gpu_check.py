"""The one-command GPU check (``python scripts/gpu_check.py [--out DIR]``): its results and its command under
``docs/results/gpu/<date>/`` (or ``--out``). Which parts run depends on the GPUs at hand (``plan_parts``):

(a) one GPU or more: TimelyFreeze cycles of 1F1B and ZBV with both ranks on GPU 0 (``scripts/gpu_shared_cycle.py``:
    gloo, host-staged pipeline transfers), trace start times present, spans and the gap model on, the summary's
    predicted against measured batch time; (b) the same 1F1B cycle under ``torch.compile`` with block units;
(c) one transformer block at 8B dimensions (hidden 4096, sequence 1024, bf16; ``gpu_block``): F, B and W times with
    nothing and with everything frozen, and the measured weight-gradient share of F+B against the 32 % FLOP share;
(d) two GPUs or more: the same 1F1B cycle under torchrun with NCCL, PP=2 with one GPU per rank, and its recorded
    action start times checked against the host's view while the host runs ahead of the GPU (``gpu_host_view``);
(e) four GPUs or more: (d) with PP=2 x FSDP2 (data-parallel shard degree 2).

In (a) every host-staged send is a blocking device-to-host copy, so the host never runs ahead of the GPU there:
whether CUDA start times are right when it does is tested by (d) and (e) only. With fewer GPUs the check says
which of them did not run and what was therefore not tested, in its output and in ``results.json``.

``--device cpu`` runs part (c) alone on CPU (with ``--hidden``/``--seq``/``--repeats`` small, in seconds): what the
test suite does, so the part cannot break unseen. Each part runs in its own subprocess with its own deadline; a part
that fails is recorded as failed with the end of its log and named on stderr, not fatal to the others; the exit
code is 1 when any part failed. Without CUDA (and not ``--device cpu``): one ``error:`` line, exit code 2.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from planner.errors import PlannerError
from planner.fileio import write_json_atomically
from planner.trace.archive import TRACE_NAME, find_trace
from planner.trace.load import load_trace
from timelyfreeze.experiments.studies.gpu_block import DEVICES, BlockSize
from timelyfreeze.experiments.studies.gpu_host_view import HOST_VIEW_ENV, check_start_times, load_host_view
from timelyfreeze.titan import launch
from timelyfreeze.titan.launch import REPO_ROOT as ROOT

SHARED = ROOT / "scripts" / "gpu_shared_cycle.py"
GPU_1F1B = "torchtitan_configs/llama3_debug_1f1b_gpu.toml"
CYCLE = ["--training.steps", "14", "--freeze.warmup_steps", "2", "--freeze.monitor_steps", "3",
         "--freeze.ramp_steps", "2", "--validation.freq", "14", "--validation.steps", "1"]  # fmt: skip
FSDP2 = ["--parallelism.data_parallel_shard_degree", "2"]


@dataclass(frozen=True)
class Part:
    name: str
    gpus: int
    """The fewest GPUs it runs on (0: CPU is enough)."""
    timeout_s: int
    what: str
    """What it tests, as the output names it when it cannot run."""


PARTS = (
    Part("1f1b", 1, 120, "a 1F1B TimelyFreeze cycle on CUDA (both ranks on one GPU, gloo)"),
    Part("zbv", 1, 120, "a ZBV TimelyFreeze cycle on CUDA (both ranks on one GPU, gloo)"),
    Part("1f1b_compile", 1, 150, "the 1F1B cycle under torch.compile with block units"),
    Part("block", 0, 60, "F, B, I and W times of one 8B transformer block"),
    Part(
        "nccl_pp2",
        2,
        150,
        "NCCL with one GPU per rank (PP=2), and CUDA action start times against the host's "
        "view while the host runs ahead of the GPU",
    ),
    Part("nccl_pp2_fsdp2", 4, 180, "NCCL with PP=2 x FSDP2 on 4 GPUs, and its start times against the host's view"),
)
"""Every part, in the order they run; their deadlines add up to 7.5 minutes on one GPU, 13 with four."""


@dataclass(frozen=True)
class PartPlan:
    run: tuple[str, ...]
    not_tested: dict[str, str] = field(default_factory=dict)
    """Part -> what could not be tested, and why."""


def plan_parts(gpus: int, device: str = "cuda") -> PartPlan:
    """The parts that run with ``gpus`` CUDA devices; on ``device`` cpu only those that need none (block, small)."""
    have = 0 if device == "cpu" else gpus
    run = tuple(p.name for p in PARTS if p.gpus <= have and (device == "cuda" or p.gpus == 0))
    why = {p.name: f"{p.what}: needs {p.gpus} GPU{'s' * (p.gpus > 1)}, " for p in PARTS if p.name not in run}
    return PartPlan(run, {k: v + ("--device cpu" if device == "cpu" else f"{gpus} at hand") for k, v in why.items()})


def _run(name: str, cmd: list[str], out: Path, timeout_s: int) -> dict:
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        rc, log = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        text = [x.decode(errors="replace") if isinstance(x, bytes) else x or "" for x in (e.stdout, e.stderr)]
        rc, log = 124, f"{text[0]}{text[1]}\n(killed after {timeout_s} s)"
    (out / f"{name}.log").write_text(log)
    return {"command": " ".join(cmd), "rc": rc, "seconds": round(time.monotonic() - t0, 1), "log_tail": log[-2000:]}


def run_block(out: Path, *, device: str, size: BlockSize, timeout_s: int, python: str = sys.executable) -> dict:
    """Part (c) in a subprocess of its own (``gpu_block``). Its times come from ``out/block.json`` only, never from
    its output; a run that ends without writing that file has failed (``rc`` 1 at least, and ``error``)."""
    result = out / "block.json"
    result.unlink(missing_ok=True)
    cmd = [python, "-m", "timelyfreeze.experiments.studies.gpu_block", "--result", str(result), "--device", device,
           "--hidden", str(size.hidden), "--seq", str(size.seq), "--repeats", str(size.repeats)]  # fmt: skip
    res = _run("block", cmd, out, timeout_s)
    if res["rc"] == 0 and result.exists():
        res["times"] = json.loads(result.read_text())
    else:
        res["error"] = f"no {result.name} written (exit code {res['rc']}); see {out / 'block.log'}"
        res["rc"] = res["rc"] or 1
    return res


def _cycle_results(dump: Path) -> dict:
    """The summary's, the trace's and the plan's figures of a finished cycle in ``dump``."""
    res: dict = {}
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


def _shared_cycle(part: Part, config: str, out: Path, *extra: str) -> dict:
    dump = out / part.name
    res = _run(part.name, [sys.executable, str(SHARED), "--config", config, *CYCLE,
                           "--job.dump_folder", str(dump), *extra], out, part.timeout_s)  # fmt: skip
    return {**res, **_cycle_results(dump)}


def _nccl_cycle(part: Part, out: Path, *parallel: str) -> dict:
    """The 1F1B cycle under torchrun (NCCL, one GPU per process) with the host's view recorded on every rank; the
    part fails when the run does or when a recorded start time falls outside the host's bounds."""
    dump, extra = out / part.name, [*CYCLE, *parallel]
    nproc = launch.nproc_of(GPU_1F1B, extra)
    cmd = launch.torchrun_command(GPU_1F1B, *extra, nproc=nproc, dump_folder=dump,
                                  target=("-m", "timelyfreeze.experiments.studies.gpu_host_view"))  # fmt: skip
    views, log = dump / "host_view", out / f"{part.name}.log"
    t0 = time.monotonic()
    try:
        rc = launch.run(cmd, log, env={HOST_VIEW_ENV: str(views), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
                        timeout=part.timeout_s)  # fmt: skip
    except subprocess.TimeoutExpired:
        rc = 124
    text = log.read_text(errors="replace") if log.exists() else ""
    check = check_start_times(load_host_view(views))
    res = {"command": " ".join(cmd), "nproc": nproc, "rc": rc if rc or check.ok else 1,
           "seconds": round(time.monotonic() - t0, 1), "log_tail": text[-2000:],
           "start_times": check.to_json()}  # fmt: skip
    return {**res, **_cycle_results(dump)}


def _gpu_count(device: str) -> int:
    import torch

    return torch.cuda.device_count() if device == "cuda" and torch.cuda.is_available() else 0


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="results folder (default docs/results/gpu/<date>)")
    ap.add_argument("--device", choices=DEVICES, default="cuda", help="cpu: part (c) alone, on CPU")
    ap.add_argument("--hidden", type=int, default=BlockSize.hidden, help="part (c)'s hidden size")
    ap.add_argument("--seq", type=int, default=BlockSize.seq, help="part (c)'s sequence length")
    ap.add_argument("--repeats", type=int, default=BlockSize.repeats, help="part (c)'s timed calls (median)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    for name in ("hidden", "seq", "repeats"):
        if getattr(a, name) < 1:
            print(f"error: --{name} = {getattr(a, name)}: must be at least 1", file=sys.stderr)
            return 2
    gpus = _gpu_count(a.device)
    if a.device == "cuda" and gpus == 0:
        print("error: no CUDA device: scripts/gpu_check.py needs one GPU (nothing was run)", file=sys.stderr)
        return 2
    import torch

    out = (a.out or ROOT / "docs" / "results" / "gpu" / datetime.date.today().isoformat()).resolve()
    out.mkdir(parents=True, exist_ok=True)
    plan = plan_parts(gpus, a.device)
    command = ["python scripts/gpu_check.py", *(argv if argv is not None else sys.argv[1:])]
    results: dict = {"command": " ".join(command),
                     "device": torch.cuda.get_device_name(0) if gpus else "cpu", "gpus": gpus,
                     "torch": torch.__version__, "not_tested": plan.not_tested}  # fmt: skip
    for line in plan.not_tested.values():
        print(f"gpu check: not tested: {line}")
    parts = {p.name: p for p in PARTS}
    for name in plan.run:
        part = parts[name]
        if name == "1f1b":
            res = _shared_cycle(part, GPU_1F1B, out)
        elif name == "zbv":
            res = _shared_cycle(part, "torchtitan_configs/llama3_debug_zbv_cpu.toml", out)
        elif name == "1f1b_compile":
            res = _shared_cycle(part, GPU_1F1B, out, "--compile.enable", "--freeze.unit", "block")
        elif name == "block":
            size = BlockSize(a.hidden, a.seq, a.repeats)
            res = run_block(out, device=a.device, size=size, timeout_s=part.timeout_s)
        else:
            res = _nccl_cycle(part, out, *(FSDP2 if name == "nccl_pp2_fsdp2" else ()))
            print(f"gpu check: {name}: {res['start_times']['line']}")
        results[name] = res
        write_json_atomically(out / "results.json", results)  # what ran so far, should a later part hang
    failed = [n for n in plan.run if results[n]["rc"] != 0]
    write_json_atomically(out / "results.json", results)
    for n in failed:
        why = results[n].get("error") or f"exit code {results[n]['rc']}; see {out}/{n}.log"
        print(f"gpu check: part {n} FAILED: {why}", file=sys.stderr)
    print(f"gpu check: results in {out}/results.json")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
