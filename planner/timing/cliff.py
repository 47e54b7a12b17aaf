"""Lower-bound cliffs: a stage whose all-frozen backward is not the end of a straight line (no torch).

The LP takes an action's duration as linear in its freeze ratio between ``w_max`` (nothing frozen) and
``w_min`` (everything frozen).  For most stages ``w_min`` is the input-gradient (dX) work that remains when
no weight gradient is computed, and partial ratios interpolate well.  A *first* stage that freezes every
trainable tensor (the embeddings included) needs no input gradient at all: its backward does nothing, and
``w_min`` drops to ~0.  At any partial ratio the dX chain through its layers still runs, so the true
duration is far above the straight line to 0 (the paper authors' 1F1B runs: stage 0's B planned 22 ms,
measured 29-31 ms).  This project's runtime keeps an anchor tensor on the first stage, so its own traces
have no cliff; traces of other implementations (``planner.trace.authors_log``) can.

The rule of :func:`find_cliffs`:

* The *floor share* of a stage is the median over its microbatches of (all-frozen backward) / (nothing
  frozen backward), the backward being ``B``, or ``I + W`` for a split backward (``OVERLAP_F_B`` pairs are
  left out: their forward part hides the share).
* A stage is a cliff when its share is below half the median share of the other stages (needs two stages
  with a backward).  Its full backwards (``B``) then get ``w_min = max(w_min, share x w_max)`` with ``share`` the
  other stages' median: the LP keeps its form, and plans the partial ratios it can reach on that floor
  (it no longer sees the step to ~0 at ratio 1: a plan that freezes such a stage whole is predicted slower than
  it is, 12-16 % of the batch on the authors' held-out ZBV runs).
* :func:`floor_duration` is the duration a cliff stage's action takes at a given ratio on the original
  bounds: ``w_min`` at ratio 1, else the straight line to the floor (used to predict a plan made without
  this rule, e.g. the authors' own).

Off by default (``planner.defaults.CLIFF``; ``python -m planner plan --cliff``): designed on the authors' 12
development runs, it never improved a batch prediction of their 36 held-out runs
(``docs/results/authors-logs/heldout.md``), and no criterion read from the trace alone tells where it would.
"""

from __future__ import annotations

import statistics

from planner.schedule.actions import action_fields, action_kind, parse_action
from planner.trace.load import NodeWeights

__all__ = ["CLIFF_SHARE", "apply_cliffs", "find_cliffs", "floor_duration", "stage_shares"]

CLIFF_SHARE = 0.5
"""A stage is a cliff when its floor share is below this fraction of the other stages' median share."""


def stage_shares(weights: NodeWeights) -> dict[int, float]:
    """Per stage with a backward, the median over microbatches of all-frozen over nothing-frozen backward."""
    names = list(weights.w_max)
    fields = zip(*action_fields(names))
    parts: dict[tuple[int, int], list[str]] = {}
    for a, (s, k, m) in zip(names, fields):
        if k in ("B", "I", "W"):
            parts.setdefault((s, m), []).append(a)
    by_stage: dict[int, list[float]] = {}
    for (s, _), acts in parts.items():
        hi = sum(weights.w_max[a] for a in acts)
        if hi > 0:
            by_stage.setdefault(s, []).append(sum(weights.w_min[a] for a in acts) / hi)
    return {s: statistics.median(v) for s, v in sorted(by_stage.items())}


def find_cliffs(weights: NodeWeights) -> dict:
    """``{"stages": [...], "share": s, "shares": {stage: share}}``: the cliff stages and the floor share of the
    others (module docstring); ``stages`` is empty when there is none."""
    shares = stage_shares(weights)
    out = {"stages": [], "share": None, "shares": {str(s): round(v, 6) for s, v in shares.items()}}
    if len(shares) < 2:
        return out
    for s, v in shares.items():
        others = statistics.median(x for t, x in shares.items() if t != s)
        if v < CLIFF_SHARE * others:
            out["stages"].append(s)
    if out["stages"]:
        out["share"] = statistics.median(x for t, x in shares.items() if t not in out["stages"])
    return out


def apply_cliffs(weights: NodeWeights, cliffs: dict) -> NodeWeights:
    """``weights`` with every freezable action of a cliff stage on the floor (module docstring)."""
    if not cliffs["stages"]:
        return weights
    stages, share = set(cliffs["stages"]), cliffs["share"]
    w_min = dict(weights.w_min)
    for a, hi in weights.w_max.items():
        act = parse_action(a)
        if act.stage in stages and action_kind(a) == "B":
            w_min[a] = min(hi, max(w_min[a], share * hi))
    return NodeWeights(w_min, dict(weights.w_max))


def floor_duration(w_min: float, w_max: float, ratio: float, share: float) -> float:
    """Duration of a cliff stage's action at ``ratio`` (original bounds): ``w_min`` when everything is frozen,
    else the straight line from ``w_max`` to the floor ``share x w_max``."""
    if ratio >= 1.0 - 1e-9:
        return w_min
    return w_max - ratio * (w_max - max(w_min, share * w_max))
