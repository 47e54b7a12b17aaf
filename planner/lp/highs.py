"""The lexicographic two-stage HiGHS solve of the freeze LP built by :mod:`planner.lp.model`.

Stage 1 minimises the batch time ``T``; stage 2 keeps ``T <= within_tol(T*)`` (``T*`` plus its resolution,
:mod:`planner.lp.problem`) and minimises the total freezing ``sum r_v``.  No big-M weight.

Invariants:

* with ``use_basis`` (the default configuration), stage 1 starts dual simplex from the model's crafted
  basis (every start variable and ``T`` basic with one tight predecessor row, every freeze ratio
  nonbasic at a bound), which is dual feasible;
* stage 2 bounds ``T`` by ``within_tol(T*) = T* (1 + 1e-9) + 1e-9``.  With ``on_face`` (the default
  configuration) it runs on the stage-1 optimal face (complementary slackness, exact): columns with a
  stage-1 reduced cost above ``_FIX_TOL`` are fixed at their value and rows with a dual above it become
  equalities, so every feasible point is stage-1 optimal (``T = T*``) and presolve shrinks the model.
  Without it, stage 2 is a fresh model pruned to the paths that can reach ``T*``;
* every configuration in :data:`CONFIGS` reaches the same lexicographic optimum (the face does not use
  the slack, a fresh model does: the problem's ``min_delta`` keeps that from moving any freeze
  ratio by more than ``planner.lp.problem.FREEZE_RESOLUTION``); they differ only in speed (measurements:
  ``docs/planner-solver-notes.md``);
* the stage-1 row duals are read once: for the optimal face and for the budget rows' shadow prices
  (:func:`budget_duals`, the budget sensitivity of :mod:`planner.lp.budget`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import highspy
import numpy as np

from planner.errors import PlannerError
from planner.lp.arrays import DagArrays
from planner.lp.budget import RMax
from planner.lp.model import LPModel, build_lp
from planner.lp.problem import within_tol


@dataclass
class LPResult:
    """One solve of the freeze LP on a :class:`planner.lp.arrays.DagArrays`."""

    batch_time: float
    """The batch time reached (ms): ``T*``, or for a bounded region result its feasible plan's."""
    ratios: np.ndarray
    """The freeze ratio of every node of the arrays (0 for fixed actions, source and sink)."""
    budget_duals: dict[int, float]
    """Stage-1 shadow price of each stage's budget row (:func:`budget_duals`)."""
    stats: dict[str, Any] = field(default_factory=dict)
    """Model sizes and timings (what ``stats`` of :func:`planner.lp.solve.solve_freeze_lp` receives)."""
    lower_bound: float | None = None
    """Bounded region result only: the certified lower bound of ``T*`` (an exact result has none)."""
    gap_target: float | None = None
    """Bounded region result only: the gap asked for, where the plan returned misses it (``fallback_gap``)."""


class Config(NamedTuple):
    """One HiGHS configuration of the whole-LP solve."""

    options: dict[str, object]  # HiGHS options
    use_basis: bool  # start from the model's crafted basis
    basis_start: str  # stage-1 crafted start: "frozen", "critical" or "auto" (by schedule, see solve_whole)
    on_face: bool  # stage 2 on the stage-1 optimal face


_DUAL_DEVEX = {"solver": "simplex", "simplex_strategy": 1, "simplex_dual_edge_weight_strategy": 1}
CONFIGS: dict[str, Config] = {
    "fast": Config(_DUAL_DEVEX, True, "auto", True),
    "dual": Config(_DUAL_DEVEX, True, "frozen", False),
    "dual-dse": Config({"solver": "simplex", "simplex_strategy": 1}, True, "frozen", False),
    "primal": Config({"solver": "simplex", "simplex_strategy": 4}, True, "frozen", False),
    "slack": Config({"solver": "simplex"}, False, "frozen", False),
    "ipx": Config({"solver": "ipx"}, False, "frozen", False),
}
"""Whole-LP configurations by name.  Users get :data:`DEFAULT_CONFIG`; the others (all exact) are kept
for the tests and ``scripts/bench_planner.py`` (private ``_config`` of :func:`planner.lp.solve.solve_freeze_lp`)."""
DEFAULT_CONFIG = "fast"
_FIX_TOL = 1e-6
"""A stage-1 reduced cost or row dual larger than this (objective: T in ms) fixes its column / row in
stage 2.  Genuine duals here are flows and freeze prices (>= ~1e-4); numerical zeros are ~1e-9."""


def _status_name(h, status) -> str:
    try:
        return h.modelStatusToString(status)
    except Exception:  # pragma: no cover - older highspy
        return str(status)


