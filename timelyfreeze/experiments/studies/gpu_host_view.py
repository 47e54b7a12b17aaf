"""The GPU check's test of recorded start times against the host's view (parts (d) and (e) of
``gpu_check``): does a CUDA action start when the profiler says it did, even when the host runs ahead?

On CUDA the profiler marks an action with an event on the compute stream and places it on the host clock after
the step's one synchronisation (``timelyfreeze.hooks.step_clock``). Were it the host's clock at the call instead,
a host that runs ahead of the GPU (NCCL: nothing blocks it until the step's end) would record the time the work
was *enqueued*, too early. The host sees bounds of each action's true start without the events' timing: a
polling thread asks the start mark whether it has completed (``Event.query``), again and again:

* ``pending_ms``: the host clock just before the last query that found the mark *not* completed (the time it was
  enqueued, when no query did): the GPU started the action later;
* ``seen_ms``: the host clock just after the first query that found it completed: the GPU started it earlier.

The bounds are as tight as the polling (0.1 ms, and the GIL's switch interval, set to 0.5 ms in the worker).
``check_start_times`` requires every recorded start inside ``[pending_ms, seen_ms]`` (``TOL_MS`` either side) and,
per rank and step, starts in the order the host enqueued them (one stream). A profiler that took the host's clock
at the call would record ``enqueued_ms`` and fail wherever the GPU was behind. The claim is *tested* only where the
host did run ahead: some start mark still pending ``RUN_AHEAD_MS`` after it was enqueued (the host's own
measurement, not the recorded start's). To make sure the host runs ahead, the worker puts ``SLEEP_MS`` of GPU-only
work (``torch.cuda._sleep``) before each step's first action.

The worker, ``python -m timelyfreeze.experiments.studies.gpu_host_view <train arguments>`` under torchrun, is the
trainer (``timelyfreeze.train``) with ``HostViewRecorder`` attached to its profiler: every rank appends one row per
action (``HostView``) to ``host_view_rank<r>.jsonl`` in the folder named by ``HOST_VIEW_ENV``. The library is
unchanged; only this process's ``ActionProfiler`` class is wrapped. On CPU the same recorder needs no thread: the
start mark is the host clock, read between the two bounds (``tests/test_gpu_check.py``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from timelyfreeze.hooks.step_clock import host_ms

HOST_VIEW_ENV = "TIMELYFREEZE_HOST_VIEW_DIR"
"""The folder the worker writes its rows to (one file per rank)."""
TOL_MS = 0.5
"""Slack either side of the host's bounds (ms): the anchor is placed after the synchronisation's wake-up
(microseconds late), and start times are rounded to a microsecond."""
RUN_AHEAD_MS = 2.0
"""The host ran ahead when some action started at least this long after it was enqueued (ms)."""
SLEEP_MS = 20.0
"""GPU-only work put before each step's first action on CUDA, so the host is that far ahead (ms)."""
WAIT_SEEN_S = 2.0
"""How long a step's end waits for the poller to see its (already completed) start marks."""


@dataclass(frozen=True)
class HostView:
    """One action as the profiler recorded it and as the host saw it (ms on the host clock)."""

    rank: int
    step: int
    """The profiler's collect count on this rank (1, 2, ...: one per training step)."""
    action: str
    start_ms: float
    ms: float
    enqueued_ms: float
    pending_ms: float
    """The last host time the start mark was found not completed (``enqueued_ms`` when never)."""
    seen_ms: float | None
    """None: the poller did not see the start mark complete within ``WAIT_SEEN_S``."""


