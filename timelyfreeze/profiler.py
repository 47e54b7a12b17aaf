"""Per-action compute timing and the on-disk trace of ``docs/formats.md``.

``ActionProfiler`` is a stage-hook listener: it times every F/B/I/W action (compute only; receives
happen before the hooked call) and remembers the order this rank executed them in. On CPU it uses
``perf_counter`` (Linux: CLOCK_MONOTONIC, one clock for every process of a host) and also records each
action's start time, from which the planner estimates the delays on cross-rank edges (``planner.comm``);
on CUDA it records an event pair per action and synchronises once per step (durations only).
``end_step`` turns the step's timings into trace records and appends them to
``actions_rank<r>.jsonl`` (flushed every step, so a crash loses nothing already measured).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from planner.fileio import write_json_atomically
from planner.trace import TraceMeta, rank_file_name


@dataclass
class ActionRecord:
    step: int
    action: str
    ms: float
    phase: str
    freeze_ratio: float
    frozen_tensors: int | None = None
    """Extra field (readers ignore unknown fields): tensors left out, for B/W actions."""
    start_ms: float | None = None
    """Start on the host's monotonic clock (ms), CPU timing only (``docs/formats.md``)."""

    def to_json(self) -> dict:
        d = {"step": self.step, "action": self.action, "ms": round(self.ms, 6), "phase": self.phase,
             "freeze_ratio": round(self.freeze_ratio, 6)}
        if self.frozen_tensors is not None:
            d["frozen_tensors"] = self.frozen_tensors
        if self.start_ms is not None:
            d["start_ms"] = round(self.start_ms, 3)
        return d


class ActionProfiler:
    """Times actions of the stages on this rank; one instance per rank."""

    def __init__(self, rank: int, *, use_cuda: bool):
        self.rank = rank
        self.use_cuda = use_cuda
        self._open: dict[tuple[int, str, int], object] = {}
        self._pending: list[tuple[str, object, object]] = []  # (action, start, end)
        self.order: list[str] = []
        """Actions in the order this rank executed them in the current step (first batch only)."""
        self._seen: set[str] = set()

    # -- listener ----------------------------------------------------------------------------
    def before_action(self, stage: int, kind: str, microbatch: int) -> None:
        if self.use_cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._open[(stage, kind, microbatch)] = ev
        else:
            self._open[(stage, kind, microbatch)] = time.perf_counter()

    def after_action(self, stage: int, kind: str, microbatch: int) -> None:
        start = self._open.pop((stage, kind, microbatch))
        if self.use_cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
        else:
            end = time.perf_counter()
        name = f"{stage}{kind}{microbatch}"
        self._pending.append((name, start, end))
        if name not in self._seen:
            self._seen.add(name)
            self.order.append(name)

    # -- per step ----------------------------------------------------------------------------
    def collect(self) -> list[tuple[str, float, float | None]]:
        """(action, ms, start ms or None) of every action timed since the last call, in execution order;
        the start (on the host's monotonic clock) only with CPU timing."""
        if self.use_cuda and self._pending:
            self._pending[-1][2].synchronize()
            out = [(a, s.elapsed_time(e), None) for a, s, e in self._pending]
        else:
            out = [(a, (e - s) * 1e3, s * 1e3) for a, s, e in self._pending]
        self._pending.clear()
        return out

    def reset_order(self) -> None:
        self.order = []
        self._seen = set()


class TraceWriter:
    """Appends one JSON line per action to this rank's file (``actions_rank<r>.jsonl``, or
    ``actions_rank<r>_replica<d>.jsonl`` for data-parallel replica ``d >= 1``); global rank 0 writes
    ``meta.json``."""

    def __init__(self, trace_dir: str | os.PathLike, rank: int, *, replica: int = 0, resume_step: int = 0):
        self.dir = Path(trace_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / rank_file_name(rank, replica)
        if resume_step > 0 and self.path.exists():
            _truncate_after(self.path, resume_step)
        elif resume_step == 0 and self.path.exists():
            self.path.unlink()
        self._f = open(self.path, "a", encoding="utf-8")

    def write(self, records: list[ActionRecord]) -> None:
        if records:
            self._f.write("".join(json.dumps(r.to_json()) + "\n" for r in records))
            self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    @staticmethod
    def write_meta(trace_dir: str | os.PathLike, meta: dict) -> None:
        write_json_atomically(Path(trace_dir) / "meta.json", meta)


def _truncate_after(path: Path, step: int) -> None:
    """Keep only the records of steps <= ``step`` (a resumed run re-does the later ones)."""
    keep = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                if json.loads(line)["step"] <= step:
                    keep.append(line)
            except (ValueError, KeyError, TypeError):
                continue
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(keep))
    os.replace(tmp, path)


def build_meta(schedule: str, pp_degree: int, num_stages: int, num_microbatches: int,
               stage_to_rank: list[int], rank_orders: dict[int, list[str]], *, replicas: int = 1,
               **extra) -> dict:
    """``meta.json``'s dict (the planner's ``TraceMeta``: one home for the format), with runtime extras."""
    return TraceMeta(schedule, pp_degree, num_stages, num_microbatches, list(stage_to_rank),
                     {int(r): list(o) for r, o in rank_orders.items()}, extra=extra, replicas=replicas).to_json()
