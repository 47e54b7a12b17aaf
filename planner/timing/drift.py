"""Plan vs measurement: how far a step's measured action times drift from a plan, and the node weights a
re-plan starts from. Importing this module does not import torch; the runtime's online re-planning
(``timelyfreeze.plan.replan``) is built on it.

The model is the LP's own. A plan's action ``a`` run at freeze ratio ``r`` is expected to take
``expected(a, r) = w_max - r * (w_max - w_min)`` ms. Every action of one *group* (same stage, same kind:
``"0B"``, ``"1F"``, ``"3W"``) does the same work, so a step's measurements are summarised per group, by a
**scale**: the median over the group's actions of ``measured / expected``. One number per group and step
is robust to a single slow action, and it is what a load change moves (a co-tenant on one rank's cores, a
throttled device, longer sequences: every action of the stage slows alike).

**Drift** of a step: the batch time the plan in force would take if every action's planned duration were
multiplied by its group's scale (the DAG's longest path, with the plan's delays on cross-rank edges,
``planner.timing.comm``, unchanged), relative to the plan's predicted batch time,
minus 1. Longest paths are monotone and positively homogeneous in the durations and delays, so the drift lies
between ``min(min(scale), 1) - 1`` and ``max(max(scale), 1) - 1``: a group slowed that is not on any critical
path moves it less, and so do fixed delays.

**Machine factor** of a set of scales: the median over the groups of the kinds freezing never changes
(``F``, and ``I`` with split backward) of their scales, or None without such a group (reported per step).

**Rank factor**: the same median over one pipeline rank's ``F``/``I`` groups only. A rank runs on its own
core(s), and a co-tenant or a throttled core scales every action of that rank alike, so the re-planner's
yardstick is per rank (:func:`rank_factors`), not the job's: with PP=2 the job's median of two ``F`` groups
is their mean, and one rank's slowdown would pass for a change of its own and the other rank's ``B``/``W``.
A group's **corrected** scale is its scale over its rank's factor (:func:`corrected_scales`): what changed
*within* a rank (e.g. its ``B`` against its ``F``). A rank's **relative speed** is its factor over the median
factor of the other ranks (:func:`rank_speeds`): what changed *between* ranks. A change of every group
alike moves neither; a change of one rank's every group moves only its relative speed.

**Re-plan weights**: the current node weights with both bounds of every group multiplied by its scale (the
per-group median over the last steps): what freezing saves in a slowed stage grows with it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Mapping

import networkx as nx
import numpy as np

from planner.schedule.actions import parse_action
from planner.schedule.dag import (
    SINK,
    SOURCE,
    DagIndex,
    EdgeDelays,
    dag_index,
    duration_array,
    edge_delay_array,
    indexed_makespan,
)
from planner.trace.load import NodeWeights, TraceMeta


@lru_cache(maxsize=None)
def group_of(action: str) -> str:
    """The group key of an action: its stage and kind, e.g. ``"1B"`` for ``"1B7"`` (each name once per process, as
    ``parse_action``: the runtime asks for every action's group every stable step)."""
    a = parse_action(action)
    return f"{a.stage}{a.kind}"


def expected_ms(weights: NodeWeights, action: str, ratio: float) -> float:
    """The plan model's duration of ``action`` at freeze ratio ``ratio`` (clamped to [0, 1])."""
    hi = weights.w_max[action]
    return _expected(hi, hi - weights.w_min[action], ratio)


def _expected(hi: float, span: float, ratio: float) -> float:
    """``w_max - r * (w_max - w_min)`` with ``r`` the ratio clamped to [0, 1] (through ``min``/``max`` only where it is
    not in [0, 1]: the same float)."""
    return hi - (ratio if 0.0 <= ratio <= 1.0 else min(1.0, max(0.0, ratio))) * span


ActionBounds = dict[str, tuple[str, float, float]]
"""Per action: its group, ``w_max`` and ``w_max - w_min`` (:func:`action_bounds`)."""


def action_bounds(weights: NodeWeights) -> ActionBounds:
    """What :func:`step_scales` looks up per action, made once for a caller that scales many steps by one plan's
    weights (the runtime's re-planner, every stable step)."""
    return {a: (group_of(a), hi, hi - weights.w_min[a]) for a, hi in weights.w_max.items()}


def step_scales(
    samples: Iterable[tuple[str, float, float]], weights: NodeWeights, bounds: ActionBounds | None = None
) -> dict[str, float]:
    """Per group, the median over the step's ``(action, measured ms, applied ratio)`` samples of measured /
    expected. Actions the weights do not know, and expected times <= 0, are left out. ``bounds``:
    :func:`action_bounds` of ``weights``, where the caller keeps it."""
    if bounds is None:
        bounds = action_bounds(weights)
    ratios: dict[str, list[float]] = {}
    for action, ms, ratio in samples:
        known = bounds.get(action)
        if known is None:
            continue
        group, hi, span = known
        e = _expected(hi, span, ratio)
        if e > 0:
            ratios.setdefault(group, []).append(ms / e)
    return {g: float(statistics.median(v)) for g, v in sorted(ratios.items())}


MACHINE_KINDS = ("F", "I")
"""Kinds whose time does not depend on freezing: they measure the machine."""


def machine_factor(scales: Mapping[str, float]) -> float | None:
    """The median scale of the ``F``/``I`` groups (module docstring); None without one."""
    vals = [s for g, s in scales.items() if g.lstrip("0123456789") in MACHINE_KINDS]
    return float(statistics.median(vals)) if vals else None


def group_ranks(meta: TraceMeta) -> dict[str, int]:
    """Group -> the pipeline rank that runs it, from the metadata's action table (its names are not read again;
    a group on several ranks, which no schedule has, keeps the last)."""
    t = meta.action_table()
    last = dict(zip(zip(t.stage, t.kind), t.rank))
    return {f"{s}{k}": r for (s, k), r in last.items()}


def rank_factors(scales: Mapping[str, float], ranks: Mapping[str, int]) -> dict[int, float]:
    """Per pipeline rank, the median scale of its ``F``/``I`` groups (``ranks``: :func:`group_ranks`); a rank
    without such a group in ``scales`` has none."""
    vals: dict[int, list[float]] = {}
    for g, s in scales.items():
        if g.lstrip("0123456789") in MACHINE_KINDS and g in ranks:
            vals.setdefault(ranks[g], []).append(s)
    return {r: float(statistics.median(v)) for r, v in sorted(vals.items())}


def corrected_scales(
    scales: Mapping[str, float],
    ranks: Mapping[str, int],
    factors: Mapping[int, float] | None = None,
    job: float | None = None,
) -> dict[str, float]:
    """Every group's scale over its rank's factor (over the job's machine factor where its rank has none,
    unchanged without either): what changed within a rank. ``factors`` and ``job``: :func:`rank_factors` and
    :func:`machine_factor` of these ``scales`` where the caller has them (either left None is computed here)."""
    if factors is None:
        factors = rank_factors(scales, ranks)
    if job is None:
        job = machine_factor(scales)
    job = job or 1.0
    return {g: s / factors.get(ranks.get(g, -1), job) for g, s in scales.items()}


def rank_speeds(factors: Mapping[int, float]) -> dict[int, float]:
    """Per rank, its factor over the median factor of the other ranks (1: as fast as the others, relative
    to the plan); empty with fewer than two ranks."""
    if len(factors) < 2:
        return {}
    return {r: f / statistics.median(v for q, v in factors.items() if q != r) for r, f in factors.items()}


def max_scales(per_rank: Iterable[Mapping[str, float] | None]) -> dict[str, float]:
    """One scale per group from several ranks' (data-parallel replicas measure the same groups): the
    maximum, as node weights take the per-action maximum over replicas (``planner.trace.load.node_weights``)."""
    out: dict[str, float] = {}
    for scales in per_rank:
        for g, s in (scales or {}).items():
            out[g] = max(out.get(g, s), s)
    return dict(sorted(out.items()))


def window_scales(steps: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Per group, the median of its scales over several steps (a group missing from a step: over the rest)."""
    vals: dict[str, list[float]] = {}
    for scales in steps:
        for g, s in scales.items():
            vals.setdefault(g, []).append(s)
    return {g: float(statistics.median(v)) for g, v in sorted(vals.items())}


def planned_durations(
    weights: NodeWeights, ratios: Mapping[str, float], scales: Mapping[str, float] | None = None
) -> dict[str, float]:
    """Every action's expected duration at its planned ratio (0 where ``ratios`` has none), times its group's
    scale when ``scales`` are given (1 for a group without one)."""
    out = {}
    for a in weights.w_max:
        d = expected_ms(weights, a, ratios.get(a, 0.0))
        out[a] = d * scales.get(group_of(a), 1.0) if scales else d
    return out


@dataclass(frozen=True)
class PlannedPath:
    """A plan's longest path made ready once, for the drift of every step under it: the planned durations as an
    array along the DAG's index, each node's group, and the delays per predecessor entry (:func:`planned_path`).
    Rebuilt only when the plan (its weights, ratios or delays) changes."""

    index: DagIndex
    durations: np.ndarray
    """Every node's planned duration (:func:`planned_durations`), aligned with ``index.names`` (source, sink 0)."""
    groups: tuple[str, ...]
    """The groups of the plan's actions, in first-seen order along the index."""
    group_at: np.ndarray
    """Per node, its group's position in ``groups`` (``len(groups)``, scale 1, for the source and the sink)."""
    pred_delay: np.ndarray | None
    """The plan's delays per entry of ``index.pred_idx`` (None without delays)."""
    base: float
    """The longest path of the planned durations: :func:`planned_batch`."""


def planned_path(
    dag: nx.DiGraph, weights: NodeWeights, ratios: Mapping[str, float], edge_ms: EdgeDelays | None = None
) -> PlannedPath:
    """The :class:`PlannedPath` of a plan (``weights``, ``ratios``, its delays ``edge_ms``) on ``dag``; a node
    without weights is a :class:`PlannerError`, as in :func:`planner.schedule.dag.longest_path`."""
    di = dag_index(dag)
    durations = duration_array(di, planned_durations(weights, ratios))
    position: dict[str, int] = {}
    at = [
        -1 if name == SOURCE or name == SINK else position.setdefault(group_of(name), len(position))
        for name in di.names
    ]
    group_at = np.asarray(at, dtype=np.int64)
    group_at[group_at < 0] = len(position)
    delay = edge_delay_array(dag, edge_ms)[di.pred_perm] if edge_ms else None
    return PlannedPath(di, durations, tuple(position), group_at, delay, indexed_makespan(di, durations, delay))


def scaled_batch(path: PlannedPath, scales: Mapping[str, float]) -> float:
    """The longest path of ``path``'s planned durations, each times its group's scale (1 for a group without
    one): the same products, sums and maxima as :func:`planned_durations` with ``scales`` and a longest path."""
    factor = np.asarray([float(scales.get(g, 1.0)) for g in path.groups] + [1.0])
    return indexed_makespan(path.index, path.durations * factor[path.group_at], path.pred_delay)


def path_drift(path: PlannedPath, scales: Mapping[str, float]) -> float:
    """:func:`drift` on a :class:`PlannedPath`: ``scaled_batch / base - 1`` (0 for an empty plan)."""
    if path.base <= 0:
        return 0.0
    return scaled_batch(path, scales) / path.base - 1.0


def planned_batch(
    dag: nx.DiGraph, weights: NodeWeights, ratios: Mapping[str, float], edge_ms: EdgeDelays | None = None
) -> float:
    """The longest path of the planned durations (with the delays): what :func:`drift` compares with."""
    return planned_path(dag, weights, ratios, edge_ms).base


def drift(
    dag: nx.DiGraph,
    weights: NodeWeights,
    ratios: Mapping[str, float],
    scales: Mapping[str, float],
    edge_ms: EdgeDelays | None = None,
) -> float:
    """Relative drift of the batch time under ``scales``: ``longest path(planned durations x scale) /
    longest path(planned durations) - 1`` (0 for an empty plan); ``edge_ms``: the plan's delays on
    cross-rank edges (``planner.timing.comm``), the same in both paths. A caller that checks many steps
    against one plan keeps its :func:`planned_path` and calls :func:`path_drift`."""
    return path_drift(planned_path(dag, weights, ratios, edge_ms), scales)


def scaled_weights(weights: NodeWeights, scales: Mapping[str, float]) -> NodeWeights:
    """Both bounds of every action times its group's scale (1 where a group has none)."""
    s = {a: scales.get(group_of(a), 1.0) for a in weights.w_max}
    return NodeWeights({a: v * s[a] for a, v in weights.w_min.items()}, {a: v * s[a] for a, v in weights.w_max.items()})
