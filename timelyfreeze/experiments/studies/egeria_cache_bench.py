"""Egeria's activation cache, measured (issue 31): no freezing, Egeria without the cache and Egeria with it on
the multi-epoch config (``torchtitan_configs/llama3_debug_egeria_epochs_cpu.toml``: 192 samples, 5 epochs,
PP=2, 1F1B, CPU), for several seeds, jobs interleaved (the arm order rotates with the seed) so that slow
periods of the machine spread over every arm.

A seed draws the order of the samples afresh every epoch (dataset ``pystdlib_finetune_fixed192_seed<k>``) and is
``[freeze] seed``; the three arms of one seed see the same samples in the same order.

Per job: tokens/s of every epoch (the epoch's tokens over the summed step times), the validation curve, the final
validation loss, the time to the no-freezing job's final validation loss of the same seed (summed step times up
to the first validation at or below it; validation time not counted; none when never reached), and the cache's
counters. Outputs under ``--out`` (default ``docs/results/egeria-cache``): ``results.jsonl`` (one line per job,
the resume record: a re-run skips what is done) and ``egeria_cache.md`` (median [min, max] over the seeds).
Job dumps go to ``--dumps``.

    python scripts/bench_egeria_cache.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from timelyfreeze.titan import launch
from timelyfreeze.titan.launch import CONFIGS, REPO_ROOT

CONFIG = "llama3_debug_egeria_epochs_cpu.toml"
ARMS = {
    "none": ["--freeze.method", "none"],
    "egeria": ["--freeze.method", "egeria", "--freeze.egeria.no-cache"],
    "egeria_cache": ["--freeze.method", "egeria", "--freeze.egeria.cache"],
}
SAMPLES, BATCH, STEPS = 192, 8, 120
"""The config's set size, batch and steps: 24 steps an epoch, 5 epochs."""


def job_order(seeds: list[int]) -> list[tuple[int, str]]:
    """(seed, arm) in run order: seed by seed, the arms rotated by one more place for every seed."""
    arms = list(ARMS)
    return [(s, arms[(i + k) % len(arms)]) for k, s in enumerate(seeds) for i in range(len(arms))]


def job_args(seed: int, arm: str, steps: int) -> list[str]:
    return [
        "--metrics.no-enable-tensorboard",
        "--training.dataset",
        f"pystdlib_finetune_fixed{SAMPLES}_seed{seed}",
        "--training.steps",
        str(steps),
        "--freeze.seed",
        str(seed),
        *ARMS[arm],
    ]