@dataclass(frozen=True)
class StartTimeCheck:
    """The verdict of ``check_start_times``: ``ok`` (no row broke a bound), ``tested`` (the host ran ahead, so the
    rows could tell host times from device times); up to 5 examples of each kind of failure."""

    actions: int
    early: tuple[str, ...]
    late: tuple[str, ...]
    unseen: tuple[str, ...]
    out_of_order: tuple[str, ...]
    max_lead_ms: float
    """The largest ``pending_ms - enqueued_ms``: how far the host saw itself ahead of the GPU."""

    @property
    def ok(self) -> bool:
        return self.actions > 0 and not (self.early or self.late or self.unseen or self.out_of_order)

    @property
    def tested(self) -> bool:
        return self.ok and self.max_lead_ms >= RUN_AHEAD_MS

    def line(self) -> str:
        if not self.actions:
            return "start times: FAILED: no rows of the host's view were written"
        if not self.ok:
            bad = {"before the GPU started": self.early, "after seen": self.late, "never seen": self.unseen,
                   "out of enqueue order": self.out_of_order}  # fmt: skip
            return "start times: FAILED: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in bad.items() if v)
        if not self.tested:
            return (f"start times: consistent but NOT TESTED: the host never ran ahead by {RUN_AHEAD_MS} ms "
                    f"(largest lead {self.max_lead_ms:.2f} ms over {self.actions} actions)")  # fmt: skip
        return (f"start times: OK: {self.actions} actions inside the host's bounds, the host up to "
                f"{self.max_lead_ms:.1f} ms ahead of the GPU")  # fmt: skip

    def to_json(self) -> dict:
        return {**asdict(self), "ok": self.ok, "tested": self.tested, "line": self.line()}


def check_start_times(rows: Iterable[HostView], tol_ms: float = TOL_MS) -> StartTimeCheck:
    """Every recorded start inside the host's bounds, and in enqueue order per (rank, step) (module docstring)."""
    rows = list(rows)
    early, late, unseen, order = [], [], [], []
    lead = float("-inf")
    by_step: dict[tuple[int, int], list[HostView]] = {}
    for r in rows:
        where = f"rank {r.rank} step {r.step} {r.action}"
        lead = max(lead, r.pending_ms - r.enqueued_ms)
        if r.start_ms < r.pending_ms - tol_ms:
            early.append(f"{where} ({r.pending_ms - r.start_ms:.3f} ms)")
        if r.seen_ms is None:
            unseen.append(where)
        elif r.start_ms > r.seen_ms + tol_ms:
            late.append(f"{where} ({r.start_ms - r.seen_ms:.3f} ms)")
        by_step.setdefault((r.rank, r.step), []).append(r)
    for (rank, step), rs in sorted(by_step.items()):
        rs = sorted(rs, key=lambda r: r.enqueued_ms)
        for a, b in zip(rs, rs[1:]):
            if b.start_ms < a.start_ms - tol_ms:
                order.append(f"rank {rank} step {step} {b.action} before {a.action}")
    return StartTimeCheck(len(rows), *(tuple(x[:5]) for x in (early, late, unseen, order)),
                          max_lead_ms=lead if rows else 0.0)  # fmt: skip


