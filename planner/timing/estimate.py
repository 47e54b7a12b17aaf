"""Per-action duration estimates (node weights) from a trace: the estimator choice.

Two estimators turn a trace's ``upper``/``lower`` records into :class:`~planner.trace.load.NodeWeights`
(``ESTIMATORS``; ``docs/formats.md``, "Node weights the planner derives"). Both read the raw records and
leave them unchanged; only the weights the LP sees differ.

``median`` (the default) is :func:`planner.trace.load.node_weights`: per replica, each action's own median of its
``upper`` records (``w_max``) and of its ``lower`` records (``w_min``, freezable kinds B/W/OVERLAP_F_B only).

``pooled`` uses that every microbatch of a stage does the same work. Each action has only the records of
its own monitoring steps (a handful), so the plain medians of the B actions of one stage scatter by noise
alone, and the LP fits that noise (it freezes some microbatches fully and others not at all). Rule:

* Group the records by (replica, stage, action kind, phase) with phase ``upper`` or ``lower`` (``lower``
  only for the freezable kinds B, W and OVERLAP_F_B, as in ``median``): one group holds every record of every
  microbatch of that stage and kind.
* The group's pooled value is the median of all its ``N`` samples. Its spread is a robust scale,
  ``sigma = 1.4826 * MAD`` (``MAD``: median absolute deviation of the samples from the pooled value;
  1.4826 makes it the standard deviation for normal noise), and the standard error of the pooled value
  is that of a median, ``SE = 1.2533 * sigma / sqrt(N)``.
* A microbatch ``m`` with ``n_m`` samples and median ``median_m`` keeps its own median only where the data
  show an effect: ``|median_m - pooled| > max(3 * SE_m, 0.02 * pooled)`` with
  ``SE_m = 1.2533 * sigma / sqrt(n_m)``. In 1F1B, for instance, the warm-up microbatches and the last one
  really run differently and keep their own values; every other microbatch takes the pooled value.
* Then, exactly as ``median`` does: per replica ``w_min`` is clamped to ``w_max``; F and I get
  ``w_min = w_max``; across replicas each bound is the per-action maximum. A missing record is the same
  one-line :class:`PlannerError` as ``median`` gives.

:func:`pooled_estimates` returns the per-replica estimates with their standard errors; :func:`estimate_weights`
the node weights of either estimator. Importing this module does not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.errors import PlannerError
from planner.schedule.actions import FREEZABLE_KINDS
from planner.trace.columns import columns, group_ids, group_medians
from planner.trace.load import NodeWeights, PhaseEstimates, Trace, combine_replicas, node_weights

ESTIMATORS: tuple[str, ...] = ("median", "pooled")
"""Every node-weight estimator name (the CLI's ``--estimator`` and ``[freeze.advanced] estimator`` read it)."""
DEFAULT_ESTIMATOR = "pooled"
"""The estimator the runtime, the CLI and the planner functions use unless told otherwise: ``pooled`` predicted
the stable phase's action times and longest paths better than ``median`` on 72 recorded runs, out of sample
(docs/results/runtime/estimators.md)."""

MAD_TO_SIGMA = 1.4826
"""sigma = MAD_TO_SIGMA * MAD is the standard deviation for normal noise."""
MEDIAN_SE_FACTOR = 1.2533
"""Standard error of a median of n samples: MEDIAN_SE_FACTOR * sigma / sqrt(n) (sqrt(pi / 2))."""
EFFECT_SE_MULTIPLE = 3.0
"""A microbatch keeps its own median when it is more than this many of its standard errors from the pooled value..."""
EFFECT_MIN_SHARE = 0.02
"""...and more than this share of the pooled value away from it."""


@dataclass(frozen=True)
class Estimate:
    """One (replica, action, phase) estimate of the ``pooled`` estimator, in ms.

    ``value``: the estimate; ``se``: its standard error; ``n``: samples behind it (the action's own when
    ``own``, the whole group's otherwise); ``own``: True where the action kept its own median (a
    per-microbatch effect), False where it took the group's pooled value ``pooled``.
    """

    value: float
    se: float
    n: int
    own: bool
    pooled: float


def check_estimator(estimator: str) -> str:
    """``estimator`` if it is one of :data:`ESTIMATORS`, else a one-line :class:`PlannerError`."""
    if estimator not in ESTIMATORS:
        raise PlannerError(f"estimator {estimator!r}: choose one of {', '.join(ESTIMATORS)}")
    return estimator


@dataclass(frozen=True)
class _Table:
    """The ``pooled`` rule's result per (replica, action, phase) with records, as arrays: ``replica``, ``action``
    (index into ``names``), ``phase`` (index into ``phases``; ``lower``: whether it is ``lower``), and the
    :class:`Estimate` fields."""

    names: list[str]
    phases: list[str]
    replica: np.ndarray
    action: np.ndarray
    phase: np.ndarray
    lower: np.ndarray
    value: np.ndarray
    se: np.ndarray
    n: np.ndarray
    own: np.ndarray
    pooled: np.ndarray

    def keys(self) -> list[tuple[int, str, str]]:
        names, phases = self.names, self.phases
        return [
            (d, names[a], phases[p])
            for d, a, p in zip(self.replica.tolist(), self.action.tolist(), self.phase.tolist())
        ]


def _pooled_table(trace: Trace) -> _Table:
    """The ``pooled`` rule (module docstring) on every group of ``trace`` at once, over its columns
    (:mod:`planner.trace.columns`): each group's samples sorted once, so every median is the float
    ``statistics.median`` gives (``tests/test_estimate.py`` holds it to the rule written group by group)."""
    c = columns(trace)
    upper, lower = c.phase_code("upper"), c.phase_code("lower")
    freezable = c.kind_mask(FREEZABLE_KINDS)[c.action]
    keep = np.flatnonzero((c.phase == upper) | ((c.phase == lower) & freezable))
    d, a, ph, ms = c.replica[keep], c.action[keep], c.phase[keep], c.ms[keep]
    group, group_first = group_ids(d, c.stage[a], c.kind[a], ph)
    n_groups = len(group_first)
    pooled, count = group_medians(group, ms, n_groups)
    mad, _ = group_medians(group, np.abs(ms - pooled[group]), n_groups)
    sigma = MAD_TO_SIGMA * mad
    se_pooled = MEDIAN_SE_FACTOR * sigma / np.sqrt(count)
    key, first = group_ids(d, a, ph)
    own, n = group_medians(key, ms, len(first))
    g = group[first]
    se_own = MEDIAN_SE_FACTOR * sigma[g] / np.sqrt(n)
    kept = np.abs(own - pooled[g]) > np.maximum(EFFECT_SE_MULTIPLE * se_own, EFFECT_MIN_SHARE * np.abs(pooled[g]))
    return _Table(
        names=c.names,
        phases=c.phases,
        replica=d[first],
        action=a[first],
        phase=ph[first],
        lower=ph[first] == lower,
        value=np.where(kept, own, pooled[g]),
        se=np.where(kept, se_own, se_pooled[g]),
        n=np.where(kept, n, count[g]),
        own=kept,
        pooled=pooled[g],
    )


def pooled_estimates(trace: Trace) -> dict[tuple[int, str, str], Estimate]:
    """``(replica, action, phase) -> Estimate`` of the ``pooled`` rule (module docstring), before the
    clamp and the combination over replicas, for every (replica, action, phase) that has records. Phase
    ``upper`` for every action, ``lower`` for the freezable kinds (B, W, OVERLAP_F_B)."""
    t = _pooled_table(trace)
    fields = zip(t.value.tolist(), t.se.tolist(), t.n.tolist(), t.own.tolist(), t.pooled.tolist())
    return {k: Estimate(*f) for k, f in zip(t.keys(), fields)}


def pooled_weights(trace: Trace) -> NodeWeights:
    """Node weights of the ``pooled`` estimator, combined over replicas (and missing records reported)
    exactly as :func:`planner.trace.load.node_weights` combines medians (the values of :func:`pooled_estimates`,
    without building an :class:`Estimate` per action)."""
    t = _pooled_table(trace)
    return combine_replicas(trace, PhaseEstimates(t.replica, t.action, t.lower, t.value))


def estimate_weights(trace: Trace, estimator: str = DEFAULT_ESTIMATOR) -> NodeWeights:
    """Node weights of ``trace`` by ``estimator`` (one of :data:`ESTIMATORS`; another name is a one-line
    :class:`PlannerError`). ``median`` is exactly :func:`planner.trace.load.node_weights`."""
    if check_estimator(estimator) == "median":
        return node_weights(trace)
    return pooled_weights(trace)
