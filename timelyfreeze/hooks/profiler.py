"""Per-action compute timing and the on-disk trace of ``docs/formats.md``.

``ActionProfiler`` is a stage-hook listener: it times every F/B/I/W action (compute only; receives
and FSDP2's all-gather happen before the hooked call), and DualPipeV's OVERLAP_F_B pairs as one action
each, and remembers the order this rank executed them in. On CPU it uses
``perf_counter`` (Linux: CLOCK_MONOTONIC, one clock for every process of a host) and also records each
action's start time, from which the planner estimates the delays on cross-rank edges (``planner.timing.comm``);
on CUDA it records an event pair per action and places them on the host clock after the step's wait for the
device through the step's anchor event (``timelyfreeze.hooks.step_clock``): start times on both.
``end_step`` turns the step's timings into trace records and appends them to
``actions_rank<r>.jsonl`` (flushed every step, so a crash loses nothing already measured).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from planner.fileio import write_json_atomically
from planner.trace.load import TraceMeta, rank_file_name
from timelyfreeze.hooks.stage_hooks import ActionNames
from timelyfreeze.hooks.step_clock import StepClock


@dataclass(slots=True)
class ActionRecord:
    step: int
    action: str
    ms: float
    phase: str
    freeze_ratio: float
    frozen_tensors: int | None = None
    """Extra field (readers ignore unknown fields): tensors left out, for B/W actions."""
    start_ms: float | None = None
    """Start on the host's monotonic clock (ms): CPU, or CUDA through the step's anchor (``docs/formats.md``)."""

    def to_json(self) -> dict:
        d = {
            "step": self.step,
            "action": self.action,
            "ms": round(self.ms, _MS.k),
            "phase": self.phase,
            "freeze_ratio": round(self.freeze_ratio, _MS.k),
        }
        if self.frozen_tensors is not None:
            d["frozen_tensors"] = self.frozen_tensors
        if self.start_ms is not None:
            d["start_ms"] = round(self.start_ms, _START.k)
        return d

    def to_line(self) -> str:
        """``json.dumps(self.to_json())``, written out directly when every number is a float or an int in a range whose
        rounded ``repr`` :meth:`_Places.text` writes without ``repr`` (json writes a float's ``repr``): the trace gets
        a line per action every step."""
        n = self.frozen_tensors
        if type(self.step) is not int or (n is not None and type(n) is not int):
            return json.dumps(self.to_json())
        ms, ratio = _MS.text(self.ms), _MS.text(self.freeze_ratio)
        start = None if self.start_ms is None else _START.text(self.start_ms)
        if ms is None or ratio is None or (start is None and self.start_ms is not None):
            return json.dumps(self.to_json())
        line = (
            f'{{"step": {self.step!r}, "action": {_quoted(self.action)}, "ms": {ms}, '
            f'"phase": {_quoted(self.phase)}, "freeze_ratio": {ratio}'
        )
        if n is not None:
            line += f', "frozen_tensors": {n!r}'
        if start is not None:
            line += f', "start_ms": {start}'
        return line + "}"


class _Places:
    """The decimal places ``k`` a trace number is rounded to (``to_json``), and the text of the rounded number
    (``to_line``)."""

    def __init__(self, k: int):
        self.k = k
        self._fixed = f".{k}f"
        self._high = 10.0 ** (15 - k)
        """Below it, a float rounded to ``k`` places has at most 15 significant digits."""

    def text(self, x) -> str | None:
        """``repr(round(x, k))`` of a float ``x`` that is 0 or has ``1e-4 <= |x| < 10 ** (15 - k)``; None for anything
        else. ``round`` and the fixed format take the same correctly rounded k-place decimal of ``x``; with at most 15
        significant digits that decimal is the shortest that reads back as the rounded float, so ``repr`` writes its
        digits, in fixed notation from 1e-4 up, with a trailing ``.0`` where it has no fraction. One decimal
        conversion instead of two."""
        if type(x) is not float or not (x == 0.0 or 1e-4 <= abs(x) < self._high):
            return None
        text = format(x, self._fixed).rstrip("0")
        return text + "0" if text[-1] == "." else text


_MS = _Places(6)
"""An action's ms and its freeze ratio."""
_START = _Places(3)
"""An action's start (ms on the host's clock)."""


_QUOTED: dict[str, str] = {}


def _quoted(text: str) -> str:
    """``json.dumps`` of an action or phase name (a handful per run: each is quoted once)."""
    out = _QUOTED.get(text)
    if out is None:
        out = _QUOTED[text] = json.dumps(text)
    return out


class ActionProfiler:
    """Times actions of the stages on this rank; one instance per rank.

    ``pairs`` (``planner.schedule.actions.part_owners``) names the parts of DualPipeV's ``OVERLAP_F_B`` pairs: the
    stage hooks see a pair's forward and backward as two calls (one after the other in torch's own loop,
    in two threads under TorchTitan's overlap callback), and the pair becomes one record once both ended:
    its time is the union of the parts' intervals (the time in which at least one part computed: the sum
    when they ran one after the other, receives between them excluded), its start the earliest part's."""

    def __init__(
        self, rank: int, *, use_cuda: bool, pairs: dict[str, str] | None = None, clock: StepClock | None = None
    ):
        self.rank = rank
        self.use_cuda = use_cuda
        self.clock = clock if clock is not None else StepClock(use_cuda)
        """Where CUDA marks and their host times come from (shared with the step metrics)."""
        self._mark = self.clock.mark
        self.names = ActionNames(pairs)
        """Every call's action name, and its pair's."""
        self._open: dict[tuple[int, str, int], object] = {}
        self._ended: list[tuple[tuple[int, str, int], object, object]] = []
        """``((stage, kind, microbatch), start, end)`` of every action ended since the last :meth:`_settle`: all an
        action's end does during the step (a list's append is atomic, from either of an overlapped pair's threads)."""
        self._parts: dict[str, list[tuple[object, object]]] = {}  # pair -> intervals of its parts ended so far
        self._pending: list[tuple] = []
        """``(action, start, end)`` per plain action, ``(action, [(start, end), ...])`` per pair."""
        self._order: list[str] = []
        self._seen: set[str] = set()

    # -- listener (per action: a timestamp, one tuple and one append) -------------------------
    def before_action(self, stage: int, kind: str, microbatch: int) -> None:
        self._open[(stage, kind, microbatch)] = self._mark() if self.use_cuda else time.perf_counter()

    def after_action(self, stage: int, kind: str, microbatch: int) -> None:
        end = self._mark() if self.use_cuda else time.perf_counter()
        key = (stage, kind, microbatch)
        self._ended.append((key, self._open.pop(key), end))

    def _settle(self) -> None:
        """Name the actions ended so far, join each pair's parts once both ended (the pair then takes its place
        in the order there), and note first runs in :attr:`order`. Runs between steps, off the actions' path."""
        ended, self._ended = self._ended, []
        for key, start, end in ended:
            name, pair = self.names.of(*key)
            if pair is not None:
                name = pair
                intervals = self._parts.pop(name, []) + [(start, end)]
                if len(intervals) < 2:  # the pair's other part is still to come
                    self._parts[name] = intervals
                    continue
                self._pending.append((name, intervals))
            else:
                self._pending.append((name, start, end))
            if name not in self._seen:
                self._seen.add(name)
                self._order.append(name)

    @property
    def order(self) -> list[str]:
        """Actions in the order this rank executed them in the current step (first batch only)."""
        self._settle()
        return self._order

    # -- per step ----------------------------------------------------------------------------
    def collect(self) -> list[tuple[str, float, float | None]]:
        """(action, ms, start ms) of every action timed since the last call, in execution order; the start
        on the host's monotonic clock (with the injected test offset, ``step_clock``). On CUDA this is the
        step's wait for the device (``StepClock.settle``)."""
        self._settle()
        pending, self._pending = self._pending, []
        if self.use_cuda:
            return self._collect_cuda([(p[0], [(p[1], p[2])]) if len(p) == 3 else p for p in pending])
        offset = self.clock.offset_ms
        out = []
        for p in pending:
            if len(p) == 3:  # a plain action: its interval (``_union`` of one is ``end - start``)
                a, s, e = p
                ms, start = (e - s) * 1e3, s * 1e3
            else:
                a, iv = p
                ms, start = _union(iv) * 1e3, min(s for s, _ in iv) * 1e3
            out.append((a, ms, start + offset) if offset else (a, ms, start))
        return out

    def _collect_cuda(self, pending: list) -> list[tuple[str, float, float]]:
        """The CUDA branch of ``collect``: after the step's wait for the device every event has a host time
        through the step's anchor; a pair's time is the union of its parts' intervals, as on CPU."""
        clock = self.clock
        clock.settle()
        out = []
        for a, iv in pending:
            if len(iv) == 1:
                s, e = iv[0]
                out.append((a, clock.ms_between(s, e), clock.start_ms(s)))
            else:
                spans = [(clock.start_ms(s), clock.start_ms(e)) for s, e in iv]
                out.append((a, _union(spans), min(s for s, _ in spans)))
        return out

    def reset_order(self) -> None:
        self._settle()
        self._order = []
        self._seen = set()


def _union(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of ``(start, end)`` intervals (one interval: ``end - start``)."""
    if len(intervals) == 1:
        return intervals[0][1] - intervals[0][0]
    total, reach = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e > reach:
            total += e - max(s, reach)
            reach = e
    return total


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
            self._f.write("".join(r.to_line() + "\n" for r in records))
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


def build_meta(
    schedule: str,
    pp_degree: int,
    num_stages: int,
    num_microbatches: int,
    stage_to_rank: list[int],
    rank_orders: dict[int, list[str]],
    *,
    replicas: int = 1,
    **extra,
) -> dict:
    """``meta.json``'s dict (the planner's ``TraceMeta``: one home for the format), with runtime extras."""
    return TraceMeta(
        schedule,
        pp_degree,
        num_stages,
        num_microbatches,
        list(stage_to_rank),
        {int(r): list(o) for r, o in rank_orders.items()},
        extra=extra,
        replicas=replicas,
    ).to_json()
