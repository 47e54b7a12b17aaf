"""The TimelyFreeze LP (seeds digest 1.6): the entries :func:`solve_problem` (a built
:class:`planner.lp.problem.Problem`) and :func:`solve_freeze_lp` (a single solve), and the solver names.

The LP chooses a freeze ratio per freezable action; stage 1 minimises the batch time ``T``, stage 2
keeps ``T <= T*`` (to its resolution, :func:`planner.lp.problem.within_tol`) and minimises the total freezing.
The work lives in these modules:

* :mod:`planner.lp.arrays`: the per-node arrays of the DAG (the problem's ``arrays``) and of a region;
* :mod:`planner.lp.model`: one stage of the reduced LP as sparse arrays, with a crafted starting basis;
* :mod:`planner.lp.highs`: the lexicographic two-stage HiGHS solve of the whole LP;
* :mod:`planner.lp.region`: the region method, the same optimum from a growing set of near-critical
  actions (exact), for large batches.

Every path returns the exact lexicographic optimum; the result is checked against a longest-path pass
over its durations before it is returned.  Measurements behind the defaults:
``docs/planner-solver-notes.md``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner.errors import PlannerError
from planner.lp.arrays import action_nodes, stage_counts
from planner.lp.budget import sensitivity
from planner.lp.highs import CONFIGS, DEFAULT_CONFIG, LPResult, solve_whole
from planner.lp.problem import Problem, build_problem
from planner.lp.region import solve_region
from planner.schedule.dag import BatchDag, EdgeDelays
from planner.trace.load import NodeWeights

SOLVERS: tuple[str, ...] = ("auto", "whole", "region")
"""Every solver name ``solve_freeze_lp`` accepts: the one list the CLI and ``[freeze.advanced] solver`` check against.
``auto`` (default): ``region`` from ``_REGION_MIN_ACTIONS`` actions on, else ``whole``; ``whole``: the
whole LP; ``region``: the region method, falling back to the whole LP when the region grows too large.
All three give the same optimum."""
_REGION_MIN_ACTIONS = 20_000
"""From this many actions on, ``solver="auto"`` uses the region method, bounded by :data:`DEFAULT_GAP`."""
DEFAULT_GAP = 1e-3
"""Certified relative gap ``solver="auto"`` accepts from :data:`_REGION_MIN_ACTIONS` actions on (``gap=None``):
0.1 % of the batch time, far below the run-to-run noise of the timings a plan rests on."""
DEFAULT_FALLBACK_GAP = 1e-2
"""With ``gap=None`` and ``solver="auto"`` from :data:`_REGION_MIN_ACTIONS` actions on: where the region method
cannot certify :data:`DEFAULT_GAP` (nearly balanced stages, most ranks co-critical), its best plan is returned
when certified within this gap, rather than the whole LP (minutes at 100k actions: 391 s for stage 1 alone on
replayed measured timings at pp 32 x 2 x 512).  1 % of the batch time is still a tenth of the +-10 % step-time
noise the plan rests on; the plan records the gap reached and the target (``solver.gap_target``)."""


@dataclass
class LPSolution:
    """Durations and starts of every action, the batch time, how the solve went, and per stage the ms of
    batch time one more 0.01 of its ``r_max`` would save (``budget_sensitivity``, :func:`solve_freeze_lp`)."""

    durations: dict[str, float]
    starts: dict[str, float]
    makespan: float
    status: str
    seconds: float
    solver: str
    budget_sensitivity: dict[int, float] = field(default_factory=dict)
    lower_bound: float | None = None  # certified lower bound of the optimal batch time (= makespan when exact)
    gap_target: float | None = None  # the gap asked for, where the plan returned misses it (fallback_gap)
    critical_path: list[str] = field(default_factory=list)  # the actions of one longest path of the durations

    @property
    def gap(self) -> float:
        """Certified relative gap of ``makespan`` to the optimum: ``(makespan - lower_bound) / lower_bound``
        (0 for an exact solve)."""
        lb = self.makespan if self.lower_bound is None else self.lower_bound
        return max(0.0, (self.makespan - lb) / lb) if lb > 0 else 0.0


def solve_freeze_lp(
    dag: BatchDag,
    weights: NodeWeights,
    r_max: float | Sequence[float],
    *,
    edge_ms: EdgeDelays | None = None,
    **kw: Any,
) -> LPSolution:
    """:func:`solve_problem` on ``build_problem(dag, weights, r_max, edge_ms)`` (:mod:`planner.lp.problem`): for a
    single solve; a caller with several builds the problem once.  ``edge_ms``: delays (ms) on DAG edges
    between actions, ``start(v) >= end(u) + edge_ms[(u, v)]``; ``None`` or ``{}``: none (the delay-free
    solve, bit for bit).  ``solution.seconds`` and ``stats["total_s"]`` include building the problem
    (``stats["problem_s"]``)."""
    t0 = time.perf_counter()
    problem = build_problem(dag, weights, r_max, edge_ms)
    built = time.perf_counter() - t0
    sol = solve_problem(problem, **kw)
    sol.seconds += built
    stats = kw.get("stats")
    if stats is not None:
        stats.update(problem_s=built, total_s=stats["total_s"] + built)
    return sol


def solve_problem(
    problem: Problem,
    *,
    solver: str = "auto",
    options: dict[str, object] | None = None,
    stats: dict[str, float] | None = None,
    gap: float | None = None,
    fallback_gap: float | None = None,
    _config: str = DEFAULT_CONFIG,
) -> LPSolution:
    """Solve the freeze LP lexicographically (min batch time, then min total freezing).

    ``problem`` (:mod:`planner.lp.problem`): the DAG, weights, budget and delays; stage 2 keeps
    ``T <= planner.lp.problem.within_tol(T*)``.  ``solver``: one of :data:`SOLVERS`.  ``options`` are extra
    HiGHS options;
    ``stats`` (if given) receives model sizes and timings.  ``_config`` (tests and benchmarks only) names
    the HiGHS configuration of the whole-LP solve, a key of :data:`planner.lp.highs.CONFIGS`.
    ``solution.solver`` says what ran: ``highs-region``, ``highs-region-bounded``, or ``highs-<config>`` for
    the whole LP (``highs-fast`` with the default configuration).

    ``gap``: the largest certified relative gap in batch time accepted (``0 <= gap < 1``).  ``0``: the exact
    lexicographic optimum.  ``> 0`` with the region method: the bounded method of :mod:`planner.lp.region`,
    a feasible plan whose batch time is within ``gap`` of a proven lower bound (``solution.lower_bound``,
    ``solution.gap``), its freezing reduced greedily but not certified least; when the region becomes exact
    first the result is the exact optimum.  ``None`` (default): :data:`DEFAULT_GAP` where ``solver="auto"``
    picks the region method, else 0.

    ``fallback_gap``: where the bounded region method cannot reach ``gap`` before its region outgrows its
    limit, return its best plan when certified within ``fallback_gap`` (``solution.gap`` is the gap reached,
    ``solution.gap_target`` the ``gap`` missed) instead of solving the whole LP.  ``None`` (default):
    :data:`DEFAULT_FALLBACK_GAP` where ``gap`` is ``None`` and ``solver="auto"`` picks the region method, else
    0 (no fallback: an explicit ``gap`` is kept, at the whole LP's cost).

    ``problem.r_max``: one budget for every stage, or one per stage: stage ``s``'s freeze ratios sum to at most
    ``r_max_s`` times its number of freezable actions.

    ``solution.budget_sensitivity[s]`` (every stage): ms of batch time one more 0.01 of ``r_max_s`` saves,
    ``dual_s * n_s * 0.01`` (:func:`planner.lp.budget.sensitivity`; 0 where ``r_max_s = 1``), with ``dual_s``
    the shadow price HiGHS returns for stage ``s``'s budget row in the stage-1 (min ``T``) solve.  For the
    region method these are the duals of the last round's region LP, used as they are (no extra solve):
    the region LP with budgets ``b`` is a relaxation of the whole LP for *every* ``b`` (its border bounds
    come from all-frozen paths, which do not depend on ``b``), so ``T_R(b) <= T*(b)``, and at the solved
    budgets ``b0`` the two are equal.  By LP duality ``T_R(b) >= T_R(b0) + y . (b - b0)`` for the region's
    optimal row duals ``y`` (they stay dual feasible for every ``b``), hence
    ``T*(b) >= T*(b0) + y . (b - b0)``: ``y`` is a subgradient of the whole LP's ``T*`` at ``b0``, exactly
    what a dual of the whole LP is.  Each component therefore lies between the left and right derivative
    of ``T*`` in that stage's budget, and equals the derivative wherever ``T*`` has no kink there (a stage
    whose budget row is not in the region LP gets 0, a valid component of the same subgradient).
    """
    _check_options(solver, gap, fallback_gap, _config)
    t0 = time.perf_counter()
    arrays = problem.arrays
    if solver == "auto":
        solver = "region" if len(arrays.names) - 2 >= _REGION_MIN_ACTIONS else "whole"
        if gap is None and solver == "region":
            gap = DEFAULT_GAP
            fallback_gap = DEFAULT_FALLBACK_GAP if fallback_gap is None else fallback_gap
    result, method = None, "region"
    if solver == "region" and (arrays.delta > 0).any():
        result = solve_region(
            arrays, problem.r_max, options, gap=float(gap or 0.0), fallback_gap=float(fallback_gap or 0.0)
        )
        if result is not None and result.lower_bound is not None:
            method = "region-bounded"
    if result is None:
        method = _config
        result = solve_whole(arrays, problem.r_max, _config, options)
    sol = _solution(problem, result, f"highs-{method}")
    sol.seconds = time.perf_counter() - t0
    if stats is not None:
        stats.update(result.stats, actions=len(sol.durations), total_s=sol.seconds)
    return sol


def _check_options(solver: str, gap: float | None, fallback_gap: float | None, config: str) -> None:
    if solver not in SOLVERS:
        raise PlannerError(f"unknown solver {solver!r} (choose {', '.join(SOLVERS)})")
    for name, g in (("gap", gap), ("fallback_gap", fallback_gap)):
        if g is not None and (isinstance(g, bool) or not isinstance(g, (int, float)) or not 0 <= g < 1):
            raise PlannerError(f"{name} must be a number in [0, 1), got {g!r}")
    if config not in CONFIGS:
        raise PlannerError(f"unknown HiGHS configuration {config!r} (choose {', '.join(CONFIGS)})")


def _solution(problem: Problem, result: LPResult, solver: str) -> LPSolution:
    """The durations of ``result``'s ratios and their longest path, checked against its batch time."""
    arrays, weights = problem.arrays, problem.weights
    t3 = time.perf_counter()
    d = arrays.wmax.copy()  # w_max per node (source and sink 0), then each frozen action's duration
    frozen = np.flatnonzero(result.ratios > 0)
    lo = np.fromiter(
        map(weights.w_min.__getitem__, [arrays.names[i] for i in frozen.tolist()]), np.float64, frozen.size
    )
    hi = d[frozen]
    d[frozen] = np.minimum(hi, np.maximum(lo, hi - (hi - lo) * result.ratios[frozen]))
    makespan, starts, path = problem.longest_path(d)
    act = action_nodes(len(arrays.names), arrays.src_i, arrays.snk_i)
    durations = dict(zip(map(arrays.names.__getitem__, act.tolist()), d[act].tolist()))
    if not math.isclose(makespan, result.batch_time, rel_tol=1e-6, abs_tol=1e-6):
        raise PlannerError(
            f"LP batch time {result.batch_time:.9g} does not match the longest path {makespan:.9g} of its durations"
        )
    sens = sensitivity(result.budget_duals, stage_counts(arrays), problem.r_max, problem.num_stages)
    lower = makespan if result.lower_bound is None else min(result.lower_bound, makespan)
    result.stats["check_s"] = time.perf_counter() - t3
    return LPSolution(
        durations,
        starts,
        makespan,
        "optimal",
        0.0,
        solver,
        sens,
        lower_bound=lower,
        gap_target=result.gap_target,
        critical_path=path,
    )
