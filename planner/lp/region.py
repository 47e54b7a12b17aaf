"""The region method: the freeze LP solved on a growing set of near-critical actions, exactly.

The LP on a region, with every path through the left-out actions replaced by its all-frozen length
(:func:`planner.lp.arrays.region_arrays`), is a relaxation of the whole LP: its batch time is a lower bound
of ``T*`` and, at that batch time, its least freezing a lower bound of the least freezing.  When its freeze ratios, with
everything outside unfrozen, give the whole batch that same batch time, they are the whole LP's
lexicographic optimum (no heuristic enters the result).  Otherwise the actions of the paths that are
too long join the region and the round repeats.

Why: the simplex on these DAGs costs O(actions) per iteration (a duration change moves every later start
in the basis tree), so a several times smaller model needing several times fewer iterations is much
cheaper.  Where the near-critical set is most of the batch (Interleaved1F1B), the region grows past
``_REGION_MAX_FRACTION`` and :func:`solve_region` returns ``None``: the caller solves the whole LP.

With a gap tolerance (``gap > 0``, the *bounded* method) each round also builds a feasible plan of the
whole batch: the region's freeze ratios, and outside it each stage's budget left over by the region
spread evenly over the stage's left-out actions (:func:`spread_leftover`); when that plan is not within
the gap, :func:`rebalance` moves the freezing it does not need onto its too-long paths, a few linear passes.
Its longest path ``T_U`` is an upper bound and the region LP's ``T_R`` a lower bound of ``T*``; the rounds
stop when ``T_U <= T_R (1 + gap)``, and a greedy pass (:func:`unfreeze_slack`) then gives back the freezing that
the plan does not need to stay within ``T_U``.  The plan's batch time is then certified within ``gap`` of
the optimum; its total freezing is not certified least (measured: 48-61 % more than the exact optimum's
on real-like pp 16 x 2 x 256 traces, ``docs/planner-solver-notes.md``; ``gap=0`` gives the exact plan).
Growth adds the actions of that plan's too-long paths, the longest first and at most doubling the region
(``_BOUNDED_GROWTH``), so the region stays near the few co-critical ranks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from planner.lp.arrays import DagArrays, Paths, region_arrays, stage_budgets, stage_counts
from planner.lp.budget import RMax, node_r_max
from planner.lp.highs import CONFIGS, DEFAULT_CONFIG, Config, LPResult, solve_lexicographic
from planner.lp.problem import within_tol

_REGION_START = 1e-3
"""First region: actions on paths within this fraction of the longest one (budget spread evenly)."""
_REGION_BAND = 0.1
"""When a round's paths overshoot so widely that adding all their actions would more than double the
region, only the actions of paths within this fraction of the overshoot from the longest are added."""
_REGION_MAX_FRACTION = 0.6
"""Past this fraction of all actions the region solve stops and the whole LP is solved instead."""
_REGION_MAX_ROUNDS = 50
_BOUNDED_GROWTH = 1.0
"""Bounded method: a round adds the left-out actions on paths of its feasible plan longer than
``T_R (1 + gap / 2)``, the longest first, at most this many times the region's size."""
_SETTLE_FRACTION = 0.4
"""With a ``fallback_gap``: a round whose next region would pass this fraction of the actions returns its best
plan when that is within ``fallback_gap`` (region LPs grow superlinearly: on replayed measured ZBV timings at
pp 32 x 2 x 512 the rounds' LPs took 0.6 s at 21k nodes, 2.3 s at 34k, 24 s at 58k, and the lower bound had
reached the optimum within 0.05 % in the second)."""
_REBALANCE_PASSES = 12
"""Bounded method: at most this many :func:`rebalance` passes per round."""
_REBALANCE_FROM = 10.0
"""A :func:`rebalance` pass that leaves the plan farther than this many gaps above ``T_R`` is the last of its
round (the lower bound is usually not tight yet and more passes are wasted: on simulate's Interleaved1F1B
32 x 2 x 512 trace rounds 1-2 started 1.4-2 % above a ``T_R`` 0.38 % below ``T*``; the round that certified
started at 0.38 %)."""
_REBALANCE_PROGRESS = 0.3
"""A :func:`rebalance` pass that closes less than this share of the distance from the batch time to the
target ends the passes of the round."""


