"""Online re-planning: notice when the stable phase stops matching the plan, and say when to plan again.

Each stable step, every rank turns its own action times into per-group scales (``planner.drift``:
measured / expected per stage and kind, the median over the group's actions); the runtime gathers them
over the job, and every rank feeds the same numbers to its ``Replanner``, so every rank takes the same
decision without a further collective. The step's **drift** is how much the plan in force would stretch
(or shrink) the batch under those scales. When the median drift of the last ``[freeze] replan_patience``
stable steps under the plan in force lies beyond ``replan_threshold`` (either way), a re-plan is due: the
runtime solves the LP again on global rank 0 from the current node weights times the per-group median
scales of those steps (``proposed_weights``), broadcasts the plan, and calls ``install``; the next drifts
are measured against the new plan. The median (rather than "every step beyond") keeps one quiet step in a
slow period from restarting the count, and one noisy step from triggering anything.

The state (the plan in force with its node weights, the recent scales, the events) is plain data and
goes into the checkpoint (``state_dict``).
"""

from __future__ import annotations

import statistics
from typing import Any

from planner import drift as plan_drift
from planner.dag import build_dag
from planner.trace import NodeWeights, TraceMeta


class Replanner:
    @classmethod
    def for_run(cls, cfg, meta: dict) -> "Replanner | None":
        """The re-planner of a run with ``[freeze]`` settings ``cfg`` and trace ``meta`` (a ``meta.json``
        dict), or None where re-planning is off or the method has no plan."""
        from planner.trace import validate_meta
        from timelyfreeze.config import PLANNED_METHODS

        if not (cfg.replan and cfg.method in PLANNED_METHODS):
            return None
        return cls(validate_meta(meta, "meta.json"), cfg.replan_threshold, cfg.replan_patience)

    def __init__(self, meta: TraceMeta, threshold: float, patience: int):
        self.meta = meta
        self.threshold = float(threshold)
        self.patience = int(patience)
        self._dag = build_dag(meta)
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

    # -- the plan in force ----------------------------------------------------------------------
    def install(
        self,
        weights: dict[str, list[float]],
        ratios: dict[str, float],
        batch_ms: dict[str, float],
        edge_ms: list | None = None,
    ) -> None:
        """A plan takes effect (``weights``: action -> [w_min, w_max] ms; ``edge_ms``: its delays on
        cross-rank edges as ``[u, v, ms]`` triples, ``planner.comm``); the drift count restarts."""
        self.weights = NodeWeights(
            {a: float(w[0]) for a, w in weights.items()}, {a: float(w[1]) for a, w in weights.items()}
        )
        self.ratios = {a: float(r) for a, r in ratios.items()}
        self.batch_ms = dict(batch_ms)
        self.edge_ms = {(str(u), str(v)): float(ms) for u, v, ms in edge_ms or []}
        self._base = plan_drift.planned_batch(self._dag, self.weights, self.ratios, self.edge_ms)
        self.window = []

    def local_scales(self, samples: list[tuple[str, float, float]]) -> dict[str, float] | None:
        """This rank's per-group scales of one step from its ``(action, ms, applied ratio)`` samples."""
        if self.weights is None:
            return None
        return plan_drift.step_scales(samples, self.weights)

    # -- per stable step ------------------------------------------------------------------------
    def observe(self, scales: dict[str, float]) -> float | None:
        """Feed one stable step's job-wide scales; returns its drift (None without a plan or scales)."""
        if self.weights is None or not scales:
            return None
        d = plan_drift.drift(self._dag, self.weights, self.ratios, scales, self.edge_ms, self._base)
        self.window = (self.window + [{"drift": d, "scales": dict(scales)}])[-self.patience :]
        return d

    def window_drift(self) -> float | None:
        """Median drift of the window (None until it holds ``patience`` steps)."""
        if len(self.window) < self.patience:
            return None
        return float(statistics.median(w["drift"] for w in self.window))

    def due(self) -> bool:
        d = self.window_drift()
        return self.weights is not None and d is not None and abs(d) > self.threshold

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
        self.install(weights, ratios, state["batch_ms"], edges)
        self.window = [
            {"drift": float(w["drift"]), "scales": {str(g): float(s) for g, s in w["scales"].items()}}
            for w in state["window"]
        ][-self.patience :]
        self.events = list(state["events"])
