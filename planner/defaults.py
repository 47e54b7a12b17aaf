"""The one set of planning defaults, shared by ``python -m planner plan`` / ``sweep`` and the runtime
(``timelyfreeze.config.freeze``'s ``[freeze]`` defaults import them), so that planning a run's trace offline remakes
the plan that run made.  Each is a switch the CLI turns off with a ``--no-...`` flag; the lower-bound cliff rule,
off by default, is turned on with ``--cliff``."""

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
CLIFF = False
"""A stage whose all-frozen backward also drops its input-gradient work (a lower-bound *cliff*,
``planner.timing.cliff``) plans partial ratios on the input-gradient floor instead.  Off: the rule was designed
on the 12 runs it was first scored on, and on 36 held-out runs it never improved a batch prediction
(``docs/results/authors-logs/heldout.md``); ``python -m planner plan --cliff`` turns it on."""

PLAN_DEFAULTS = {
    "estimator": DEFAULT_ESTIMATOR,
    "comm": COMM,
    "gaps": GAPS,
    "anchor": ANCHOR,
    "jitter": JITTER,
    "cliff": CLIFF,
}
"""Keyword arguments of :func:`planner.plan.plan_from_trace` that make the runtime's plan."""
