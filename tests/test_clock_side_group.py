"""The gloo side group of the clocks: made only where ranks span clocks, with a deadline, and a failure to
connect is one error naming GLOO_SOCKET_IFNAME (in-process, a world-size-1 gloo group)."""

from __future__ import annotations

import json

import pytest
import torch.distributed as dist

from tests.single_rank import process_group  # noqa: F401 (autouse fixture)
from timelyfreeze.job.errors import FreezeConfigError
from timelyfreeze.runtime import clock_sync
from timelyfreeze.runtime.clock_sync import ClockSync, gather_records, side_group


def _no_new_group(*args, **kwargs):
    raise AssertionError("a gloo side group was made for one clock")


def test_one_clock_makes_no_side_group_and_uses_the_default_group(monkeypatch, tmp_path):
    monkeypatch.setattr(dist, "new_group", _no_new_group)
    assert side_group(["boot-a", "boot-a", "boot-a"]) is None
    clocks = ClockSync([(0, 0)])
    assert clocks.group is None and clocks.single_clock and clocks.measure(step=3) is None
    trace = tmp_path / "actions.jsonl"
    trace.write_text(json.dumps({"step": 1, "action": "0F0"}) + "\n")
    assert gather_records(trace, clocks.group) == [[{"step": 1, "action": "0F0"}]]
    clocks.close()


def test_several_clocks_make_a_gloo_group_with_a_deadline(monkeypatch):
    made = []
    real = dist.new_group

    def spy(*args, **kwargs):
        made.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(dist, "new_group", spy)
    group = side_group(["boot-a", "boot-b"], timeout_s=7.0)
    assert group is not None and dist.get_backend(group) == "gloo"
    assert made == [{"backend": "gloo", "timeout": made[0]["timeout"]}] and made[0]["timeout"].total_seconds() == 7.0
    dist.destroy_process_group(group)


def test_a_side_group_that_cannot_connect_is_one_error_naming_gloo_socket_ifname(monkeypatch):
    def refused(*args, **kwargs):
        raise dist.DistBackendError("Gloo connectFullMesh failed with [..] Connection refused\nmore lines")

    monkeypatch.setattr(dist, "new_group", refused)
    with pytest.raises(FreezeConfigError) as e:
        side_group(["boot-a", "boot-b"], timeout_s=5.0)
    msg = str(e.value)
    assert "GLOO_SOCKET_IFNAME" in msg and "within 5 s" in msg and "Connection refused" in msg and "\n" not in msg
    assert clock_sync.SIDE_GROUP_TIMEOUT_S > 0
