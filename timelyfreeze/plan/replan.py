"""Online re-planning: notice when the stable phase stops matching the plan, and say when to plan again.

Each stable step, every rank turns its own action times into per-group scales (``planner.timing.drift``:
measured / expected per stage and kind, the median over the group's actions); the runtime gathers them
over the job, and every rank feeds the same numbers to its ``Replanner``, so every rank takes the same
decision without a further collective. Over the last ``[freeze.advanced] replan_patience`` stable steps under the
plan in force (``S_g``: each group's median scale over them), each pipeline rank is its own yardstick, since a core's
slowdown (a co-tenant, throttling) scales every action of the rank on it alike (``planner.timing.drift``):

* a rank's **factor** ``f_r`` is the median of its own ``F``/``I`` groups' scales (freezing never changes
  those actions, so they measure the rank's core), per step and over the window (from ``S_g``);
* **within a rank**: a group's **corrected** scale in a step is its scale over its rank's factor in that
  step, and its **limit** is ``max(replan_noise_k * noise_g, replan_threshold)``, ``noise_g`` the group's noise
  floor from the monitoring windows against the same yardstick (``planner.timing.monitor.noise_floors``; 0
  where unknown, e.g. with a given plan); it has **moved** when the corrected scale departs from 1 by more
  than its limit on the same side in every step of the window (a co-tenant that switches on or off in the
  middle of a step moves a group against its rank in that step only, and the other way when it switches
  back); its size is the median over the window;
* **between ranks**: a rank's relative speed ``v_r = f_r / median of the other ranks' f_q`` in every step of
  the window (``planner.timing.drift.rank_speeds``); it has **moved** only when every step of the window lies
  beyond ``max(replan_noise_k * rank_noise_r, replan_threshold)`` on the same side of 1, ``rank_noise_r`` the
  root mean square of the rank's swings in the monitoring windows (``planner.timing.monitor.rank_noise``): a
  persistently slower rank changes the best plan (its actions weigh more on the critical path), a co-tenant
  that comes and goes does not stay beyond its own swings for a whole window;
* a **re-plan** is due when a group or a rank has moved. The runtime solves the LP again on global rank 0
  from the current node weights times ``S_g`` (``proposed_weights``), broadcasts the plan, and calls
  ``install`` (or keeps the plan in force where the new one buys less than ``replan_min_gain``,
  ``PlanCoordinator``); the next scales are measured against the new plan;
* otherwise, when the ranks' factors stretch the plan's predicted batch (its longest path with every
  action's duration times its rank's factor, the **machine factor** ``m``; ``m = f`` when every rank runs
  at ``f``) by more than the ``F``/``I`` groups' limit (the median of their floors) away from the factor the
  prediction already carries, the prediction is rescaled by ``m`` (``rescale``, logged) and the plan stays.

The per-step ``drift`` (how much the plan in force would stretch the batch under the step's scales) is
still computed for the metrics. A change must hold in every step of the window, so one noisy step
triggers nothing and one step back inside the limit holds a re-plan back until the window is beyond it
again. The state (the plan in force with its node weights, the
noise floors, the recent scales, the events) is plain data and goes into the checkpoint (``state_dict``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from planner.schedule.dag import build_dag
from planner.timing import drift as plan_drift
from planner.trace.load import NodeWeights, TraceMeta, validate_meta
from timelyfreeze.plan.settings import PlanSettings


class Replanner:
    @classmethod
    def for_run(cls, settings: PlanSettings, meta: dict) -> "Replanner | None":
        """The re-planner of a run with ``settings`` and trace ``meta`` (a ``meta.json`` dict), or None where
        re-planning is off or the method has no plan."""
        if not settings.replan:
            return None
        return cls(
            validate_meta(meta, "meta.json"),
            settings.replan_threshold,
            settings.replan_patience,
            settings.replan_noise_k,
        )

    def __init__(self, meta: TraceMeta, threshold: float, patience: int, noise_k: float = 3.0):
        self.meta = meta
        self.threshold = float(threshold)
        """The smallest corrected change that re-plans (``[freeze.advanced] replan_threshold``)."""
        self.patience = int(patience)
        self.noise_k = float(noise_k)
        self.noise: dict[str, float] = {}
        """Per group, the noise floor of the monitoring windows (kept by re-plans)."""
        self.rank_noise: dict[int, float] = {}
        """Per pipeline rank, the swing of its relative speed in the monitoring windows (kept by re-plans)."""
        self.machine = 1.0
        """The machine factor the plan in force's prediction carries (1 at install; set by ``rescale``)."""
        self.rescales: list[dict[str, Any]] = []
        self._dag = build_dag(meta)
        self.ranks = plan_drift.group_ranks(meta)
        """Group -> the pipeline rank that runs it."""
        self.weights: NodeWeights | None = None
        """Node weights of the plan in force (the monitoring estimates, rescaled by every re-plan)."""
        self.ratios: dict[str, float] = {}
        self.batch_ms: dict[str, float] | None = None
        """The plan in force's predicted batch times (``no_freeze``, ``all_frozen``, ``planned``)."""
        self.edge_ms: dict[tuple[str, str], float] = {}
        """The plan in force's delays on cross-rank edges (kept by re-plans)."""
        self.window: list[dict] = []
        """The last ``patience`` stable steps under the plan in force: ``{"drift", "scales"}`` each."""
        self.events: list[dict[str, Any]] = []
        self._verdict: tuple[list[dict], dict[str, Any]] | None = None
        """The last :meth:`assess` and the window it read: ``due``, ``rescale`` and ``reason`` of one step share it
        (the window is replaced, never changed in place, whenever a step or a plan changes it)."""

    # -- the plan in force ----------------------------------------------------------------------
    def install(
        self,
        weights: dict[str, list[float]],
        ratios: dict[str, float],
        batch_ms: dict[str, float],
        edge_ms: list | None = None,
        noise: dict[str, float] | None = None,
        rank_noise: dict | None = None,
    ) -> None:
        """A plan takes effect (``weights``: action -> [w_min, w_max] ms; ``edge_ms``: its delays on
        cross-rank edges as ``[u, v, ms]`` triples, ``planner.timing.comm``; ``noise``: the groups' noise floors
        and ``rank_noise`` the ranks' (rank, or its string, -> floor), where known: the ones in force stay
        otherwise); the window restarts."""
        if noise is not None:
            self.noise = {str(g): float(v) for g, v in noise.items()}
        if rank_noise is not None:
            self.rank_noise = {int(r): float(v) for r, v in rank_noise.items()}
        self.machine = 1.0
        self.weights = NodeWeights(
            {a: float(w[0]) for a, w in weights.items()}, {a: float(w[1]) for a, w in weights.items()}
        )
        self._bounds = plan_drift.action_bounds(self.weights)
        self.ratios = {a: float(r) for a, r in ratios.items()}
        self.batch_ms = dict(batch_ms)
        self.edge_ms = {(str(u), str(v)): float(ms) for u, v, ms in edge_ms or []}
        self._path = plan_drift.planned_path(self._dag, self.weights, self.ratios, self.edge_ms)
        self._path_nonnegative = bool((self._path.durations >= 0).all()) and (
            self._path.pred_delay is None or bool((self._path.pred_delay >= 0).all())
        )
        self.window = []

    def local_scales(self, samples: list[tuple[str, float, float]]) -> dict[str, float] | None:
        """This rank's per-group scales of one step from its ``(action, ms, applied ratio)`` samples."""
        if self.weights is None:
            return None
        return plan_drift.step_scales(samples, self.weights, self._bounds)

    # -- per stable step ------------------------------------------------------------------------
    def observe(self, scales: dict[str, float]) -> float | None:
        """Feed one stable step's job-wide scales; returns its drift (None without a plan or scales)."""
        return self.observe_step(scales).drift

    def observe_step(self, scales: dict[str, float]) -> StepObservation:
        """:meth:`observe`, with the step's machine factor and rank factors, which the window's entry uses too (each
        computed once a step). Without a plan or scales: no drift, and the window is left as it is."""
        factors = plan_drift.rank_factors(scales, self.ranks)
        job = plan_drift.machine_factor(scales)
        if self.weights is None or not scales:
            return StepObservation(None, job, factors)
        d = plan_drift.path_drift(self._path, scales)
        entry = {"drift": d, "scales": dict(scales), "relative": self._relative_of(scales, factors, job)}
        self.window = (self.window + [entry])[-self.patience :]
        return StepObservation(d, job, factors)

    def window_drift(self) -> float | None:
        """Median drift of the window (None until it holds ``patience`` steps)."""
        if len(self.window) < self.patience:
            return None
        return float(statistics.median(w["drift"] for w in self.window))

    def limit(self, group: str) -> float:
        """How far a group's corrected scale may depart from 1 without a re-plan."""
        return max(self.noise_k * self.noise.get(group, 0.0), self.threshold)

    def rank_limit(self, rank: int) -> float:
        """How far a rank's relative speed may depart from 1, in every step of the window, without a re-plan."""
        return max(self.noise_k * self.rank_noise.get(rank, 0.0), self.threshold)

    def machine_limit(self) -> float:
        """How far the machine factor may move without a rescaled prediction (the F/I groups' floors)."""
        floors = [v for g, v in self.noise.items() if g.lstrip("0123456789") in plan_drift.MACHINE_KINDS]
        return max(self.noise_k * statistics.median(floors), self.threshold) if floors else self.threshold

    def assess(self) -> dict[str, Any] | None:
        """The window's verdict (None until it holds ``patience`` steps): ``scales`` (per-group medians),
        ``factors`` (per rank: the median of its F/I groups' scales), ``machine`` (the factor the ranks'
        factors stretch the plan's batch by; 1 without F/I groups), ``moved`` (group -> median corrected scale,
        for the groups beyond their limit in every step of the window, on the same side) and ``ranks_moved``
        (rank -> median relative speed, for the ranks beyond their limit in every step, on the same side)."""
        if self.weights is None or len(self.window) < self.patience:
            return None
        if self._verdict is not None and self._verdict[0] is self.window:  # a new window is a new list
            return self._verdict[1]
        scales = plan_drift.window_scales(w["scales"] for w in self.window)
        factors = plan_drift.rank_factors(scales, self.ranks)
        corrected: dict[str, list[float]] = {}
        speeds: dict[int, list[float]] = {}
        for w in self.window:
            step_corrected, step_speeds = self._relative(w)
            for g, c in step_corrected.items():
                corrected.setdefault(g, []).append(c)
            for r, v in step_speeds.items():
                speeds.setdefault(r, []).append(v)
        moved = {g: float(statistics.median(c)) for g, c in corrected.items() if self._held(c, self.limit(g))}
        ranks_moved = {r: float(statistics.median(v)) for r, v in speeds.items() if self._held(v, self.rank_limit(r))}
        job = plan_drift.machine_factor(scales) or 1.0
        verdict = _Verdict(
            lambda: self._machine(factors, job),
            job,
            scales=scales,
            factors=factors,
            moved=moved,
            ranks_moved=ranks_moved,
        )
        self._verdict = (self.window, verdict)
        return verdict

    def _relative(self, w: dict) -> tuple[dict[str, float], dict[int, float]]:
        """One window step's corrected scales and rank speeds, computed once for the ``patience`` windows that hold
        it (kept in its entry, beside what ``state_dict`` saves of it)."""
        if "relative" not in w:  # (an entry restored from a checkpoint; ``observe_step`` makes it with the entry)
            w["relative"] = self._relative_of(w["scales"])
        return w["relative"]

    def _relative_of(
        self, scales: dict[str, float], factors: dict[int, float] | None = None, job: float | None = None
    ) -> tuple[dict[str, float], dict[int, float]]:
        """A step's corrected scales and rank speeds from its ``scales`` (``factors``, ``job``: their rank factors and
        machine factor, where the caller has them)."""
        if factors is None:
            factors = plan_drift.rank_factors(scales, self.ranks)
        return plan_drift.corrected_scales(scales, self.ranks, factors, job), plan_drift.rank_speeds(factors)

    def _held(self, values: list[float], limit: float) -> bool:
        """A change that persists: in every step of the window (``values``, one per step), beyond ``limit``
        from 1 on the same side."""
        return len(values) == len(self.window) and (min(values) - 1.0 > limit or 1.0 - max(values) > limit)

    def _machine(self, factors: dict[int, float], job: float) -> float:
        """The plan's batch stretch when every action runs at its rank's factor (``job``, the window's median F/I
        scale, for a rank without one; 1 without any): ``m`` of the module docstring."""
        if all(f == job for f in factors.values()):
            return job
        per_group = {g: factors.get(r, job) for g, r in self.ranks.items()}
        return 1.0 + plan_drift.path_drift(self._path, per_group)

    def _machine_range(self, verdict: _Verdict) -> tuple[float, float] | None:
        """Bounds of :meth:`_machine` (the verdict's ``"machine"``) without its longest path: every duration is
        scaled by one of the ranks' factors (the job's for a rank without one, 1 for a group without a rank) and the
        delays by 1, so every path, the longest too, stretches by a factor between the least and the largest of
        those and 1. None where a negative duration or delay would break that."""
        if not self._path_nonnegative:
            return None
        factors, job = verdict["factors"], verdict.job
        used = [factors.get(r, job) for r in set(self.ranks.values())] + [1.0]
        return min(used), max(used)

    def due(self) -> bool:
        """A re-plan is due: some group changed relative to its rank, or some rank relative to the others,
        beyond its limit."""
        verdict = self.assess()
        return verdict is not None and bool(verdict["moved"] or verdict["ranks_moved"])

    def reason(self) -> str:
        """Why a re-plan is due (the moved groups, largest change first, then the moved ranks)."""
        verdict = self.assess()
        assert verdict is not None
        moved = sorted(verdict["moved"].items(), key=lambda kv: -abs(kv[1] - 1.0))
        ranks = sorted(verdict["ranks_moved"].items(), key=lambda kv: -abs(kv[1] - 1.0))
        steps = f"{self.patience} stable step{'s' if self.patience > 1 else ''}"
        factors = verdict["factors"]
        parts = [
            f"{g} x{c:.2f} (limit {self.limit(g):.0%}) against the machine factor "
            f"x{factors.get(self.ranks.get(g, -1), verdict['machine']):.2f} of rank {self.ranks.get(g, '?')}"
            for g, c in moved[:4]
        ] + [
            f"rank {r} x{v:.2f} against the other ranks (limit {self.rank_limit(r):.0%}, in every step)"
            for r, v in ranks[:2]
        ]
        return ", ".join(parts) + f", median over the last {steps}"

    def rescale(self, step: int) -> dict[str, Any] | None:
        """Where the window shows no re-plan due and the ranks' factors moved the plan's batch beyond
        ``machine_limit``: keep the plan, carry the new factor in the prediction, and return the logged event
        ``{"step", "machine_factor", "old_predicted_ms", "new_predicted_ms"}``; else None."""
        verdict = self.assess()
        if verdict is None or verdict["moved"] or verdict["ranks_moved"] or self.batch_ms is None:
            return None
        limit = self.machine_limit()
        bounds = self._machine_range(verdict)
        if bounds is not None and all(abs(b / self.machine - 1.0) < limit - 1e-9 for b in bounds):
            return None  # m lies between the bounds, within the limit (|m / machine - 1| is largest at an end)
        m = verdict["machine"]
        if abs(m / self.machine - 1.0) <= limit:
            return None
        old = self.predicted_ms()
        self.machine = m
        event = {"step": step, "machine_factor": m, "old_predicted_ms": old, "new_predicted_ms": self.predicted_ms()}
        self.rescales.append(event)
        return event

    def kept_plan_ms(self, weights: NodeWeights) -> float:
        """The plan in force's batch time under ``weights`` (a re-plan's rescaled weights): what keeping it
        would predict, next to the new plan's own prediction (the difference is what the re-plan buys)."""
        return plan_drift.planned_batch(self._dag, weights, self.ratios, self.edge_ms)

    def keep(self, step: int, weights: NodeWeights, batch_ms: dict[str, float], **why: Any) -> dict[str, Any]:
        """A due re-plan that would not buy enough (``PlanCoordinator``): the plan in force stays, with the
        rescaled ``weights`` and ``batch_ms`` (its prediction under them) as its new reference; the window
        restarts. Returns the logged event (``rescales``), with ``why`` (reason, saves, frees)."""
        old = self.predicted_ms()
        edges = [[u, v, ms] for (u, v), ms in self.edge_ms.items()]
        self.install({a: [weights.w_min[a], weights.w_max[a]] for a in weights.w_max}, self.ratios, batch_ms, edges)
        event = {"step": step, "kept_replan": True, "old_predicted_ms": old, "new_predicted_ms": batch_ms["planned"]}
        self.rescales.append({**event, **why})
        return self.rescales[-1]

    def replanned(self, event: dict[str, Any]) -> None:
        """A re-plan took effect (``PlanCoordinator``, after ``install``): keep its logged ``event``."""
        self.events.append(event)

    def restart_window(self) -> None:
        """A due re-plan failed: the plan in force stays and its window starts again."""
        self.window = []

    def predicted_ms(self) -> float | None:
        """The plan in force's predicted batch time at the machine speed last seen (``rescale``)."""
        return self.batch_ms["planned"] * self.machine if self.batch_ms else None

    def proposed_weights(self) -> tuple[NodeWeights, dict[str, float]]:
        """(node weights for the re-plan, the per-group scales they apply: medians over the window)."""
        assert self.weights is not None
        scales = plan_drift.window_scales(w["scales"] for w in self.window)
        return plan_drift.scaled_weights(self.weights, scales), scales

    # -- checkpoint -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any] | None:
        if self.weights is None:
            return None
        return {
            "weights": {a: [self.weights.w_min[a], self.weights.w_max[a]] for a in self.weights.w_max},
            "ratios": dict(self.ratios),
            "batch_ms": dict(self.batch_ms or {}),
            "edge_ms": [[u, v, ms] for (u, v), ms in self.edge_ms.items()],
            "window": [{"drift": w["drift"], "scales": dict(w["scales"])} for w in self.window],
            "events": list(self.events),
            "noise": dict(self.noise),
            "rank_noise": {str(r): v for r, v in self.rank_noise.items()},
            "machine": self.machine,
            "rescales": list(self.rescales),
        }

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore ``state_dict``'s output; raises ``ValueError`` naming what does not fit this run."""
        if state is None:
            return
        actions = set(self.meta.all_actions())
        weights, ratios = state["weights"], state["ratios"]
        if set(weights) != actions:
            raise ValueError("its node weights do not cover exactly this schedule's actions")
        for a, w in weights.items():
            if not (
                isinstance(w, list)
                and len(w) == 2
                and all(isinstance(x, (int, float)) for x in w)
                and 0 <= w[0] <= w[1]
            ):
                raise ValueError(f"weights[{a!r}] = {w!r} is not [w_min, w_max] with 0 <= w_min <= w_max")
        if any(a not in actions or not isinstance(r, (int, float)) or not 0 <= r <= 1 for a, r in ratios.items()):
            raise ValueError("ratios must map this schedule's actions to numbers in [0, 1]")
        if not all(isinstance(state["batch_ms"].get(k), (int, float)) for k in ("no_freeze", "all_frozen", "planned")):
            raise ValueError("batch_ms needs no_freeze, all_frozen and planned")
        if not (
            isinstance(state["window"], list)
            and all(
                isinstance(w, dict) and isinstance(w.get("drift"), (int, float)) and isinstance(w.get("scales"), dict)
                for w in state["window"]
            )
        ):
            raise ValueError("window must be a list of {drift, scales}")
        if not (isinstance(state["events"], list) and all(isinstance(e, dict) for e in state["events"])):
            raise ValueError("events must be a list of objects")
        edges = state.get("edge_ms", [])
        if not (
            isinstance(edges, list)
            and all(
                isinstance(e, list)
                and len(e) == 3
                and e[0] in actions
                and e[1] in actions
                and isinstance(e[2], (int, float))
                and e[2] >= 0
                for e in edges
            )
        ):
            raise ValueError("edge_ms must be a list of [action, action, ms >= 0]")
        noise, machine = state.get("noise", {}), state.get("machine", 1.0)  # (absent in older states)
        if not (isinstance(noise, dict) and all(isinstance(v, (int, float)) and v >= 0 for v in noise.values())):
            raise ValueError("noise must map groups to numbers >= 0")
        rank_noise = state.get("rank_noise", {})
        if not (
            isinstance(rank_noise, dict)
            and all(str(r).isdigit() and isinstance(v, (int, float)) and v >= 0 for r, v in rank_noise.items())
        ):
            raise ValueError("rank_noise must map pipeline ranks to numbers >= 0")
        if not (isinstance(machine, (int, float)) and machine > 0):
            raise ValueError("machine must be a number > 0")
        if not (
            isinstance(state.get("rescales", []), list) and all(isinstance(e, dict) for e in state.get("rescales", []))
        ):
            raise ValueError("rescales must be a list of objects")
        self.install(weights, ratios, state["batch_ms"], edges, noise, rank_noise)
        self.machine = float(machine)
        self.rescales = list(state.get("rescales", []))
        self.window = [
            {"drift": float(w["drift"]), "scales": {str(g): float(s) for g, s in w["scales"].items()}}
            for w in state["window"]
        ][-self.patience :]
        self.events = list(state["events"])