def spread_leftover(arrays: DagArrays, r: np.ndarray, keep: np.ndarray, r_max: RMax) -> np.ndarray:
    """``r`` with every left-out freezable action (not in ``keep``) at its stage's leftover share: the stage's
    budget ``r_max_s * n_s`` minus what the kept actions use, spread evenly over its left-out actions (capped
    at 1).  Every stage stays within its budget."""
    frz = arrays.delta > 0
    budget = stage_budgets(arrays, r_max)
    ns = budget.size
    inside, out = frz & keep, frz & ~keep
    used = np.bincount(arrays.stage[inside], weights=r[inside], minlength=ns)
    n_out = np.bincount(arrays.stage[out], minlength=ns)
    share = np.clip((budget - used) / np.maximum(n_out, 1), 0.0, 1.0)
    r = r.copy()
    r[out] = share[arrays.stage[out]]
    return r


def unfreeze_slack(
    arrays: DagArrays,
    paths: Paths,
    r: np.ndarray,
    target: float,
    tail: np.ndarray | None = None,
    only: np.ndarray | None = None,
) -> tuple[np.ndarray, float]:
    """``r`` with freezing given back where the batch does not need it to stay within ``target`` ms, and the
    batch time of the result (the latest end of the pass's final schedule).

    One pass in topological order with each action's tail (longest path from its end) taken at the current
    durations: an action's duration grows (its freeze ratio falls) up to ``target - head - tail``, with
    ``head`` its earliest start under the durations already chosen.  Paths through an action keep within
    ``target`` after its change and later changes only see the new heads, so the batch time stays within
    ``target`` when it was (a greedy pass: no action alone can give back more, but the total is not
    minimised).  ``tail``: ``paths.tail`` of ``r``'s durations, when the caller has it.  ``only`` (a mask over
    the nodes): give back freezing on these actions alone, the others keep theirs."""
    d = arrays.wmax - arrays.delta * r
    if tail is None:
        tail = paths.tail(d)
    room = target * (1.0 - 1e-12)
    frz = (arrays.delta > 0) if only is None else (arrays.delta > 0) & only
    # one level of the DAG at a time: a level's heads read only earlier levels' (already updated) durations,
    # so this is the pass in topological order, with its floating-point sums and maxima
    w, wmax, head = d.copy(), arrays.wmax, np.zeros(d.size)
    lay, delay = paths.heads, paths.pdelay
    dl = None if delay is None else delay[lay.entry]
    for a, b, nodes, seg in lay.levels:
        if seg is not None:
            t = head[lay.nbr[a:b]]
            t += w[lay.nbr[a:b]]
            if dl is not None:
                t += dl[a:b]
            head[nodes] = np.maximum(t if seg.size == b - a else np.maximum.reduceat(t, seg), 0.0)
        x = nodes[frz[nodes]]
        if x.size:
            allow = room - head[x] - tail[x]
            grow = allow > w[x]
            x, allow = x[grow], allow[grow]
            w[x] = np.minimum(wmax[x], allow)
    d = w
    out = r.copy()
    f = arrays.delta > 0
    out[f] = np.clip((arrays.wmax[f] - d[f]) / arrays.delta[f], 0.0, 1.0)
    return out, float((head + d).max())


def freeze_and_give_back(arrays: DagArrays, paths: Paths, r_max: RMax, target: float) -> np.ndarray:
    """A feasible plan built from the other end: everything frozen, then freezing given back where the batch
    stays within ``target`` (:func:`unfreeze_slack`), first on each stage's actions outside its budget's worth
    of largest weight-grad savings (its top ``r_max_s n_s`` by ``delta``), then on all; a stage still over its
    budget is scaled down to it.  Every stage stays within its budget; the batch time may exceed ``target``
    where a stage had to be scaled.

    Why: where several ranks are co-critical (nearly balanced stages, measured timings), the critical paths
    run along whole rank chains, so a stage's budget is best spent on its largest savings; the even spread of
    :func:`spread_leftover` and the :func:`rebalance` passes from it stayed 2 % above a lower bound that was
    already the optimum on replayed measured timings at pp 32 x 2 x 512; this plan, rebalanced, 0.5 %
    (``docs/planner-solver-notes.md``)."""
    frz = arrays.delta > 0
    budget = stage_budgets(arrays, r_max)
    ns = budget.size
    idx = np.flatnonzero(frz)
    st = arrays.stage[idx]
    order = np.lexsort((-arrays.delta[idx], st))  # by stage, largest saving first
    ss = st[order]
    pos = np.arange(order.size) - np.searchsorted(ss, ss, side="left")
    top = np.zeros(len(arrays.names), dtype=bool)
    top[idx[order[pos < np.floor(budget[ss] + 1e-9)]]] = True
    r = np.where(frz, 1.0, 0.0)
    r, _ = unfreeze_slack(arrays, paths, r, target, only=~top)
    r, _ = unfreeze_slack(arrays, paths, r, target)
    used = np.bincount(arrays.stage[frz], weights=r[frz], minlength=ns)
    scale = np.minimum(1.0, budget / np.maximum(used, 1e-300))
    return np.where(frz, r * scale[np.maximum(arrays.stage, 0)], 0.0)


