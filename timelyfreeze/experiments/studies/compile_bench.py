"""The compile benchmark: does freezing keep its speed-up under ``torch.compile``, and what do block units cost?

Five cells on the embedded default (llama3 debug model, PP=2, 1F1B, CPU), ``--repeats`` runs each, job order
interleaved (repeat by repeat, every cell once) so that slow periods of the machine spread over every cell;
one result line per job, written as it finishes (a re-run skips what is done):

* ``eager_none`` / ``compiled_none``: ``[freeze] method = "none"`` (profiler only), without / with ``[compile]``;
* ``eager_tensor`` / ``eager_block``: TimelyFreeze with ``unit = "tensor"`` / ``"block"``, eager;
* ``compiled_block``: TimelyFreeze under ``[compile]`` (``unit = "auto"``, so ``block``).

Repeat ``k`` seeds the model and the masks with ``k`` (``--debug.seed``, ``--freeze.seed``), so the cells of
one repeat start from the same weights and see the same batches. Per job: the median batch time of the
stable steps (the same step range for the ``none`` cells), the in-run speed-up (upper-bound median / stable
median), the plan's predicted speed-up, the share of it achieved, the same share with the machine's speed
taken out (the F factor: median F-action time of the stable steps / of the upper-bound steps; forward
actions never change with freezing), the last validation loss and, under compile, the graphs compiled
after the warm-up. ``report`` writes median [min, max] per cell and the paired (same repeat) differences
block - tensor of the validation loss.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from planner.schedule.actions import action_kind
from planner.trace.archive import TRACE_NAME
from planner.trace.load import load_trace
from timelyfreeze.experiments.runtime.bench import BenchError, torchrun
from timelyfreeze.experiments.runtime.report import agg, write_csv
from timelyfreeze.titan.launch import REPO_ROOT

CONFIG = "llama3_debug_1f1b_cpu.toml"
CELLS: dict[str, list[str]] = {
    "eager_none": ["--freeze.method", "none"],
    "eager_tensor": ["--freeze.unit", "tensor"],
    "eager_block": ["--freeze.unit", "block"],
    "compiled_none": ["--freeze.method", "none", "--compile.enable"],
    "compiled_block": ["--compile.enable"],
}
STABLE_FROM = 18
"""First stable step of the embedded default (warm-up 3, monitoring 4 + 4, ramp 6)."""


def _f_median(dump: Path, steps: range) -> float:
    """Median F-action time over ``steps``, all ranks (the trace folder, or its trace.tar.gz once packed)."""
    trace = load_trace(dump / "timelyfreeze" / TRACE_NAME)
    return statistics.median(r.ms for r in trace.records if r.step in steps and action_kind(r.action) == "F")


def job(cell: str, repeat: int, dump: Path) -> dict:
    steps = 32
    torchrun(
        ["-m", "timelyfreeze.train"],
        CONFIG,
        dump,
        2,
        [],
        [
            *CELLS[cell],
            "--debug.seed",
            str(repeat),
            "--freeze.seed",
            str(repeat),
            "--training.steps",
            str(steps),
            "--validation.enable",
            "--validation.freq",
            str(steps),
        ],
    )
    out = dump / "timelyfreeze"
    s = json.loads((out / "summary.json").read_text())
    if s["failures"]:  # a run that survived a failure (e.g. no plan) is a failed job: not recorded, re-run on resume
        raise BenchError(f"the run reported a failure: {s['failures'][0]} ({dump})")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    batch = {m["step"]: m["batch_ms"] for m in rows if "batch_ms" in m}
    res = {
        "stable_ms": statistics.median(batch[k] for k in range(STABLE_FROM, steps + 1)),
        "val_loss": s.get("val_loss"),
        "avg_freeze_ratio": s["avg_freeze_ratio"],
        "graphs_after_warmup": None,
        "graphs": None,
    }
    if "compile" in s:
        res["graphs"] = max(s["compile"]["graphs"])
        res["graphs_after_warmup"] = max(g or 0 for g in s["compile"]["graphs_after_warmup"])
    pred = s.get("predicted_batch_ms")
    if pred:
        upper = s["phases"]["upper"]
        res["upper_ms"] = statistics.median(batch[k] for k in range(upper[0], upper[1] + 1))
        res["speedup"] = res["upper_ms"] / res["stable_ms"]
        res["speedup_predicted"] = pred["no_freeze"] / pred["planned"]
        res["share"] = (res["speedup"] - 1) / (res["speedup_predicted"] - 1)
        res["f_factor"] = _f_median(dump, range(STABLE_FROM, steps + 1)) / _f_median(
            dump, range(upper[0], upper[1] + 1)
        )
        res["share_f"] = (res["speedup"] * res["f_factor"] - 1) / (res["speedup_predicted"] - 1)
    return res


def report(rows: list[dict]) -> str:
    lines = [
        "| cell | n | stable batch (ms) | speed-up over own upper bound | predicted | share of predicted | "
        "share, F factor out | F factor | val loss | avg freeze ratio | graphs after warm-up |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in CELLS:
        rs = [r for r in rows if r["cell"] == cell]
        g = lambda k, fmt: agg([r.get(k) for r in rs], fmt)  # noqa: E731
        lines.append(
            f"| {cell} | {len(rs)} | {g('stable_ms', '.0f')} | {g('speedup', '.3f')} | "
            f"{g('speedup_predicted', '.3f')} | {g('share', '.2f')} | {g('share_f', '.2f')} | "
            f"{g('f_factor', '.3f')} | {g('val_loss', '.3f')} | {g('avg_freeze_ratio', '.3f')} | "
            f"{g('graphs_after_warmup', '.0f')} |"
        )
    by = {(r["cell"], r["repeat"]): r for r in rows}
    seeds = sorted({r["repeat"] for r in rows})

    def paired(cell: str, base: str, value) -> list[float]:
        """``value(cell's row, base's row)`` for every seed that has both."""
        return [value(by[(cell, k)], by[(base, k)]) for k in seeds if (cell, k) in by and (base, k) in by]

    diffs = paired("eager_block", "eager_tensor", lambda a, b: a["val_loss"] - b["val_loss"])
    if diffs:
        per_seed = ", ".join(f"{d:+.3f}" for d in diffs)
        lines += [
            "",
            f"Validation loss, block - tensor at the same seed (eager, r_max 0.8): {agg(diffs, '+.3f')} "
            f"(n = {len(diffs)}; per seed: {per_seed})",
        ]

    def speed_up(freezing: dict, none: dict) -> float:
        return none["stable_ms"] / freezing["stable_ms"]

    for cell, base in (
        ("eager_tensor", "eager_none"),
        ("eager_block", "eager_none"),
        ("compiled_block", "compiled_none"),
    ):
        pair = paired(cell, base, speed_up)
        if pair:
            lines += [
                "",
                f"Speed-up of {cell} over {base} at the same seed (stable batch): {agg(pair, '.3f')} (n = {len(pair)})",
            ]
    ratios = paired("compiled_none", "eager_none", lambda a, b: a["stable_ms"] / b["stable_ms"])
    if ratios:
        lines += [
            "",
            "Compile effect without freezing, compiled / eager stable batch time at the same seed: "
            f"{agg(ratios, '.3f')} (n = {len(ratios)})",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "results" / "compile")
    ap.add_argument("--dumps", type=Path, default=REPO_ROOT / "outputs" / "bench_compile")
    ap.add_argument("--cells", default=",".join(CELLS))
    opts = ap.parse_args(argv)
    cells = [c.strip() for c in opts.cells.split(",") if c.strip()]
    bad = [c for c in cells if c not in CELLS]
    if bad or opts.repeats < 1:
        print(
            f"error: --cells: unknown cell {bad[0]!r} (choose from {', '.join(CELLS)})"
            if bad
            else f"error: --repeats {opts.repeats}: must be >= 1",
            file=sys.stderr,
        )
        return 2
    opts.out.mkdir(parents=True, exist_ok=True)
    path = opts.out / "results.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    done = {(r["cell"], r["repeat"]) for r in rows}
    todo = [(c, k) for k in range(opts.repeats) for c in cells if (c, k) not in done]
    for i, (cell, k) in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}] {cell} repeat {k}", flush=True)
        try:
            row = {"cell": cell, "repeat": k, **job(cell, k, opts.dumps / f"{cell}_{k}")}
        except BenchError as e:
            print(f"  FAILED: {e}", flush=True)
            continue
        rows.append(row)
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
    write_csv(rows, opts.out / "bench_compile.csv")
    (opts.out / "bench_compile.md").write_text(report(rows) + "\n")
    print(report(rows))
    return 0
