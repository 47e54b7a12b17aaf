"""The CUDA timing path's arithmetic on CPU, with a fake event class and a fake device: anchor-based start
times, device-time batch and step lengths, one synchronisation per step; and the CPU path unchanged."""

from __future__ import annotations

import pytest
import torch

from timelyfreeze.hooks.profiler import ActionProfiler
from timelyfreeze.hooks.step_clock import OFFSET_ENV, StepClock, injected_offset_ms
from timelyfreeze.job.errors import FreezeConfigError


class FakeDevice:
    """One stream: work is enqueued by the host (``run``) and executes in order, later than it was
    enqueued while the device is behind; ``host_s`` is the host clock (seconds)."""

    def __init__(self, lag_s: float):
        self.host_s = 100.0
        self.device_free_s = self.host_s + lag_s  # the device is still busy with earlier work
        self.syncs = 0

    def run(self, seconds: float) -> None:
        """Enqueue a kernel of ``seconds`` (the host moves on at once)."""
        self.device_free_s = max(self.device_free_s, self.host_s) + seconds
        self.host_s += 1e-5

    def event_class(self):
        dev = self

        class Event:
            def __init__(self, enable_timing: bool = False):
                assert enable_timing
                self.t = None

            def record(self):
                self.t = max(dev.device_free_s, dev.host_s)  # runs when the stream reaches it

            def query(self) -> bool:  # done once the host's clock has reached the time it ran
                return dev.host_s >= self.t

            def synchronize(self):
                dev.syncs += 1
                dev.host_s = max(dev.host_s, self.t)

            def elapsed_time(self, other) -> float:
                return (other.t - self.t) * 1e3

        return Event

    def now(self) -> float:
        return self.host_s


def test_cuda_start_times_come_from_the_anchor_and_one_sync():
    dev = FakeDevice(lag_s=0.5)  # the previous step's optimizer still runs when this step is enqueued
    clock = StepClock(True, event=dev.event_class(), now=dev.now)
    prof = ActionProfiler(0, use_cuda=True, clock=clock)
    clock.begin_step()
    t0 = clock.mark()
    first_device_start = dev.device_free_s
    prof.before_action(0, "F", 0)
    dev.run(0.010)
    prof.after_action(0, "F", 0)
    prof.before_action(0, "B", 0)
    dev.run(0.030)
    prof.after_action(0, "B", 0)
    t1 = clock.mark()
    assert dev.syncs == 0  # nothing synchronises inside the pipeline
    out = prof.collect()
    assert dev.syncs == 1
    (fa, fms, fstart), (ba, bms, bstart) = out
    assert (fa, ba) == ("0F0", "0B0")
    assert fms == pytest.approx(10.0) and bms == pytest.approx(30.0)
    # host times: where the device ran them (host clock), not where the host enqueued them
    assert fstart == pytest.approx(first_device_start * 1e3)
    assert bstart == pytest.approx(fstart + 10.0)
    assert clock.anchor_slack_ms == pytest.approx(500.0, abs=1e-3)
    assert clock.seconds(t0, t1) == pytest.approx(0.040)
    clock.settle()
    assert dev.syncs == 1  # settled once per step


def test_cuda_pair_is_the_union_of_its_parts():
    dev = FakeDevice(lag_s=0.0)
    clock = StepClock(True, event=dev.event_class(), now=dev.now)
    pair = "(0F1;3B0)OVERLAP_F_B"
    prof = ActionProfiler(0, use_cuda=True, pairs={"0F1": pair, "3B0": pair}, clock=clock)
    clock.begin_step()
    prof.before_action(0, "F", 1)
    dev.run(0.004)
    prof.after_action(0, "F", 1)
    dev.run(0.002)  # a receive between the parts: not the pair's compute
    prof.before_action(3, "B", 0)
    dev.run(0.006)
    prof.after_action(3, "B", 0)
    [(a, ms, start)] = prof.collect()
    assert a == pair and ms == pytest.approx(10.0)


def test_step_metrics_read_device_time(monkeypatch):
    from timelyfreeze.outputs.metrics_row import StepMetrics

    dev = FakeDevice(lag_s=0.0)
    clock = StepClock(True, event=dev.event_class(), now=dev.now)
    meter = StepMetrics.__new__(StepMetrics)  # the marks only: no process group needed
    meter.clock, meter._stage_of, meter.trainable = clock, {}, {}
    meter.begin(1e-3)
    a = clock.mark()
    dev.run(0.020)  # the host enqueues in 10 us; the device takes 20 ms
    meter.add_batch((a, clock.mark()), None)
    dev.run(0.005)  # the optimizer step
    meter.end()
    got = meter.local([], 1)
    assert got["batch_s"] == pytest.approx(0.020) and got["step_s"] == pytest.approx(0.025)
    assert dev.syncs == 1


def test_cpu_path_is_perf_counter_and_the_offset_shifts_starts(monkeypatch):
    ticks = iter([1.0, 1.25, 2.0, 2.5])
    clock = StepClock(False, now=lambda: next(ticks))
    assert clock.seconds(clock.mark(), clock.mark()) == 0.25
    prof = ActionProfiler(0, use_cuda=False)
    prof.before_action(0, "F", 0)
    prof.after_action(0, "F", 0)
    [(_, ms, start)] = prof.collect()
    monkeypatch.setenv(OFFSET_ENV, "250")
    shifted = ActionProfiler(0, use_cuda=False)
    assert shifted.clock.offset_ms == 250.0
    shifted._pending = [("0F0", 1.0, 1.5)]
    assert shifted.collect() == [("0F0", 500.0, 1250.0)]


@pytest.mark.parametrize("raw", ["abc", "nan", "inf"])
def test_bad_offset_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv(OFFSET_ENV, raw)
    with pytest.raises(FreezeConfigError, match=OFFSET_ENV):
        injected_offset_ms()


def test_the_steps_losses_are_read_back_once():
    """The batches' loss tensors (on the device, on CUDA) come back to the host in one copy, not one each;
    the sum is the one per-batch reads gave."""
    from timelyfreeze.outputs.metrics_row import StepMetrics

    reads = []

    class Counted(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func in (torch.Tensor.__float__, torch.Tensor.item, torch.Tensor.tolist):
                reads.append(func.__name__)
            return super().__torch_function__(func, types, args, kwargs or {})

    meter = StepMetrics.__new__(StepMetrics)  # the marks only: no process group needed
    meter.clock, meter._stage_of, meter.trainable = StepClock(False), {}, {}
    meter.begin(1e-3)
    losses = [torch.tensor(x, dtype=torch.float32) for x in (0.1, 2.3, 4.7)]
    for x in losses:
        meter.add_batch(1.0, x.as_subclass(Counted))
    meter.end()
    assert meter.local([], 3)["loss"] == sum(float(x) for x in losses)
    assert len(reads) == 1