def rebalance(
    arrays: DagArrays,
    paths: Paths,
    r: np.ndarray,
    r_max: RMax,
    lower: float,
    gap: float,
) -> tuple[np.ndarray, float, int]:
    """Move freezing of the feasible plan ``r`` to where its batch time is decided: returns the best plan
    found, its batch time and the passes run.

    A pass gives back the freezing the plan does not need to stay within its batch time
    (:func:`unfreeze_slack`), then hands each stage's unused budget to its freezable actions on paths longer
    than ``lower (1 + gap / 2)``, in proportion to how much longer (capped at ratio 1).  Every stage stays
    within its budget, so each plan is feasible and its longest path an upper bound; the passes stop once
    the batch time is within ``lower (1 + gap)``, after :data:`_REBALANCE_PASSES`, or when a pass closes
    less than :data:`_REBALANCE_PROGRESS` of what separates the batch time from the target (the lower
    bound is then probably not tight yet: the region must grow).  A heuristic for the upper bound only;
    what is certified is still the gap to ``lower``.

    Why: the even spread of :func:`spread_leftover` freezes every left-out action alike, so where several
    ranks are co-critical it stays 0.4-1 % above a lower bound that is already the optimum, and the region
    grew past :data:`_REGION_MAX_FRACTION` (the whole LP then took minutes at 65k actions).
    """
    frz = arrays.delta > 0
    budget = stage_budgets(arrays, r_max)
    ns = budget.size
    st = np.maximum(arrays.stage, 0)
    target = lower * (1 + gap / 2)
    d = arrays.wmax - arrays.delta * r
    tail = paths.tail(d)
    best_t = float((d + tail).max())
    best_r, t_prev, passes = r, best_t, 0
    while passes < _REBALANCE_PASSES and best_t > lower * (1 + gap):
        passes += 1
        r, _ = unfreeze_slack(arrays, paths, r, t_prev, tail)
        _, through = _longest(arrays, paths, r)
        over = frz & (through > target)
        used = np.bincount(arrays.stage[frz], weights=r[frz], minlength=ns)
        left = np.maximum(budget - used, 0.0)
        excess = np.where(over, through - target, 0.0)
        per_stage = np.bincount(arrays.stage[frz], weights=excess[frz], minlength=ns)
        r = np.minimum(1.0, r + left[st] * excess / np.maximum(per_stage[st], 1e-300))
        d = arrays.wmax - arrays.delta * r
        tail = paths.tail(d)  # the batch time now, and the next pass's tails
        t_new = float((d + tail).max())
        if t_new < best_t:
            best_r, best_t = r, t_new
        if t_prev - t_new < _REBALANCE_PROGRESS * (t_prev - target) or best_t > lower * (1 + _REBALANCE_FROM * gap):
            break
        t_prev = t_new
    return best_r, best_t, passes


def _longest(arrays: DagArrays, paths: Paths, r: np.ndarray) -> tuple[float, np.ndarray]:
    """Batch time and per-node longest path through each node with freeze ratios ``r``."""
    d = arrays.wmax - arrays.delta * r
    h, t = paths.head_tail(d)
    through = h + d + t
    return float(through.max()), through


