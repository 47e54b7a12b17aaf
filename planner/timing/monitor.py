"""The monitoring windows' machine speed and noise, from the actions freezing never changes (no torch).

Forward (``F``) actions, and the input-grad backwards (``I``) of split-backward schedules, do the same
work whatever is frozen. The ratio of their times in two windows therefore measures the *machine*, not
the plan: a co-tenant, throttling or a busier host slows them exactly as it slows every other action.
Rules (``docs/formats.md``, "F-anchored monitoring windows"):

* **Reference**: the ``upper`` window (nothing frozen); its speed is the plan's speed.
* **Factor** of a window ``P`` (``lower``) in replica ``d``: for every F/I action with records in both
  windows, ``median ms in P / median ms in upper``; per group (stage, kind), the median over its
  actions; the factor is the median over the groups. 1.0: the same machine speed; 1.2: 20 % slower.
  A replica without such actions has factor 1.0.
* **Anchoring**: every record of window ``P`` in replica ``d`` is divided by its factor before the node
  weights are estimated, so ``w_min`` and ``w_max`` describe one machine speed. (A uniform slowdown
  scales every weight alike and cannot change the optimal plan; a lower-bound window that ran slower
  than the upper one inflates every ``w_min`` and shrinks what freezing seems to save.)
* **Noise floor** of a group ``g`` (stage and kind, over every replica): how much its per-step scale moves
  against its own rank's speed within the monitoring windows, the statistic the online re-planner
  (``timelyfreeze.plan.replan``) tests. Per (replica, window, step): the group's scale ``s_g`` is the median over
  its records of ``ms / m`` (``m``: the median of the record's own replica, action and window), the factor
  ``f_r`` of the pipeline rank ``r`` that runs ``g`` the median of that rank's F/I groups' scales (1 without),
  and the floor is ``1.4826 * median |s_g / f_r - 1|`` over the steps. A load that slows every group of a
  rank alike (a co-tenant on its core) does not raise it; one that slows a rank's B more than its F does.
* **Rank noise** of a pipeline rank ``r``: how much its speed moves against the other ranks' within the
  monitoring windows, the yardstick of a re-plan for a change *between* ranks. Per (replica, window, step):
  ``v_r = f_r / median of the other ranks' f_q - 1`` (``planner.timing.drift.rank_speeds``); the noise is the
  root mean square of ``v_r - median(v_r)`` over the steps. Not a median-based estimate on purpose: a
  co-tenant that comes and goes slows a rank in some steps and not in others (two modes, either of which can
  hold most steps), and the swing it causes is what the re-planner must not take for a change; the root mean
  square of a swing of size ``D`` seen in a share ``p`` of the steps is ``D * sqrt(p)`` or more, so even one
  loaded step in eight gives a limit (``replan_noise_k = 3`` times it) near ``D``.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass

import numpy as np

from planner.schedule.actions import parse_action
from planner.timing.drift import corrected_scales, group_ranks, rank_factors, rank_speeds
from planner.timing.estimate import MAD_TO_SIGMA
from planner.trace.columns import Columns, columns, group_ids, group_medians
from planner.trace.load import Trace

REFERENCE = "upper"
"""The window every other one is brought to."""
WINDOWS = ("upper", "lower")
"""The monitoring windows (trace phases)."""
ANCHOR_KINDS = ("F", "I")
"""Kinds whose work does not depend on freezing: their time measures the machine."""


@dataclass
class _Windows:
    """The monitoring records grouped once (:func:`_windows`) over the trace's columns (``c``): ``rows``, the
    window records' rows; ``key``, each such record's (replica, action, window) key; per key its ``replica``,
    ``action`` and ``window`` (indices into ``c.names`` and ``c.phases``) and its median ``med`` (ms)."""

    c: Columns
    rows: np.ndarray
    key: np.ndarray
    replica: np.ndarray
    action: np.ndarray
    window: np.ndarray
    med: np.ndarray


def _windows(trace: Trace) -> _Windows:
    c = columns(trace)
    codes = [c.phase_code(w) for w in WINDOWS]
    rows = np.flatnonzero(np.isin(c.phase, codes))
    d, a, ph = c.replica[rows], c.action[rows], c.phase[rows]
    key, first = group_ids(d, a, ph)
    med, _ = group_medians(key, c.ms[rows], len(first))
    return _Windows(c, rows, key, d[first], a[first], ph[first], med)


def group_key(action: str) -> str:
    """Stage and kind of an action, e.g. ``"1B"`` (``planner.timing.drift.group_of``)."""
    a = parse_action(action)
    return f"{a.stage}{a.kind}"


def window_factors(trace: Trace, window: str = "lower") -> list[float]:
    """Per replica, the machine factor of ``window`` against the reference (module docstring)."""
    return _window_factors(_windows(trace), trace.meta.replicas, window)


def _window_factors(w: _Windows, replicas: int, window: str) -> list[float]:
    """Per replica, the median over the F/I groups of the median over each group's actions of ``window``'s
    median ms over the reference's (an action without a reference record, or with a reference of 0 ms, left
    out)."""
    c, code, ref_code = w.c, w.c.phase_code(window), w.c.phase_code(REFERENCE)
    if code < 0 or ref_code < 0:
        return [1.0] * replicas
    ref = np.full((replicas, len(c.names)), np.nan)
    up = w.window == ref_code
    ref[w.replica[up], w.action[up]] = w.med[up]
    sel = np.flatnonzero((w.window == code) & c.kind_mask(ANCHOR_KINDS)[w.action])
    r = ref[w.replica[sel], w.action[sel]]
    ok = ~np.isnan(r) & (r != 0)
    sel, r = sel[ok], r[ok]
    d, a = w.replica[sel], w.action[sel]
    group, first = group_ids(d, c.stage[a], c.kind[a])
    per_group, _ = group_medians(group, w.med[sel] / r, len(first))
    per_replica, count = group_medians(d[first], per_group, replicas)
    return [float(m) if n else 1.0 for m, n in zip(per_replica.tolist(), count.tolist())]


def anchored(trace: Trace, factors: dict[str, list[float]]) -> Trace:
    """A copy of ``trace`` whose records of each window in ``factors`` (``{window: per-replica factor}``) are
    divided by their replica's factor; other records (and ``start_ms``) are unchanged. Made from the columns
    (``Trace.from_columns``): its records are built only if someone reads them."""
    c = columns(trace)
    ms = c.ms.copy()
    for phase, per_replica in factors.items():
        code = c.phase_code(phase)
        for d, f in enumerate(per_replica):
            if code >= 0 and f > 0:
                at = (c.phase == code) & (c.replica == d)
                ms[at] = c.ms[at] / f
    return Trace.from_columns(trace.meta, dataclasses.replace(c, ms=ms), trace.source)


def _step_scales(
    trace: Trace, w: _Windows | None = None
) -> tuple[dict[tuple[int, str, int], dict[str, float]], dict[str, int]]:
    """Per (replica, window, step) of the monitoring windows, every group's scale (the median over its
    records of ``ms`` over the median of the record's replica, action and window); and group -> rank."""
    w = _windows(trace) if w is None else w
    c = w.c
    m = w.med[w.key]
    ok = m != 0
    rows = w.rows[ok]
    a = c.action[rows]
    d, ph, st, stage, kind = c.replica[rows], c.phase[rows], c.step[rows], c.stage[a], c.kind[a]
    group, first = group_ids(d, ph, st, stage, kind)
    scale, _ = group_medians(group, c.ms[rows] / m[ok], len(first))
    per_step: dict[tuple[int, str, int], dict[str, float]] = {}
    at = zip(d[first].tolist(), ph[first].tolist(), st[first].tolist(), stage[first].tolist(), kind[first].tolist())
    for (dd, p, k, s, kd), v in zip(at, scale.tolist()):
        per_step.setdefault((dd, c.phases[p], k), {})[f"{s}{c.kinds[kd]}"] = v
    return per_step, group_ranks(trace.meta)


