"""Freeze budgets: one ``r_max`` for every stage or one per stage, and what one more 0.01 of it is worth.

The LP's budget rows are per stage: ``sum of the stage's freeze ratios <= r_max_s * n_s`` with ``n_s`` the
stage's freezable actions.  ``r_max`` is either one number (every stage's ``r_max_s``) or a sequence of
``num_stages`` numbers; every value lies in ``[0, 1]``.  A scalar stays a ``float`` all the way through the
planner (the scalar path is unchanged, bit for bit); a per-stage budget is a ``tuple`` of floats.

Budget sensitivity (:func:`sensitivity`): ``T*(b)``, the optimal batch time of the LP's first stage (min
``T``) as a function of the budgets ``b_s = r_max_s * n_s``, is convex and piecewise linear.  The
nonnegative shadow price ``dual_s`` of stage ``s``'s budget row gives ``-dT*/db_s``, so one more 0.01 of
``r_max_s`` saves ``dual_s * n_s * 0.01`` ms of batch time.  Where ``T*`` has a kink (degenerate optimum)
the shadow price is not unique: any one lies between the saving of raising the budget (right derivative)
and the cost of lowering it (left derivative), i.e. the value is an upper bound of the first-order saving
of a raise and a lower bound of the first-order cost of a cut (at ``r_max_s = 0``, only the former).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Union

import numpy as np

from planner.errors import PlannerError

RMax = Union[float, tuple[float, ...]]
"""A checked budget: one ``float`` for every stage, or a tuple of one ``float`` per stage."""

SENSITIVITY_STEP = 0.01
"""The budget step the sensitivity is quoted for: ms of batch time saved per +0.01 of ``r_max_s``."""

_DUAL_TOL = 1e-7
"""Shadow prices (ms per unit of budget) at or below this are numerical zeros (HiGHS's dual tolerance)."""


def _unit(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0.0 <= float(x) <= 1.0


def per_stage(r_max: object) -> bool:
    """Whether ``r_max`` is given per stage (a sequence or array of values; a string is not)."""
    if isinstance(r_max, np.ndarray):
        return r_max.ndim > 0
    return isinstance(r_max, Sequence) and not isinstance(r_max, (str, bytes))


def check_r_max(r_max: object, num_stages: int | None = None, name: str = "r_max") -> RMax:
    """``r_max`` checked: a number in ``[0, 1]`` (returned as ``float``) or a sequence (not a string) of
    ``num_stages`` numbers in ``[0, 1]`` (returned as a tuple of floats; ``num_stages=None``: any non-zero
    length).  A problem is a one-line :class:`PlannerError` starting with ``name``, e.g.
    ``r_max: 3 values for 4 stages`` or ``r_max[2] must be a number in [0, 1], got 1.5``."""
    if not per_stage(r_max):
        if isinstance(r_max, np.ndarray):
            r_max = r_max.item()
        if not _unit(r_max):
            raise PlannerError(f"{name} must be a number in [0, 1], got {r_max!r}")
        return float(r_max)  # type: ignore[arg-type]
    values = list(r_max)
    if num_stages is not None and len(values) != num_stages:
        raise PlannerError(
            f"{name}: {len(values)} value{'s' if len(values) != 1 else ''} for {num_stages} "
            f"stage{'s' if num_stages != 1 else ''}"
        )
    if not values:
        raise PlannerError(f"{name}: no values")
    for s, x in enumerate(values):
        if isinstance(x, np.generic):
            x = x.item()
        if not _unit(x):
            raise PlannerError(f"{name}[{s}] must be a number in [0, 1], got {x!r}")
    return tuple(float(x) for x in values)


def stage_r_max(r_max: RMax | Sequence[float], stage: int) -> float:
    """``r_max_s`` of stage ``stage`` (a checked budget)."""
    return float(r_max) if isinstance(r_max, (int, float)) else float(r_max[stage])


def node_r_max(r_max: RMax, stage: np.ndarray) -> float | np.ndarray:
    """``r_max`` per node of an array of stages (``-1`` for source, sink and dummies: 0); the scalar as is."""
    if isinstance(r_max, float):
        return r_max
    per = np.asarray(r_max, dtype=np.float64)
    return np.where(stage >= 0, per[np.maximum(stage, 0)], 0.0)


def format_r_max(r_max: float | Sequence[float]) -> str:
    """``0.8`` for one budget, ``0.5,0.8,0.8,0.6`` (the CLI's syntax) for one per stage."""
    if isinstance(r_max, (int, float)):
        return f"{r_max:g}"
    return ",".join(f"{x:g}" for x in r_max)


def parse_r_max(text: str) -> float | tuple[float, ...]:
    """The CLI's ``--r-max``: ``0.8`` (every stage) or ``0.5,0.8,0.8,0.6`` (one per stage); the stage count is
    checked later, against the trace (:func:`check_r_max`)."""
    parts = [p.strip() for p in text.split(",")]
    values: list[float] = []
    for s, p in enumerate(parts):
        try:
            v = float(p)
        except ValueError:
            v = None
        if v is None or not 0.0 <= v <= 1.0:  # nan fails too
            where = "r_max" if len(parts) == 1 else f"r_max[{s}]"
            raise PlannerError(f"{where} must be a number in [0, 1], got {p!r}")
        values.append(v)
    return values[0] if len(values) == 1 else tuple(values)


def sensitivity(
    duals: Mapping[int, float],
    counts: Mapping[int, int],
    r_max: RMax,
    num_stages: int,
) -> dict[int, float]:
    """Per stage ``0 .. num_stages-1``: ms of batch time saved per +0.01 of ``r_max_s``,
    ``dual_s * n_s * 0.01``, from the nonnegative shadow prices ``duals`` (ms per unit of budget ``b_s``;
    a stage without a budget row is absent) and the freezable actions per stage ``counts``.  0 for a stage
    with ``r_max_s >= 1`` (every action may be frozen: the budget does not bind, ``T*`` is flat beyond it),
    a stage with nothing to freeze, and shadow prices within the dual tolerance of 0."""
    out: dict[int, float] = {}
    for s in range(num_stages):
        y = float(duals.get(s, 0.0))
        n = int(counts.get(s, 0))
        out[s] = y * n * SENSITIVITY_STEP if y > _DUAL_TOL and n > 0 and stage_r_max(r_max, s) < 1.0 else 0.0
    return out
