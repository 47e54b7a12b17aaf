"""Configurations: means over the ok seeds of each (schedule, method, knob value), and the Pareto front
(not dominated in lower loss and higher throughput within its schedule)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any, Iterable, Sequence

from timelyfreeze.experiments.sweep.results import cell_knob, knob_sort_key, throughput

CONFIG_COLUMNS = [
    "schedule",
    "method",
    "knob_name",
    "knob_value",
    "seeds",
    "tokens_per_s",
    "loss",
    "val_acc",
    "avg_freeze_ratio",
    "pareto",
]


def loss_key(rows: Iterable[dict[str, Any]]) -> str:
    """``val_loss`` when any ok job validated, else ``final_loss`` (training loss)."""
    return "val_loss" if any(r.get("val_loss") is not None for r in rows if r["status"] == "ok") else "final_loss"


def pareto_front(points: Sequence[tuple[float, float]]) -> list[bool]:
    """For (throughput, loss) points: True where no other point has throughput >= and loss <= with
    one of them strictly better (ties are all on the front)."""
    flags = []
    for i, (t, loss) in enumerate(points):
        dominated = any(t2 >= t and l2 <= loss and (t2 > t or l2 < loss) for j, (t2, l2) in enumerate(points) if j != i)
        flags.append(not dominated)
    return flags


def aggregate_configs(
    rows: list[dict[str, Any]], which: str = "stable", lkey: str | None = None
) -> list[dict[str, Any]]:
    """Means over the ok seeds of each (schedule, method, knob value), with the Pareto flag per schedule."""
    lkey = lkey or loss_key(rows)
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["status"] == "ok":
            groups[(r["schedule"], r["method"], r["knob_name"], cell_knob(r))].append(r)
    configs = []
    for (schedule, method, kname, kval), rs in groups.items():

        def mean(key_fn):
            vals = [v for v in map(key_fn, rs) if v is not None]
            return statistics.fmean(vals) if vals else None

        configs.append(
            {
                "schedule": schedule,
                "method": method,
                "knob_name": kname,
                "knob_value": kval,
                "seeds": len(rs),
                "tokens_per_s": mean(lambda r: throughput(r, which)),
                "loss": mean(lambda r: r.get(lkey)),
                "val_acc": mean(lambda r: r.get("val_acc")),
                "avg_freeze_ratio": mean(lambda r: r.get("avg_freeze_ratio")),
                "pareto": None,
            }
        )
    for schedule in {c["schedule"] for c in configs}:
        cs = [
            c for c in configs if c["schedule"] == schedule and c["tokens_per_s"] is not None and c["loss"] is not None
        ]
        for c, flag in zip(cs, pareto_front([(c["tokens_per_s"], c["loss"]) for c in cs])):
            c["pareto"] = flag
    return sorted(configs, key=lambda c: (str(c["schedule"]), str(c["method"]), knob_sort_key(c["knob_value"])))
