"""The one set of planning defaults, shared by ``python -m planner plan`` / ``sweep`` and the runtime
(``timelyfreeze.config.freeze``'s ``[freeze]`` defaults import them), so that planning a run's trace offline remakes
the plan that run made.  Each is a switch the CLI turns off with a ``--no-...`` flag."""

from __future__ import annotations

from planner.timing.estimate import DEFAULT_ESTIMATOR

__all__ = ["ANCHOR", "CLIFF", "COMM", "DEFAULT_ESTIMATOR", "GAPS", "JITTER", "PLAN_DEFAULTS"]

COMM = True
"""Delays on cross-rank edges measured in the trace (``planner.timing.comm``)."""
GAPS = True
"""Fixed costs between a rank's consecutive actions (``planner.timing.gaps``; ``[freeze.advanced] gap_model``)."""
ANCHOR = True
"""Lower-bound window brought to the upper window's machine speed (``planner.timing.monitor``;
``[freeze.advanced] anchor_monitoring``)."""
JITTER = True
"""The plan records the factors the monitoring windows' jitter adds to each prediction (``planner.timing.jitter``;
``[freeze.advanced] jitter_model``)."""
CLIFF = True
"""A stage whose all-frozen backward also drops its input-gradient work (a lower-bound *cliff*,
``planner.timing.cliff``) plans partial ratios on the input-gradient floor instead."""

PLAN_DEFAULTS = {
    "estimator": DEFAULT_ESTIMATOR,
    "comm": COMM,
    "gaps": GAPS,
    "anchor": ANCHOR,
    "jitter": JITTER,
    "cliff": CLIFF,
}
"""Keyword arguments of :func:`planner.plan.plan_from_trace` that make the runtime's plan."""