def _highs_lp(m: LPModel, col_lower=None, col_upper=None, row_lower=None, row_upper=None, cost=None):

    lp = highspy.HighsLp()
    lp.num_col_ = m.num_col
    lp.num_row_ = m.num_row
    lp.col_cost_ = m.col_cost if cost is None else cost
    lp.col_lower_ = m.col_lower if col_lower is None else col_lower
    lp.col_upper_ = m.col_upper if col_upper is None else col_upper
    lp.row_lower_ = m.row_lower if row_lower is None else row_lower
    lp.row_upper_ = m.row_upper if row_upper is None else row_upper
    a = lp.a_matrix_
    a.format_ = highspy.MatrixFormat.kRowwise
    a.num_col_ = m.num_col
    a.num_row_ = m.num_row
    a.start_ = m.start.astype(np.int32)
    a.index_ = m.index
    a.value_ = m.value
    return lp


def _run(
    m: LPModel,
    opts: dict[str, object],
    use_basis: bool,
    what: str,
    lp=None,
) -> tuple[np.ndarray, int, object]:
    """Solve one stage with HiGHS; returns the column values, the simplex iteration count and the solution
    (with duals).  ``lp`` (a ``HighsLp``) replaces the model built from ``m``."""

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    for k, v in opts.items():
        if h.setOptionValue(k, v) != highspy.HighsStatus.kOk:
            raise PlannerError(f"HiGHS rejected option {k}={v!r}")
    if lp is None:
        lp = _highs_lp(m)
    if h.passModel(lp) != highspy.HighsStatus.kOk:
        raise PlannerError(f"HiGHS rejected the {what} model")
    if use_basis:
        # Start variables and T basic, each with its tight tree row at bound; budget rows and the other
        # precedence rows basic; freeze ratios at 1 (stage 1) or 0 (stage 2).
        S = highspy.HighsBasisStatus
        nr = len(m.r_actions)
        b = highspy.HighsBasis()
        if m.r_upper is not None:
            b.col_status = [S.kUpper if x else S.kLower for x in m.r_upper.tolist()] + [S.kBasic] * (m.num_col - nr)
        else:
            b.col_status = [S.kUpper if m.r_at_upper else S.kLower] * nr + [S.kBasic] * (m.num_col - nr)
        rs = [S.kBasic] * m.num_row
        for r in m.tree_rows.tolist():
            rs[r] = S.kLower
        b.row_status = rs
        b.valid = True
        if h.setBasis(b) != highspy.HighsStatus.kOk:  # pragma: no cover - the basis is square by construction
            raise PlannerError(f"HiGHS rejected the {what} starting basis")
    h.run()
    st = h.getModelStatus()
    if st != highspy.HighsModelStatus.kOptimal:
        raise PlannerError(f"HiGHS {what} solve failed: model status {_status_name(h, st)!r}")
    sol = h.getSolution()
    return np.asarray(sol.col_value), int(h.getInfo().simplex_iteration_count), sol


def _face_lp(m: LPModel, sol, rd: np.ndarray, t_bound: float):
    """Stage 2 on the stage-1 model: objective ``sum r``, ``T <= t_bound``, restricted to the optimal face.

    Complementary slackness: with ``(y, d)`` one optimal dual of stage 1 (``rd``: its row duals), the
    optimal solutions of stage 1 are exactly the feasible points with every column of nonzero reduced cost
    at its bound and every row of nonzero dual tight.  Fixing those (exact) lets presolve remove most of
    the model.  Returns the ``HighsLp`` and the numbers of fixed columns and rows.
    """
    x = np.asarray(sol.col_value)
    cd = np.asarray(sol.col_dual)
    cl, cu = m.col_lower.copy(), m.col_upper.copy()
    fc = np.abs(cd) > _FIX_TOL
    fc[m.t_col] = False
    xv = np.clip(x[fc], cl[fc], cu[fc])
    cl[fc] = xv
    cu[fc] = xv
    cu[m.t_col] = t_bound
    rl, ru = m.row_lower.copy(), m.row_upper.copy()
    fr = np.abs(rd) > _FIX_TOL
    lo_side = fr & np.isfinite(rl) & ~np.isfinite(ru)
    hi_side = fr & np.isfinite(ru) & ~np.isfinite(rl)
    ru[lo_side] = rl[lo_side]
    rl[hi_side] = ru[hi_side]
    cost = np.zeros(m.num_col)
    cost[: len(m.r_actions)] = 1.0
    return _highs_lp(m, cl, cu, rl, ru, cost), int(fc.sum()), int((lo_side | hi_side).sum())


