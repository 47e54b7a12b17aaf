"""Clocks across hosts: which ranks share a clock, and each clock's offset to global rank 0's.

Start times (``start_ms``) are each host's monotonic clock (``timelyfreeze.hooks.step_clock``). Two processes
compare their start times directly only when they run on one kernel: the clock is keyed by the kernel's boot
id (``/proc/sys/kernel/random/boot_id``), not the host name (two containers on one kernel share a clock under
two names; two machines can share a name). Where the boot id cannot be read the host name stands in, and the
trace says so (``clock_key = "hostname"``).

For every other clock, its offset to global rank 0's is measured NTP-style over a CPU (gloo) side group, so nothing
in the pipeline's NCCL streams waits. The side group exists only where ranks span clocks (``side_group``): plain
TorchTitan on NCCL never needs gloo, and on clusters whose host name resolves to loopback gloo cannot connect unless
``GLOO_SOCKET_IFNAME`` names the interface; it connects within ``SIDE_GROUP_TIMEOUT_S`` or the run ends with one
``error:`` line naming ``GLOO_SOCKET_IFNAME``. The round trips: rank 0 sends a ping at ``t0`` (its clock), the
clock's lowest rank answers with its own time ``t_remote``, rank 0 receives at ``t1``; of ``ROUND_TRIPS`` round
trips the one with the smallest ``rtt = t1 - t0`` gives ``offset = t_remote - (t0 + t1) / 2`` with error bound
``rtt / 2`` (``t_remote`` was read between ``t0`` and ``t1``, whatever the asymmetry of the two directions).
Ranks on rank 0's clock get offset 0 with bound 0. The runtime measures at both ends of each monitoring window
and at the end of the run, so a drifting clock shows (``planner.trace.clocks`` interpolates between the samples);
every rank receives the result (a broadcast), and the trace's ``meta.json`` carries it (``clock_sync``,
docs/formats.md).

``TIMELYFREEZE_BOOT_ID`` (tests only) replaces the boot id: with ``TIMELYFREEZE_CLOCK_OFFSET_MS`` two torchrun
agents on one machine act as two hosts with different clocks.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from timelyfreeze.hooks.step_clock import host_ms
from timelyfreeze.job.errors import FreezeConfigError

BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
BOOT_ID_ENV = "TIMELYFREEZE_BOOT_ID"
ROUND_TRIPS = 32
"""Round trips per clock and measurement; the best (smallest round trip) one counts."""
SIDE_GROUP_TIMEOUT_S = 120.0
"""How long the gloo side group may take to connect, and any of its collectives to finish."""


def clock_id(path: str = BOOT_ID_FILE) -> tuple[str, str]:
    """``(id, key)`` of this process's clock: the boot id (``key = "boot_id"``), or the host name where the
    boot id cannot be read (``key = "hostname"``)."""
    forced = os.environ.get(BOOT_ID_ENV, "").strip()
    if forced:
        return forced, "boot_id"
    try:
        with open(path, encoding="ascii") as f:
            boot = f.read().strip()
        if boot:
            return boot, "boot_id"
    except (OSError, UnicodeDecodeError):
        pass
    return socket.gethostname(), "hostname"


def best_offset(trips: list[tuple[float, float, float]]) -> tuple[float, float]:
    """``(offset, error bound)`` in ms from ``(t0, t_remote, t1)`` round trips: the smallest round trip's
    ``t_remote - (t0 + t1) / 2`` and ``(t1 - t0) / 2``."""
    t0, remote, t1 = min(trips, key=lambda t: t[2] - t[0])
    return remote - (t0 + t1) / 2, (t1 - t0) / 2


def one_clock(ids: list[str]) -> bool:
    """Whether one clock serves every rank (``ids``: every global rank's clock id): the one rule for when the
    clocks need no side group and no measuring."""
    return len(set(ids)) == 1


def side_group(ids: list[str], timeout_s: float = SIDE_GROUP_TIMEOUT_S) -> Any:
    """The gloo side group of a job whose ranks span clocks (``ids``: every global rank's clock), None where
    one clock serves all (the default group then carries what little the clocks send: no gloo on NCCL jobs).
    Collective over the job. A group that cannot connect within ``timeout_s`` (gloo resolving the host name
    to loopback, a firewall) ends the run with a ``FreezeConfigError`` naming ``GLOO_SOCKET_IFNAME``."""
    if one_clock(ids):
        return None
    try:
        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        dist.barrier(group=group)  # the first collective: every pair of ranks has connected
        return group
    except (RuntimeError, dist.DistError) as e:  # DistBackendError, gloo's connect and timeout errors
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FreezeConfigError(
            f"clocks across hosts: the gloo side group of {len(set(ids))} hosts did not connect within "
            f"{timeout_s:g} s ({first}); set GLOO_SOCKET_IFNAME to the network interface the hosts reach each "
            "other on (e.g. GLOO_SOCKET_IFNAME=eth0), see docs/runtime.md (several hosts)"
        ) from None


class ClockSync:
    """Collective over the job at construction and at every ``measure``: the clock of every global rank and
    the offsets of the clocks other than rank 0's. ``places``: (replica, pipeline rank) of every global rank."""

    def __init__(self, places: list[tuple[int, int]], *, round_trips: int = ROUND_TRIPS):
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.places = places
        self.round_trips = round_trips
        self.id, self.key = clock_id()
        ids: list[Any] = [None] * self.size
        dist.all_gather_object(ids, (self.id, self.key))  # the default group: one small object, at start-up
        self.ids = [i for i, _ in ids]
        """Clock id of every global rank."""
        self.keys = sorted({k for _, k in ids})
        self.group = side_group(self.ids)
        """The gloo side group where ranks span clocks (``side_group``), else None: the default group."""
        self.samples: list[dict] = []
        """Replica 0's measurements so far (``meta.json``'s ``clock_sync.samples``)."""

    @property
    def single_clock(self) -> bool:
        return one_clock(self.ids)

    def measure(self, step: int) -> dict | None:
        """Every clock's offset to rank 0's (collective over the job; the gloo side group only); the sample of
        replica 0's pipeline ranks, appended to ``samples``; None (and nothing sent) when one clock serves all."""
        if self.single_clock:
            return None
        ref = self.ids[0]
        reps = {}
        for g, cid in enumerate(self.ids):
            if cid != ref:
                reps.setdefault(cid, g)
        found: dict[str, tuple[float, float]] = {ref: (0.0, 0.0)}
        for cid, g in reps.items():
            if self.rank == 0:
                found[cid] = best_offset(self._ping(g))
            elif self.rank == g:
                self._pong()
        box = [found if self.rank == 0 else None]
        dist.broadcast_object_list(box, group_src=0, group=self.group)
        found = box[0]
        pp = {r: self.ids[g] for g, (d, r) in enumerate(self.places) if d == 0}
        sample = {
            "step": step,
            "offset_ms": [round(found[pp[r]][0], 6) for r in range(len(pp))],
            "error_ms": [round(found[pp[r]][1], 6) for r in range(len(pp))],
        }
        self.samples.append(sample)
        return sample

    def _ping(self, peer: int) -> list[tuple[float, float, float]]:
        out, buf = [], torch.zeros(1, dtype=torch.float64)
        for _ in range(self.round_trips):
            t0 = host_ms()
            dist.send(torch.tensor([t0], dtype=torch.float64), peer, group=self.group)
            dist.recv(buf, peer, group=self.group)
            out.append((t0, float(buf[0]), host_ms()))
        return out

    def _pong(self) -> None:
        buf = torch.zeros(1, dtype=torch.float64)
        for _ in range(self.round_trips):
            dist.recv(buf, 0, group=self.group)
            dist.send(torch.tensor([host_ms()], dtype=torch.float64), 0, group=self.group)

    def meta(self) -> dict:
        """``meta.json``'s ``clock_sync`` field (docs/formats.md)."""
        return {"key": self.keys[0] if len(self.keys) == 1 else "hostname", "samples": list(self.samples)}

    def close(self) -> None:
        """Destroy the side group (before TorchTitan destroys the default one)."""
        if self.group is not None:
            dist.destroy_process_group(self.group)
            self.group = None


def sync_steps(warmup_end: int, upper_end: int, lower_end: int) -> set[int]:
    """Steps after which the clocks are measured: both ends of each monitoring window (the end of warm-up is
    the start of the upper-bound window; a run without warm-up starts measuring at that window's end)."""
    return {s for s in (warmup_end, upper_end, lower_end) if s >= 1}


def gather_records(path, group) -> list[list[dict]] | None:
    """Every rank's trace records (its own file, ``path``; None without one), on global rank 0 (None
    elsewhere), through the gloo side ``group`` (None: the default group): rank 0 reads no other rank's file,
    so ranks that write to node-local dump folders still give it the whole trace. Collective over the job."""
    mine = None
    if path is not None:
        with open(path, encoding="utf-8") as f:
            mine = [json.loads(line) for line in f if line.strip()]
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, out, group_dst=0, group=group)
    return out