def noise_floors(trace: Trace) -> dict[str, float]:
    """Per group (stage and kind), the robust dispersion of its per-step scale against its rank's factor in the
    monitoring windows (module docstring); 0 where the windows show none (e.g. one step per window)."""
    return _noise_floors(*_step_scales(trace))


def _noise_floors(per_step: dict[tuple[int, str, int], dict[str, float]], ranks: dict[str, int]) -> dict[str, float]:
    dev: dict[str, list[float]] = {}
    for groups in per_step.values():
        for g, c in corrected_scales(groups, ranks).items():
            dev.setdefault(g, []).append(abs(c - 1.0))
    return {g: MAD_TO_SIGMA * float(statistics.median(v)) for g, v in sorted(dev.items())}


def rank_noise(trace: Trace) -> dict[int, float]:
    """Per pipeline rank, the root mean square of its per-step relative speed about its median in the
    monitoring windows (module docstring); 0 where the windows show none; empty with one rank."""
    return _rank_noise(*_step_scales(trace))


def _rank_noise(per_step: dict[tuple[int, str, int], dict[str, float]], ranks: dict[str, int]) -> dict[int, float]:
    speeds: dict[int, list[float]] = {}
    for groups in per_step.values():
        for r, v in rank_speeds(rank_factors(groups, ranks)).items():
            speeds.setdefault(r, []).append(v - 1.0)
    out = {}
    for r, v in sorted(speeds.items()):
        mid = statistics.median(v)
        out[r] = math.sqrt(statistics.fmean((x - mid) ** 2 for x in v))
    return out


def monitoring_summary(trace: Trace, anchor: bool) -> dict:
    """What a plan records of its monitoring windows: the reference, the factors (per replica), whether the
    weights were anchored, and the noise floors (``plan.json`` field ``monitoring``); the records are grouped
    once for all three."""
    w = _windows(trace)
    steps = _step_scales(trace, w)
    return {
        "reference": REFERENCE,
        "kinds": list(ANCHOR_KINDS),
        "factors": {"lower": [round(f, 6) for f in _window_factors(w, trace.meta.replicas, "lower")]},
        "anchored": bool(anchor),
        "noise": {g: round(v, 6) for g, v in _noise_floors(*steps).items()},
        "rank_noise": {str(r): round(v, 6) for r, v in _rank_noise(*steps).items()},
    }