def budget_duals(m: LPModel, rd: np.ndarray) -> dict[int, float]:
    """Shadow price (ms of ``T`` per unit of budget, ``>= 0``) of each budget row of the stage-1 model ``m``,
    by stage, from its row duals ``rd``.  HiGHS's row dual of a minimisation is ``d objective / d bound``:
    ``<= 0`` for a ``<=`` row, so the shadow price is its negation (clipped at 0 against round-off)."""
    first = m.num_row - len(m.budget_stages or ())
    return {s: max(0.0, -float(y)) for s, y in zip(m.budget_stages or (), rd[first:].tolist())}


def solve_lexicographic(arrays: DagArrays, r_max: RMax, cfg: Config) -> LPResult:
    """Both LP stages on ``arrays`` with the configuration ``cfg`` (its ``basis_start`` "frozen" or "critical");
    stage 2 keeps ``T <= within_tol(T*)``."""
    t0 = time.perf_counter()
    m1 = build_lp(arrays, r_max, basis_start=cfg.basis_start)
    t1 = time.perf_counter()
    col, it1, sol1 = _run(m1, cfg.options, cfg.use_basis, "batch-time")
    t_star = float(col[m1.t_col])
    t2 = time.perf_counter()
    rd = np.asarray(sol1.row_dual)
    r = np.zeros(len(arrays.names))
    stage2: dict[str, Any] = dict(cols2=0, rows2=0, nnz2=0, build2_s=0.0, iters2=0, fixed_cols2=0, fixed_rows2=0)
    if m1.r_actions:
        _least_freezing(arrays, r_max, cfg, m1, sol1, rd, within_tol(t_star), r, stage2)
    t3 = time.perf_counter()
    stats = dict(
        cols=m1.num_col,
        rows=m1.num_row,
        nnz=m1.nnz,
        build1_s=t1 - t0,
        solve1_s=t2 - t1,
        stage2_s=t3 - t2,
        iters1=it1,
        stage1_start=cfg.basis_start,
        **stage2,
    )
    return LPResult(t_star, r, budget_duals(m1, rd), stats)


def _least_freezing(
    arrays: DagArrays,
    r_max: RMax,
    cfg: Config,
    m1: LPModel,
    sol1,
    rd: np.ndarray,
    t_bound: float,
    r: np.ndarray,
    stats: dict[str, Any],
) -> None:
    """Stage 2 (``T <= t_bound``, min ``sum r``) into ``r``, with its sizes and timings into ``stats``: on the
    stage-1 optimal face with ``cfg.on_face`` (falling back to a fresh model on numerical trouble), else on a
    fresh model pruned to the paths that can reach ``t_bound``."""
    if cfg.on_face:
        tb = time.perf_counter()
        lp2, fc, fr = _face_lp(m1, sol1, rd, t_bound)
        stats.update(fixed_cols2=fc, fixed_rows2=fr, build2_s=time.perf_counter() - tb)
        try:
            col2, it2, _ = _run(m1, {**cfg.options, "presolve": "on"}, False, "least-freezing", lp=lp2)
            frz = np.flatnonzero(arrays.delta > 0)
            r[frz] = np.clip(col2[: frz.size], 0.0, 1.0)  # stage 1 keeps every freezable action (same order)
            stats.update(cols2=m1.num_col, rows2=m1.num_row, nnz2=m1.nnz, iters2=it2)
            return
        except PlannerError:  # pragma: no cover - numerical trouble on the face: solve stage 2 in full
            pass
    m2 = build_lp(arrays, r_max, t_bound=t_bound)
    stats.update(cols2=m2.num_col, rows2=m2.num_row, nnz2=m2.nnz, build2_s=stats["build2_s"] + m2.build_seconds)
    if m2.r_actions:
        col2, it2, _ = _run(m2, cfg.options, cfg.use_basis, "least-freezing")
        idx = {a: i for i, a in enumerate(arrays.names)}
        r[[idx[a] for a in m2.r_actions]] = np.clip(col2[: len(m2.r_actions)], 0.0, 1.0)
        stats["iters2"] = it2


def solve_whole(
    arrays: DagArrays,
    r_max: RMax,
    config: str = DEFAULT_CONFIG,
    options: dict[str, object] | None = None,
) -> LPResult:
    """Both stages on the whole LP with the configuration ``config`` (a key of :data:`CONFIGS`) plus the
    extra HiGHS ``options``.  ``basis_start="auto"``: the critical-path start for full-backward schedules,
    the all-frozen start for split (I/W) ones, whichever measured faster."""
    cfg = CONFIGS[config]
    basis_start = cfg.basis_start
    if basis_start == "auto":
        basis_start = "frozen" if arrays.split else "critical"
    return solve_lexicographic(
        arrays, r_max, cfg._replace(options={**cfg.options, **(options or {})}, basis_start=basis_start)
    )