def solve_region(
    arrays: DagArrays,
    r_max: RMax,
    options: dict[str, object] | None = None,
    gap: float = 0.0,
    fallback_gap: float = 0.0,
) -> LPResult | None:
    """Solve the LP on a growing set of near-critical actions; ``None`` when that set grows too large.

    Round: solve both stages on the relaxation to the kept actions (:func:`planner.lp.arrays.region_arrays`), giving a
    lower bound ``T_R`` of ``T*`` and, at ``T <= within_tol(T_R)`` (:func:`planner.lp.problem.within_tol`), freeze
    ratios whose sum bounds the least freezing from below.  With every left-out action unfrozen, the longest
    path of the whole batch is computed: if it is within ``within_tol(T_R)``, these ratios reach the lower
    bound of both stages, so they are the lexicographic optimum of the whole LP (exact, no heuristics in the
    result).  Otherwise the actions on the paths longer than that are added and the round repeats.
    The first set: actions within ``_REGION_START`` of the longest path when every freezable action is
    frozen by its stage's ``r_max`` (the budget spread evenly).
    ``options``: extra HiGHS options on top of the default configuration's.
    ``result.budget_duals``: the last round's stage-1 shadow prices of the budget rows; they are a
    subgradient of the whole LP's batch time in the budgets (the region LP is a relaxation for every
    budget and tight at this one; :func:`planner.lp.solve.solve_freeze_lp` has the argument), so no whole-LP
    solve is needed for them.

    ``gap > 0``: the bounded method (module docstring); returns the feasible plan's batch time ``T_U``
    and ratios once ``T_U <= T_R (1 + gap)``, with ``result.lower_bound = T_R`` (an exact result has none);
    its duals are then a subgradient up to the gap: ``T*(b) >= T*(b0) - (T_U - T_R) + y . (b - b0)``.
    A round whose plans miss the gap and whose next region would pass ``_SETTLE_FRACTION`` of the actions (or the
    limit) also tries :func:`freeze_and_give_back`.

    ``fallback_gap > gap``: where no plan is within ``gap`` and the next region would pass ``_SETTLE_FRACTION`` of
    the actions (or the limit), the best plan of all rounds
    is returned when it is within ``fallback_gap`` of the lower bound (``result.gap_target = gap`` says the
    target was missed); otherwise the rounds go on as without it.  ``0``: ``None`` where the region outgrows its
    limit (the caller solves the whole LP).
    """
    cfg = Config({**CONFIGS[DEFAULT_CONFIG].options, **(options or {})}, True, "critical", True)
    rounds = _Rounds(arrays, r_max, gap, fallback_gap)
    paths, n = rounds.paths, len(arrays.names)
    head_min, tail_min = paths.head_tail(arrays.wmax - arrays.delta)
    ref = arrays.wmax - node_r_max(r_max, arrays.stage) * arrays.delta
    h, t = paths.head_tail(ref)
    through = h + ref + t
    keep = through >= through.max() * (1 - _REGION_START)
    for rnd in range(1, _REGION_MAX_ROUNDS + 1):
        if keep.sum() > _REGION_MAX_FRACTION * (n - 2):
            return rounds.settle()
        sub, back = region_arrays(arrays, keep, head_min, tail_min, stage_counts(arrays))
        # both stages also when bounded: the spread and rebalanced plans start from the region's least
        # freezing (from stage 1's vertex alone, simulate's Interleaved1F1B 32 x 2 x 512 fell back to the
        # whole LP, 138 s, where both stages certify in 3 rounds)
        res = solve_lexicographic(sub, r_max, cfg)
        r = rounds.record(rnd, res, back, keep)
        if gap > 0:
            done, out = rounds.bounded(r, res.batch_time, keep)
            if done:
                return out
            continue
        t_full, through = _longest(arrays, paths, r)
        bound = within_tol(res.batch_time)
        if t_full <= bound:
            return rounds.result(res.batch_time, r)
        add = (through > bound) & ~keep
        if add.sum() > keep.sum():  # far off: add only the worst paths' actions
            add = (through >= t_full - _REGION_BAND * (t_full - res.batch_time)) & ~keep
        keep |= add
    return None  # pragma: no cover - the set grows every round, so this needs > _REGION_MAX_ROUNDS rounds