def analyse(rows: list[dict], summary: dict, steps_per_epoch: int) -> dict:
    """One job's figures from its ``metrics.jsonl`` rows and ``summary.json``."""
    train = [r for r in rows if "step_ms" in r]
    epochs: dict[int, list[dict]] = {}
    for r in train:
        epochs.setdefault((r["step"] - 1) // steps_per_epoch + 1, []).append(r)
    tps = {
        e: sum(r["tokens_per_s"] * r["step_ms"] for r in rs) / sum(r["step_ms"] for r in rs)
        for e, rs in sorted(epochs.items())
    }
    elapsed, t = {}, 0.0
    for r in train:
        t += r["step_ms"]
        elapsed[r["step"]] = t / 1e3
    ms = summary.get("method_summary") or {}
    return {
        "tokens_per_s_epoch": {str(e): v for e, v in tps.items()},
        "val_curve": [[r["step"], r["val_loss"]] for r in rows if "val_loss" in r],
        "elapsed_s": {str(k): v for k, v in elapsed.items()},
        "train_s": t / 1e3,
        "cache": {k: ms.get(k) for k in ("cache_hits", "cache_misses", "cache_peak_mb", "forward_ms_saved")},
        "freeze_events": ms.get("events"),
    }


def time_to(job: dict, target: float) -> float | None:
    """Summed step seconds up to ``job``'s first validation at or below ``target``."""
    for step, loss in job["val_curve"]:
        if loss <= target:
            return job["elapsed_s"].get(str(step))
    return None


def _cell(values: list[float], fmt: str = "{:.1f}") -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    return f"{fmt.format(statistics.median(vals))} [{fmt.format(min(vals))}, {fmt.format(max(vals))}]"


def report(jobs: list[dict], command: str) -> str:
    by = {(j["seed"], j["arm"]): j for j in jobs}
    seeds = sorted({j["seed"] for j in jobs})
    epochs = sorted({e for j in jobs for e in j["tokens_per_s_epoch"]}, key=int)
    lines = [
        "# Egeria's activation cache: no freezing, Egeria, Egeria with the cache",
        "",
        f"Command: `{command}`. Seeds: {', '.join(map(str, seeds))}. Median [min, max] over the seeds.",
        "",
        "| arm | " + " | ".join(f"tokens/s epoch {e}" for e in epochs) + " | final val loss | time to target (s) "
        "| cache hits | forward ms saved |",
        "|---|" + "---|" * (len(epochs) + 4),
    ]
    for arm in ARMS:
        js = [by[(s, arm)] for s in seeds if (s, arm) in by]
        targets = {s: by[(s, "none")]["val_curve"][-1][1] for s in seeds if by.get((s, "none"), {}).get("val_curve")}
        cells = [_cell([j["tokens_per_s_epoch"].get(e) for j in js]) for e in epochs]
        final = _cell([j["val_curve"][-1][1] if j["val_curve"] else None for j in js], "{:.4f}")
        tta = _cell([time_to(j, targets[j["seed"]]) if j["seed"] in targets else None for j in js])
        hits = _cell([j["cache"].get("cache_hits") for j in js], "{:.0f}")
        saved = _cell([j["cache"].get("forward_ms_saved") for j in js])
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {final} | {tta} | {hits} | {saved} |")
    lines += [
        "",
        "Target: the no-freezing job's final validation loss of the same seed. Time: summed step times up to the",
        "first validation at or below it (validation itself not counted). `forward ms saved`: the cache's estimate",
        "(per hit, the mean measured prefix forward of the misses at that boundary less the look-up).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "results" / "egeria-cache")
    ap.add_argument("--dumps", type=Path, default=REPO_ROOT / "outputs" / "bench_egeria_cache")
    ap.add_argument("--dry-run", action="store_true", help="print the job commands and stop")
    opts = ap.parse_args(argv)
    results = opts.out / "results.jsonl"
    done = []
    if results.exists():
        done = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    have = {(j["seed"], j["arm"], j["steps"]) for j in done}
    for seed, arm in job_order(opts.seeds):
        if (seed, arm, opts.steps) in have:
            continue
        dump = opts.dumps / f"{arm}_seed{seed}"
        cmd = launch.torchrun_command(CONFIGS / CONFIG, *job_args(seed, arm, opts.steps), dump_folder=dump)
        if opts.dry_run:
            print(" ".join(cmd))
            continue
        rc = launch.run(cmd, dump / "bench.log")
        if rc != 0:
            print(f"{arm} seed {seed}: job failed (exit {rc}), see {dump / 'bench.log'}")
            return 1
        out = dump / "timelyfreeze"
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
        job = {"seed": seed, "arm": arm, "steps": opts.steps}
        job.update(analyse(rows, json.loads((out / "summary.json").read_text()), SAMPLES // BATCH))
        opts.out.mkdir(parents=True, exist_ok=True)
        with open(results, "a") as f:
            f.write(json.dumps(job) + "\n")
        done.append(job)
        print(f"{arm} seed {seed}: {job['train_s']:.0f} s, tokens/s by epoch {job['tokens_per_s_epoch']}")
    if opts.dry_run:
        return 0
    command = "python scripts/bench_egeria_cache.py --seeds " + " ".join(map(str, opts.seeds))
    if opts.steps != STEPS:
        command += f" --steps {opts.steps}"
    jobs = [j for j in done if j["steps"] == opts.steps and j["seed"] in opts.seeds]
    (opts.out / "egeria_cache.md").write_text(report(jobs, command))
    print(f"wrote {opts.out / 'egeria_cache.md'}")
    return 0
