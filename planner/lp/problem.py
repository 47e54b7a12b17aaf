"""One freeze-planning problem, built once at the entry (:func:`build_problem`) and passed down.

A :class:`Problem` holds everything a plan is computed from, each fact derived once: the batch DAG with its
integer index (:class:`planner.schedule.dag.BatchDag`), the node weights, the checked budget ``r_max``
(:func:`planner.lp.budget.check_r_max`), the delays on DAG edges (checked, and aligned with the index), the
per-node arrays of the LP (:class:`planner.lp.arrays.DagArrays`), and the problem's time scale and
tolerances.

Tolerances (properties of the problem, not of a solver configuration):

* the batch-time resolution at a batch time ``t`` is ``time_tol(t) = TIME_RTOL * t + TIME_ATOL`` (ms).  The
  LP's second stage (least total freezing) keeps ``T <= within_tol(T*) = T* + time_tol(T*)``, and the region
  method accepts a region whose whole batch is within the resolution of the region's batch time.
  ``Problem.time_tol`` is the resolution at the problem's time scale ``no_freeze`` (the batch time with
  every action at ``w_max``), the largest of them (``T* <= no_freeze``).
* ``min_delta = Problem.time_tol / FREEZE_RESOLUTION``: a freezable action whose ``w_max - w_min`` is at most
  this gets no freeze ratio (its planned ratio is 0; it still counts in its stage's budget base).  Why: stage 2
  may spend up to ``time_tol(T*)`` of batch time to freeze less, and the configurations of
  :mod:`planner.lp.highs` spend different amounts of it (on the stage-1 optimal face none, a fresh stage-2
  model all of it, HiGHS's feasibility tolerance a little more).  An action whose whole saving is below the
  resolution can be fully frozen or not within that slack, so its ratio would be arbitrary (measured on a
  steep 1F1B trace with savings of 1e-7..1e-5 ms beside ones of 100 ms: total freezing 11.4 with the
  default configuration, 10.8 with the others).  With every saving above ``min_delta`` the slack moves any
  ratio by at most ``FREEZE_RESOLUTION``, so every configuration reaches the same least freezing to that
  resolution.  What is given up: at most ``min_delta`` (a millionth of the batch time) of batch time per
  action on the critical path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from planner.lp.arrays import DagArrays, dag_arrays
from planner.lp.budget import RMax, check_r_max, per_stage
from planner.schedule.dag import BatchDag, EdgeDelays, edge_delay_array, indexed_longest_path, indexed_makespan
from planner.trace.load import NodeWeights, TraceMeta

TIME_RTOL = 1e-9
"""Batch-time resolution relative to the time scale ``no_freeze``."""
TIME_ATOL = 1e-9
"""Batch-time resolution (ms) added to the relative one."""
FREEZE_RESOLUTION = 1e-3
"""The largest change of a freeze ratio that the stage-2 slack ``time_tol`` may cause (see the module docstring)."""


@dataclass(frozen=True)
class Problem:
    """One planning problem (module docstring); build it with :func:`build_problem`."""

    dag: BatchDag
    """The batch DAG, frozen, with its integer index and the trace metadata it was built from."""
    weights: NodeWeights
    """``w_min``/``w_max`` (ms) of every action."""
    r_max: RMax
    """The checked budget: one ``float`` for every stage, or a tuple of one per stage."""
    edge_ms: EdgeDelays
    """Delays (ms) on DAG edges between actions (checked); ``{}``: none."""
    pred_delay: np.ndarray | None
    """The delays per entry of ``dag.index.pred_idx`` (for longest paths); ``None`` without delays."""
    arrays: DagArrays
    """Per-node arrays of the LP (kept edges with their delays, ``w_max``, freezable ``delta``, stages)."""
    no_freeze: float
    """Batch time (ms) with every action at ``w_max``: the problem's time scale."""

    @property
    def meta(self) -> TraceMeta:
        return self.dag.meta

    @property
    def num_stages(self) -> int:
        return self.dag.meta.num_stages

    @property
    def time_tol(self) -> float:
        """Batch-time resolution (ms) at the time scale ``no_freeze``: the largest stage-2 slack (module docstring)."""
        return time_tol(self.no_freeze)

    def longest_path(self, durations: Mapping[str, float] | np.ndarray) -> tuple[float, dict[str, float], list[str]]:
        """:func:`planner.schedule.dag.longest_path` of ``durations`` on this problem's DAG with its delays (by action
        name, or an array aligned with ``arrays.names``, source and sink 0)."""
        return indexed_longest_path(self.dag.index, durations, self.pred_delay)

    def makespan(self, durations: Mapping[str, float] | np.ndarray) -> float:
        """``longest_path(durations)[0]``, the batch time, without the starts by name and the path."""
        return indexed_makespan(self.dag.index, durations, self.pred_delay)

    def with_r_max(self, r_max: float | Sequence[float]) -> Problem:
        """The same problem with another budget (checked): what a sweep over ``r_max`` solves."""
        return dataclasses.replace(self, r_max=check_r_max(r_max, self.num_stages))


def time_tol(batch_ms: float) -> float:
    """Batch-time resolution (ms) at a batch time of ``batch_ms``."""
    return TIME_RTOL * batch_ms + TIME_ATOL


def within_tol(batch_ms: float) -> float:
    """The longest batch time (ms) within the resolution of ``batch_ms``, ``batch_ms + time_tol(batch_ms)``: the
    bound stage 2 keeps on ``T*``, and how long a region's whole batch may be for the region to be exact."""
    return batch_ms * (1 + TIME_RTOL) + TIME_ATOL


def build_problem(
    dag: BatchDag,
    weights: NodeWeights,
    r_max: float | Sequence[float],
    edge_ms: EdgeDelays | None = None,
) -> Problem:
    """The problem of planning ``dag`` (:func:`planner.schedule.dag.build_dag`) with node ``weights``, budget ``r_max``
    (one number in ``[0, 1]`` for every stage, or one per stage) and the delays ``edge_ms`` on its edges
    (``None`` or ``{}``: none).  Checks, each once, with one-line :class:`planner.errors.PlannerError`\\ s:
    the budget (a single number first, before anything else), that every action has weights, and that
    every delay sits on an edge between two actions and is a finite number >= 0."""
    if not per_stage(r_max):
        r_max = check_r_max(r_max)
    budget = check_r_max(r_max, dag.meta.num_stages)
    delay = edge_delay_array(dag, edge_ms) if edge_ms else None
    arrays = dag_arrays(dag, weights, delay)
    pred_delay = None if delay is None else delay[dag.index.pred_perm]
    no_freeze = indexed_makespan(dag.index, weights.w_max, pred_delay)
    min_delta = time_tol(no_freeze) / FREEZE_RESOLUTION
    arrays.delta[arrays.delta <= min_delta] = 0.0
    return Problem(dag, weights, budget, dict(edge_ms or {}), pred_delay, arrays, no_freeze)