def load_host_view(folder: Path) -> list[HostView]:
    """Every rank's rows in ``folder`` (none when it is missing)."""
    rows: list[HostView] = []
    for path in sorted(Path(folder).glob("host_view_rank*.jsonl")):
        rows += [HostView(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    return rows


class _Enqueued:
    __slots__ = ("name", "enqueued_ms", "mark", "pending_ms", "seen_ms")

    def __init__(self, name: str, enqueued_ms: float, mark: Any, seen_ms: float | None):
        self.name, self.enqueued_ms, self.mark, self.seen_ms = name, enqueued_ms, mark, seen_ms
        self.pending_ms = enqueued_ms


class _Poller:
    """Stamps each watched CUDA event with the host clock: the last time it found it pending, and the first time
    it found it completed; ``thread``: in a daemon thread of its own, every 0.1 ms (else only at ``poll_once``)."""

    def __init__(self, now: Callable[[], float], thread: bool = True):
        self.now, self._items, self._lock, self.thread = now, [], threading.Lock(), thread
        if thread:
            threading.Thread(target=self._loop, daemon=True, name="host-view-poller").start()

    def watch(self, entry: _Enqueued) -> None:
        with self._lock:
            self._items.append(entry)

    def poll_once(self) -> None:
        with self._lock:
            items = self._items = [e for e in self._items if e.seen_ms is None]
        for e in items:
            before = self.now()
            if e.mark.query():
                e.seen_ms = self.now()
            else:
                e.pending_ms = before

    def _loop(self) -> None:
        while True:
            self.poll_once()
            time.sleep(1e-4)


class HostViewRecorder:
    """Wraps one ``ActionProfiler`` (``attach``) or every one this process makes (``install``): notes the host's
    bounds of each action's start and writes them with the recorded start at each ``collect``.
    ``run_ahead``: called before each step's first action (the worker's GPU sleep); ``now``: the host clock (ms);
    ``poll_thread``: False polls CUDA marks only when ``poll`` is called (tests, with fake events)."""

    def __init__(self, folder: Path, rank: int, *, now: Callable[[], float] = host_ms,
                 run_ahead: Callable[[], None] | None = None, poll_thread: bool = True):  # fmt: skip
        self.path = Path(folder) / f"host_view_rank{rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        self.rank, self.now, self.run_ahead = rank, now, run_ahead
        self.step = 0
        self._pending: list[_Enqueued] = []
        self._poll_thread = poll_thread
        self._poller: _Poller | None = None

    def poll(self) -> None:
        """One pass over the CUDA marks not yet seen completed (the thread's work, when there is none)."""
        if self._poller is not None:
            self._poller.poll_once()

    def install(self) -> None:
        from timelyfreeze.hooks.profiler import ActionProfiler

        init, recorder = ActionProfiler.__init__, self

        def __init__(prof, *args, **kwargs):
            init(prof, *args, **kwargs)
            recorder.attach(prof)

        ActionProfiler.__init__ = __init__

    def attach(self, prof) -> None:
        before, collect = prof.before_action, prof.collect

        def before_action(stage: int, kind: str, microbatch: int) -> None:
            if not self._pending and self.run_ahead is not None:
                self.run_ahead()
            t = self.now()
            before(stage, kind, microbatch)
            name, pair = prof.names.of(stage, kind, microbatch)
            entry = _Enqueued(pair or name, t, prof._open[(stage, kind, microbatch)], None)
            self._pending.append(entry)
            if prof.use_cuda:
                if self._poller is None:
                    self._poller = _Poller(self.now, self._poll_thread)
                self._poller.watch(entry)
            else:  # the start mark is the host clock, read inside ``before``
                entry.seen_ms = self.now()

        def collect_and_write():
            out = collect()
            entries, self._pending = self._pending, []
            deadline = time.monotonic() + WAIT_SEEN_S
            while any(e.seen_ms is None for e in entries) and time.monotonic() < deadline:
                self.poll() if not self._poll_thread else time.sleep(1e-3)
            self.step += 1
            self._write(out, entries, set(prof.names.pairs.values()))
            return out

        prof.before_action, prof.collect = before_action, collect_and_write

    def _write(self, out: list, entries: list[_Enqueued], pair_names: set[str]) -> None:
        by_name: dict[str, list[_Enqueued]] = {}
        for e in entries:
            by_name.setdefault(e.name, []).append(e)
        rows = []
        for action, ms, start in out:
            parts = [by_name[action].pop(0) for _ in range(2 if action in pair_names else 1)]
            seen = [p.seen_ms for p in parts]
            rows.append(HostView(self.rank, self.step, action, start, ms, min(p.enqueued_ms for p in parts),
                                 min(p.pending_ms for p in parts), None if None in seen else min(seen)))  # fmt: skip
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(asdict(r)) + "\n" for r in rows))


def _gpu_sleep(ms: float) -> Callable[[], None]:
    """``torch.cuda._sleep`` of about ``ms`` on the current stream, its cycles per ms measured once here."""
    import torch

    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(10**7)
    b.record()
    b.synchronize()
    cycles = int(ms * 10**7 / max(a.elapsed_time(b), 1e-3))
    return lambda: torch.cuda._sleep(cycles)


def worker() -> None:
    """The trainer with a recorder on its profiler (module docstring); argv is the trainer's."""
    import sys

    import torch

    from timelyfreeze.train import main as train_main

    sys.setswitchinterval(5e-4)  # the poller sees an event at most this much later than it could
    run_ahead = None
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        run_ahead = _gpu_sleep(SLEEP_MS)
    HostViewRecorder(Path(os.environ[HOST_VIEW_ENV]), int(os.environ.get("RANK", "0")), run_ahead=run_ahead).install()
    train_main()


if __name__ == "__main__":
    worker()