class _Rounds:
    """What the rounds of :func:`solve_region` carry: the stats, the last duals and, for the bounded method,
    the lower bound and the best feasible plan so far."""

    def __init__(self, arrays: DagArrays, r_max: RMax, gap: float, fallback_gap: float) -> None:
        self.ar, self.paths, self.r_max, self.gap, self.fallback_gap = arrays, Paths(arrays), r_max, gap, fallback_gap
        self.stats: dict[str, Any] = {"rounds": 0}
        self.totals = {"iters1": 0, "iters2": 0, "solve1_s": 0.0, "stage2_s": 0.0, "build1_s": 0.0, "build2_s": 0.0}
        self.duals: dict[int, float] = {}
        self.lower = 0.0
        self.best_t, self.best_r = np.inf, None  # the best feasible plan of any round (its batch time, its ratios)

    def record(self, rnd: int, res: LPResult, back: np.ndarray, keep: np.ndarray) -> np.ndarray:
        """Take one round's region solve: its stats and duals; returns its ratios on the whole batch."""
        for k in self.totals:
            self.totals[k] += res.stats[k]
        self.stats.update(res.stats, **self.totals, rounds=rnd, region_actions=int(keep.sum()))
        self.duals = res.budget_duals
        r = np.zeros(len(self.ar.names))
        real = back >= 0
        r[back[real]] = res.ratios[real]
        return r

    def result(self, t: float, r: np.ndarray, lower: float | None = None, gap_target: float | None = None) -> LPResult:
        return LPResult(t, r, self.duals, self.stats, lower, gap_target)

    def settle(self) -> LPResult | None:
        """The bounded method could not reach ``gap``: the best plan when it is within ``fallback_gap``."""
        if self.best_r is None or not self.fallback_gap > self.gap:
            return None
        if self.best_t > self.lower * (1 + self.fallback_gap):
            return None
        rb, t_up = unfreeze_slack(self.ar, self.paths, self.best_r, self.best_t)
        self.stats["upper_bound"] = t_up
        return self.result(t_up, rb, self.lower, self.gap)

    def bounded(self, r: np.ndarray, t_r: float, keep: np.ndarray) -> tuple[bool, LPResult | None]:
        """One round of the bounded method on the region's ratios ``r``: ``(True, result)`` when the rounds end
        (``None``: the whole LP decides), else ``(False, None)`` with ``keep`` grown."""
        arrays, paths, gap = self.ar, self.paths, self.gap
        self.lower = lower = max(self.lower, t_r)
        rb = spread_leftover(arrays, r, keep, self.r_max)
        t_up, through = _longest(arrays, paths, rb)
        add = np.flatnonzero((through > lower * (1 + gap / 2)) & ~keep)
        cap = int(_BOUNDED_GROWTH * keep.sum())
        grown = keep.sum() + min(add.size, cap)
        n_act = len(arrays.names) - 2
        last = add.size == 0 or grown > _REGION_MAX_FRACTION * n_act
        settle_next = last or (self.fallback_gap > gap and grown > _SETTLE_FRACTION * n_act)
        if t_up > lower * (1 + gap):
            rb, t_up = self._improve(rb, t_up, settle_next)
        if t_up < self.best_t:
            self.best_t, self.best_r = t_up, rb
        self.stats["upper_bound"] = t_up
        if t_up <= lower * (1 + gap):
            if _longest(arrays, paths, r)[0] <= within_tol(t_r):  # the region is exact: the lexicographic optimum
                return True, self.result(t_r, r)
            rb, t_up = unfreeze_slack(arrays, paths, rb, t_up)
            return True, self.result(t_up, rb, lower)
        if settle_next:
            settled = self.settle()
            if settled is not None or add.size == 0:
                return True, settled  # None: the too-long paths lie in the region already, the whole LP decides
        if add.size > cap:  # the worst paths first: the region grows at most geometrically
            add = add[np.argsort(-through[add], kind="stable")[:cap]]
        keep[add] = True
        return False, None

    def _improve(self, rb: np.ndarray, t_up: float, settle_next: bool) -> tuple[np.ndarray, float]:
        """The bounded round's plan ``rb`` rebalanced, and before the region gets large also a plan from the other
        end (co-critical ranks, :func:`freeze_and_give_back`): the better one and its batch time."""
        arrays, paths, lower, gap = self.ar, self.paths, self.lower, self.gap
        candidates = [rebalance(arrays, paths, rb, self.r_max, lower, gap)]
        if candidates[0][1] > lower * (1 + gap) and settle_next:
            rg = freeze_and_give_back(arrays, paths, self.r_max, lower * (1 + gap / 2))
            candidates.append(rebalance(arrays, paths, rg, self.r_max, lower, gap))
            self.stats["give_back_plans"] = self.stats.get("give_back_plans", 0) + 1
        self.stats["rebalance_passes"] = self.stats.get("rebalance_passes", 0) + sum(c[2] for c in candidates)
        rb2, t2, _ = min(candidates, key=lambda c: c[1])
        return (rb2, t2) if t2 < t_up else (rb, t_up)
