"""The per-step gather's numbers as one fixed-size row of floats (``JobGroup.all_gather_floats``).

Every step, every rank hands the job a few numbers: its ``StepMetrics.local`` (elements frozen, batch and
step time, summed loss) and, in a watched stable step, its per-group drift scales (``Replanner.
local_scales``). From the second step on their layout is fixed: the groups are every (stage, kind) of the
schedule (``meta.json``), so one float64 tensor collective carries them instead of pickled objects. The
first step still gathers objects (the trace's ``meta.json`` needs each rank's action order, tensors and
host). Python floats are float64, so the values are exactly those an object gather gives:

    [frozen, batch_s, step_s, has_loss, loss, has_scales, scale of group 0, ..., scale of group G-1,
     method figure 0, ..., method figure K-1]

``has_*`` are 1.0 or 0.0 (a loss may be NaN itself, so None needs its own flag); a group without a scale on
this rank (another rank's stage) is NaN (a scale, measured / expected with expected > 0, never is). The method
figures are ``FreezeMethod.step_metrics`` by the method's ``step_metric_names`` (NaN: not given on this rank).
"""

from __future__ import annotations

import math

from planner.timing.drift import group_of

_HEAD = 6


class StepGather:
    def __init__(self, actions: list[str], method_names: tuple[str, ...] = ()):
        """``actions``: every action of the schedule (``TraceMeta.all_actions``); ``method_names``: the method's
        ``step_metric_names``."""
        self.groups: list[str] = sorted({group_of(a) for a in actions})
        self._index = {g: i for i, g in enumerate(self.groups)}
        self.method_names = tuple(method_names)

    def pack(self, local: dict, scales: dict[str, float] | None, method: dict[str, float] | None = None) -> list[float]:
        """This rank's row from ``StepMetrics.local``'s dict, its scales (None: not a watched step) and its method
        figures (a name outside ``method_names`` is a ValueError: it would be lost)."""
        method = method or {}
        unknown = set(method) - set(self.method_names)
        if unknown:
            raise ValueError(f"step_metrics names {sorted(unknown)} are not in the method's step_metric_names")
        row = [math.nan] * (_HEAD + len(self.groups)) + [float(method.get(k, math.nan)) for k in self.method_names]
        loss = local["loss"]
        row[:_HEAD] = [
            float(local["frozen"]),
            float(local["batch_s"]),
            float(local["step_s"]),
            0.0 if loss is None else 1.0,
            0.0 if loss is None else float(loss),
            0.0 if scales is None else 1.0,
        ]
        for g, s in (scales or {}).items():
            row[_HEAD + self._index[g]] = float(s)
        return row

    def unpack(self, rows: list[list[float]]) -> list[dict]:
        """Every rank's ``{"frozen", "batch_s", "step_s", "loss", "scales"}``, as the object gather gave them."""
        out = []
        for row in rows:
            scales = None
            if row[5]:
                scales = {g: v for g, v in zip(self.groups, row[_HEAD : _HEAD + len(self.groups)]) if not math.isnan(v)}
            tail = row[_HEAD + len(self.groups) :]
            out.append(
                {
                    "frozen": row[0],
                    "batch_s": row[1],
                    "step_s": row[2],
                    "loss": row[4] if row[3] else None,
                    "scales": scales,
                    "method": {k: v for k, v in zip(self.method_names, tail) if not math.isnan(v)},
                }
            )
        return out
