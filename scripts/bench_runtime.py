#!/usr/bin/env python
"""Runtime benchmark on the embedded default (llama3 debug model, PP=2, CPU), two torchrun jobs:

(a) overhead: one job alternating steps with the freezing runtime's hooks detached (TorchTitan's
compute through this project's trainer subclass, which then adds only a few Python calls per batch)
with TimelyFreeze steps at ratio 0
    (hooks, profiler, trace, metrics; ``scripts/bench_runtime_trainer.py``); paired difference of
    neighbouring steps, so slow drift of the machine cancels;
(b) phases: a TimelyFreeze run at r_max 0.8; measured batch time (median per phase) next to the
    plan's predicted no-freeze, all-frozen and planned batch times, and measured vs predicted speedup.

Data parallelism: ``--dp-shard 2`` runs PP=2 x FSDP 2 (4 ranks), ``--dp-replicate 2 --dp-shard 2`` HSDP
(8 ranks), ``--tp 2`` TP x PP; ``--small`` trains 4 microbatches of 128 tokens instead of 8 of 256;
``--repeats N`` runs (b) N times and reports the median and range over the runs.

Prints a Markdown table (also written to ``<out>/bench_runtime.md``).

    python scripts/bench_runtime.py [--schedules 1F1B,GPipe] [--pairs 20] [--stable 16] [--out outputs/bench]
                                    [--dp-shard 2] [--dp-replicate 2] [--tp 2] [--small] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = {
    "GPipe": "llama3_debug_gpipe_cpu.toml",
    "1F1B": "llama3_debug_1f1b_cpu.toml",
    "Interleaved1F1B": "llama3_debug_interleaved1f1b_cpu.toml",
    "ZBVZeroBubble": "llama3_debug_zbv_cpu.toml",
}


LAYOUT: list[str] = []
"""Parallelism and size overrides of every job (set by ``main`` from the command line)."""
NPROC = 2


def torchrun(target: list[str], config: str, dump: Path, *args: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={NPROC}", "--rdzv-backend=c10d",
           "--rdzv-endpoint=localhost:0", *target, "--job.config_file", str(ROOT / "torchtitan_configs" / config),
           "--job.dump_folder", str(dump), "--metrics.no-enable-tensorboard", *LAYOUT, *args]
    dump.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(dump / "bench.log", "w") as log:
        rc = subprocess.call(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                             env=dict(os.environ, PYTHONUNBUFFERED="1"))
    print(f"  {' '.join(target[-1:])} {config}: exit {rc}, {time.time() - t0:.0f} s (log {dump / 'bench.log'})",
          flush=True)
    if rc != 0:
        raise SystemExit(f"benchmark job failed, see {dump / 'bench.log'}")


def overhead(schedule: str, pairs: int, out: Path) -> dict:
    dump = out / f"overhead_{schedule}"
    skip = 4
    torchrun([str(ROOT / "scripts" / "bench_runtime_trainer.py")], CONFIG[schedule], dump,
             "--freeze.method", "none", "--freeze.warmup_steps", "0", "--training.steps", str(skip + 2 * pairs),
             "--validation.no-enable")
    rows = json.loads((dump / "bench_overhead.json").read_text())
    rows = [r for r in rows if r["step"] > skip]
    by_step = {r["step"]: r for r in rows}
    diffs = [by_step[s]["s"] - by_step[s + 1]["s"] for s in by_step if s % 2 == 1 and s + 1 in by_step]
    plain = statistics.median(r["s"] for r in rows if r["kind"] == "plain")
    hooks = statistics.median(r["s"] for r in rows if r["kind"] == "hooks")
    mean_d = statistics.fmean(diffs)
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    return {"schedule": schedule, "pairs": len(diffs), "plain_ms": plain * 1e3, "hooks_ms": hooks * 1e3,
            "diff_ms": mean_d * 1e3, "ci_ms": 1.96 * se * 1e3, "pct": 100 * mean_d / plain}


def phases(schedule: str, stable: int, out: Path, r_max: float, repeat: int = 0) -> dict:
    dump = out / (f"phases_{schedule}" + (f"_{repeat}" if repeat else ""))
    warm, mon, ramp = 3, 5, 4
    torchrun(["-m", "timelyfreeze.train"], CONFIG[schedule], dump,
             "--freeze.r_max", str(r_max), "--freeze.warmup_steps", str(warm), "--freeze.monitor_steps", str(mon),
             "--freeze.ramp_steps", str(ramp), "--training.steps", str(warm + 2 * mon + ramp + stable),
             "--validation.no-enable")
    s = json.loads((dump / "timelyfreeze" / "summary.json").read_text())
    metrics = [json.loads(l) for l in (dump / "timelyfreeze" / "metrics.jsonl").read_text().splitlines()]
    med = {}
    for p in ("upper", "lower", "stable"):
        vals = [m["batch_ms"] for m in metrics if m.get("phase") == p]
        med[p] = statistics.median(vals) if vals else float("nan")
    pred = s["predicted_batch_ms"]
    return {"schedule": schedule, "measured": med, "predicted": pred, "replicas": s.get("replicas", 1),
            "speedup_measured": med["upper"] / med["stable"],
            "speedup_predicted": pred["no_freeze"] / pred["planned"],
            "avg_freeze_ratio": s["avg_freeze_ratio"],
            "tokens_per_s_stable": s["tokens_per_s"]["stable"], "tokens_per_s_all": s["tokens_per_s"]["all"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schedules", default="1F1B")
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--stable", type=int, default=16)
    ap.add_argument("--r-max", type=float, default=0.8)
    ap.add_argument("--out", default="outputs/bench")
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--dp-shard", type=int, default=1)
    ap.add_argument("--dp-replicate", type=int, default=1)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    global NPROC
    for name in ("dp_shard", "dp_replicate", "tp", "repeats"):
        if getattr(args, name) < 1:
            raise SystemExit(f"error: --{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    NPROC = 2 * args.dp_shard * args.dp_replicate * args.tp
    LAYOUT[:] = ["--parallelism.data_parallel_shard_degree", str(args.dp_shard),
                 "--parallelism.data_parallel_replicate_degree", str(args.dp_replicate),
                 "--parallelism.tensor_parallel_degree", str(args.tp)]
    if args.small:
        LAYOUT.extend(["--training.local_batch_size", "4", "--training.seq_len", "128"])
    out = (ROOT / args.out).resolve()
    scheds = [s.strip() for s in args.schedules.split(",") if s.strip()]
    for s in scheds:
        if s not in CONFIG:
            raise SystemExit(f"error: --schedules: unknown schedule {s!r} (choose from {', '.join(CONFIG)})")
    layout = "".join(f" x {name} {n}" for name, n in (("FSDP", args.dp_shard), ("replicate", args.dp_replicate),
                                                        ("TP", args.tp)) if n > 1)
    size = "seq 128, 4 microbatches" if args.small else "seq 256, 8 microbatches"
    lines = [f"Machine: {os.cpu_count()} CPU cores, torch CPU/gloo, {NPROC} ranks: PP=2{layout}, llama3 debug model, "
             f"{size}; (b) over {args.repeats} run(s) per schedule: median [min, max].", ""]
    if not args.skip_overhead:
        print("(a) hook + profiler overhead at ratio 0 (paired steps)", flush=True)
        res = [overhead(s, args.pairs, out) for s in scheds]
        lines += ["| schedule | pairs | hooks detached step (median ms) | with TimelyFreeze at ratio 0 (median ms) "
                  "| paired mean difference (ms, 95% CI) | overhead |",
                  "|---|---|---|---|---|---|"]
        for r in res:
            lines.append(f"| {r['schedule']} | {r['pairs']} | {r['plain_ms']:.1f} | {r['hooks_ms']:.1f} | "
                         f"{r['diff_ms']:+.1f} ± {r['ci_ms']:.1f} | {r['pct']:+.2f} % |")
        lines.append("")
    print(f"(b) batch time per phase vs the plan (r_max {args.r_max})", flush=True)
    runs = {s: [] for s in scheds}
    for i in range(args.repeats):  # interleaved: run i of every schedule before run i + 1
        for s in scheds:
            runs[s].append(phases(s, args.stable, out, args.r_max, repeat=i))
    lines += ["| schedule | upper: measured / predicted no-freeze (ms) | lower: measured / predicted all-frozen (ms) "
              "| stable: measured / predicted planned (ms) | stable error | speedup measured / predicted "
              "| achieved share of predicted speedup | avg freeze ratio | tokens/s stable |",
              "|---|---|---|---|---|---|---|---|---|"]
    for s in scheds:
        rs = runs[s]

        def agg(f, fmt: str) -> str:
            vals = [f(r) for r in rs]
            if len(vals) == 1:
                return format(vals[0], fmt)
            return f"{format(statistics.median(vals), fmt)} [{format(min(vals), fmt)}, {format(max(vals), fmt)}]"

        def share(r):
            return ((r["speedup_measured"] - 1) / (r["speedup_predicted"] - 1) * 100
                    if r["speedup_predicted"] > 1 else float("nan"))

        m = lambda p: (lambda r: r["measured"][p])  # noqa: E731
        pr = lambda p: (lambda r: r["predicted"][p])  # noqa: E731
        lines.append(
            f"| {s} | {agg(m('upper'), '.0f')} / {agg(pr('no_freeze'), '.0f')} "
            f"| {agg(m('lower'), '.0f')} / {agg(pr('all_frozen'), '.0f')} "
            f"| {agg(m('stable'), '.0f')} / {agg(pr('planned'), '.0f')} "
            f"| {agg(lambda r: 100 * (r['measured']['stable'] - r['predicted']['planned']) / r['predicted']['planned'], '+.1f')} % "
            f"| {agg(lambda r: r['speedup_measured'], '.3f')}x / {agg(lambda r: r['speedup_predicted'], '.3f')}x "
            f"| {agg(share, '.0f')} % | {agg(lambda r: r['avg_freeze_ratio'], '.3f')} "
            f"| {agg(lambda r: r['tokens_per_s_stable'], '.0f')} |")
    text = "\n".join(lines)
    print("\n" + text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_runtime.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
