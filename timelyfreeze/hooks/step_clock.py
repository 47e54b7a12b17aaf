"""Timestamps of one step on this rank's host clock, from the CPU's clock or from CUDA events.

The profiler (every action's start and length) and the step metrics (each batch's and the step's time) take
their timestamps here, so both read the same clock the same way:

* **CPU**: a mark is ``time.perf_counter()`` (Linux: ``CLOCK_MONOTONIC``, one clock for every process of a
  host); a start in ms is ``mark * 1e3``, a length ``end - start``. These are exactly the figures the runtime
  always recorded.
* **CUDA**: a mark is a CUDA event recorded on the current stream (no synchronisation). The first mark of a
  step is preceded by the step's *anchor* event. ``settle`` synchronises the step's last mark once, at the end
  of the step (the runtime's one wait for the device in a step, ``docs/runtime.md``), reads the host clock
  ``t_sync`` right after,
  and places the anchor on the host clock at ``t_sync - anchor.elapsed_time(last)``: the last mark completed at
  or just before ``t_sync`` (by the wake-up latency of the synchronisation, microseconds), and the device's
  elapsed times are exact between events. An action then starts at
  ``anchor_host_ms + anchor.elapsed_time(start_event)`` and lasts ``start.elapsed_time(end)``; a batch or step
  lasts the device time between its marks, which includes the GPU's tail that host timing misses on NCCL.
  The host time taken right after recording the anchor is kept too (``anchor_slack_ms``: how much later the
  anchor ran than it was enqueued; a lower bound on its place), as a check.

The CUDA path has been written to run on a GPU but has **not run on one** (no GPU was at hand): its arithmetic
is tested on CPU with a fake event class (``tests/test_step_clock.py``), injected through ``event``.

``TIMELYFREEZE_CLOCK_OFFSET_MS`` (tests only) shifts every host timestamp of this process by that many
milliseconds: a stand-in for another host's clock (``timelyfreeze.runtime.clock_sync``).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any

from timelyfreeze.job.errors import FreezeConfigError

OFFSET_ENV = "TIMELYFREEZE_CLOCK_OFFSET_MS"


def injected_offset_ms() -> float:
    """The test offset of ``TIMELYFREEZE_CLOCK_OFFSET_MS`` (0 when unset); a bad value is a config error."""
    raw = os.environ.get(OFFSET_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise FreezeConfigError(f"environment variable {OFFSET_ENV} = {raw!r}: must be a finite number of ms")
    return value


def host_ms(now: Callable[[], float] = time.perf_counter) -> float:
    """This process's host clock in ms, shifted by the injected test offset (if any)."""
    return now() * 1e3 + injected_offset_ms()


class StepClock:
    """Marks and their host times for one rank (module docstring). ``event``: the CUDA event class
    (``torch.cuda.Event`` by default on CUDA; a fake one in tests); ``now``: the host clock in seconds."""

    def __init__(self, use_cuda: bool, *, event: Any = None, now: Callable[[], float] = time.perf_counter):
        self.use_cuda = use_cuda
        self.now = now
        self.offset_ms = injected_offset_ms()
        if use_cuda and event is None:
            import torch  # only where CUDA timing is on: this module stays importable without torch's CUDA

            event = torch.cuda.Event
        self._event = event
        self._anchor: Any = None
        self._enqueued_s = 0.0
        self._last: Any = None
        self._anchor_ms: float | None = None
        self.anchor_slack_ms: float | None = None
        """CUDA: how much later the last settled anchor ran than it was enqueued (ms); None before one."""

    def begin_step(self) -> None:
        """A new step: on CUDA, its anchor is recorded at the next mark (nothing on CPU)."""
        self._anchor = None
        self._anchor_ms = None

    def mark(self) -> Any:
        """A point in time: ``perf_counter()`` on CPU, a recorded CUDA event on CUDA (no synchronisation)."""
        if not self.use_cuda:
            return self.now()
        if self._anchor is None:
            self._anchor = self._record()
            self._enqueued_s = self.now()
        ev = self._last = self._record()
        return ev

    def _record(self) -> Any:
        ev = self._event(enable_timing=True)
        ev.record()
        return ev

    def settle(self) -> None:
        """CUDA: wait for the step's last mark (the step's wait for the device) and place its anchor on the
        host clock; again in the same step it does nothing. Nothing on CPU."""
        if not self.use_cuda or self._anchor is None or self._anchor_ms is not None:
            return
        self._last.synchronize()
        t_sync_ms = self.now() * 1e3
        self._anchor_ms = t_sync_ms - self._anchor.elapsed_time(self._last)
        self.anchor_slack_ms = self._anchor_ms - self._enqueued_s * 1e3

    def start_ms(self, mark: Any) -> float:
        """Host time (ms, with the injected offset) of a mark; on CUDA only after ``settle``."""
        if not self.use_cuda:
            ms = mark * 1e3
        else:
            if self._anchor_ms is None:
                raise RuntimeError("StepClock.start_ms on CUDA before settle()")
            ms = self._anchor_ms + self._anchor.elapsed_time(mark)
        return ms + self.offset_ms if self.offset_ms else ms

    def seconds(self, start: Any, end: Any) -> float:
        """Time between two marks (s); on CUDA only after ``settle``."""
        if not self.use_cuda:
            return end - start
        return start.elapsed_time(end) / 1e3

    def ms_between(self, start: Any, end: Any) -> float:
        """Time between two marks (ms); on CPU ``(end - start) * 1e3`` as the profiler always computed it."""
        if not self.use_cuda:
            return (end - start) * 1e3
        return start.elapsed_time(end)
