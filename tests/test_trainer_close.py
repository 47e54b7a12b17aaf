"""``close_runtime``: after a failed ``train()`` the trainer's ``close()`` must not run the summary's
collective (it would wait for the other ranks until the group's timeout and hide the error that ended
the run), and it must close the runtime (flush the trace) whichever way the run ended."""

from __future__ import annotations

import pytest

from timelyfreeze.titan.trainer import close_runtime


class FakeRuntime:
    def __init__(self, refused=False, finish_raises=False):
        self.refused, self.finish_raises = refused, finish_raises
        self.calls = []

    def finish(self):
        self.calls.append("finish")
        if self.finish_raises:
            raise RuntimeError("collective failed")
        return None

    def close(self):
        self.calls.append("close")


def test_a_finished_run_writes_the_summary_then_closes():
    rt = FakeRuntime()
    close_runtime(rt, trained=True)
    assert rt.calls == ["finish", "close"]


def test_a_failed_run_skips_the_collective_summary_and_still_closes():
    rt = FakeRuntime()
    close_runtime(rt, trained=False)
    assert rt.calls == ["close"]


def test_a_refused_resume_keeps_the_earlier_summary():
    rt = FakeRuntime(refused=True)
    close_runtime(rt, trained=True)
    assert rt.calls == ["close"]


def test_the_runtime_is_closed_even_when_the_summary_fails():
    rt = FakeRuntime(finish_raises=True)
    with pytest.raises(RuntimeError):
        close_runtime(rt, trained=True)
    assert rt.calls == ["finish", "close"]