def mean_ratio(ratios: dict[str, float], weights: NodeWeights) -> float:
    """Mean freeze ratio over the freezable actions (``w_max > w_min``) of ``weights``; 0 without any."""
    vals = [ratios.get(a, 0.0) for a in weights.w_max if weights.w_max[a] > weights.w_min[a]]
    return sum(vals) / len(vals) if vals else 0.0


def takes_effect(saves: float, frees: float, min_gain: float) -> bool:
    """Whether a due re-plan replaces the plan in force (``[freeze.advanced] replan_min_gain``): it saves at
    least ``min_gain`` of a batch or frees at least ``min_gain`` of freezing against keeping the plan under
    the same weights. ``min_gain`` 0 takes every due re-plan, also one that buys nothing: two optima of one LP
    differ by the solver's tolerance, so ``saves`` and ``frees`` of an equal plan may be a hair below 0."""
    return min_gain == 0.0 or max(saves, frees) >= min_gain


@dataclass(frozen=True)
class StepObservation:
    """One stable step as :meth:`Replanner.observe_step` saw it."""

    drift: float | None
    """How much the plan in force would stretch the batch under the step's scales (``planner.timing.drift``)."""
    machine_factor: float | None
    """The step's median F/I scale over the job, where it has one (``planner.timing.drift.machine_factor``)."""
    rank_factors: dict[int, float]
    """Per pipeline rank, the step's median F/I scale of that rank, where it has one
    (``planner.timing.drift.rank_factors``)."""


class _Verdict(dict):
    """:meth:`Replanner.assess`'s verdict, a plain dict whose ``"machine"`` is computed when first read: a longest
    path, which the stable steps' rescale check mostly does without (``Replanner._machine_range``)."""

    def __init__(self, machine, job: float, **fields):
        super().__init__(**fields)
        self._machine = machine
        self.job = job
        """The window's median F/I scale over the job (1 without one): the factor of a rank without its own."""

    def __missing__(self, key: str):
        if key != "machine":
            raise KeyError(key)
        self["machine"] = value = self._machine()
        return value
