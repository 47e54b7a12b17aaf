"""Synthetic timing traces for "what if" planning without a GPU, and writing traces to disk.

The timing model (all times in ms, per action, before jitter):

* ``F`` (forward) of stage ``s``: ``f_ms * scale[s]``.
* A full backward of stage ``s`` costs ``b_ms * scale[s]``; the weight-gradient part of it is
  ``w_share * b_ms * scale[s]`` and the input-gradient part the rest. Split-backward schedules
  (ZBV, InterleavedZeroBubble) run it as ``I`` (input part) and ``W`` (weight part), so ``B = I + W``.
* A DualPipeV ``OVERLAP_F_B`` pair takes its forward's time plus its full backward's (no overlap gain:
  torch runs the two parts one after the other unless a custom function overlaps them).
* Freezing shrinks only the weight-gradient part, linearly in the frozen fraction ``r``; with
  everything frozen it is ``lower_share`` of its unfrozen value (the rest models the fixed overhead
  that remains: kernel launches, activation-grad bookkeeping). ``F`` and ``I`` never change.
* ``jitter`` multiplies every record by an independent factor drawn uniformly from
  ``[1 - jitter, 1 + jitter]`` (seeded), so medians over ``steps`` records stay near the model.

Records come in phases ``upper`` (nothing frozen, ``freeze_ratio`` 0), ``lower`` (everything frozen,
``freeze_ratio`` 1 on B/W actions) and, when ``stable_ratio`` is given, ``stable`` (every B/W action
frozen by that fraction), ``steps`` training steps each, numbered consecutively from 1.
``freeze_ratio`` is 0 on F and I records, which compute no weight gradient.
"""

from __future__ import annotations

import json
import math
import os
import random

from planner.errors import PlannerError
from planner.fileio import replace_atomically
from planner.schedule.actions import FREEZABLE_KINDS, parse_action
from planner.schedule.dag import EdgeDelays, build_dag, longest_path
from planner.schedule.orders import schedule_meta
from planner.trace.load import META_FILE, Trace, TraceMeta, rank_file_name, trace_from_records


def _check_number(value: object, what: str, lo: float, hi: float, hi_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PlannerError(f"{what} must be a finite number, got {value!r}")
    if value < lo or value > hi or (hi_open and value == hi):
        bound = f"[{lo}, {hi})" if hi_open else f"[{lo}, {hi}]"
        raise PlannerError(f"{what} must be in {bound}, got {value!r}")
    return float(value)


def model_ms(
    action: str,
    *,
    f_ms: float,
    b_ms: float,
    w_share: float,
    lower_share: float,
    scale: float,
    freeze_ratio: float,
    forward_scale: float | None = None,
) -> float:
    """Model duration of one action (no jitter) when a fraction ``freeze_ratio`` of its stage is frozen.
    An ``OVERLAP_F_B`` pair (DualPipeV) takes its forward's time (stage scale ``forward_scale``, default
    ``scale``) plus its full backward's, which ``scale`` and ``freeze_ratio`` are for."""
    act = parse_action(action)
    if act.forward is not None:
        fwd, bwd = (str(p) for p in act.parts)
        common = dict(f_ms=f_ms, b_ms=b_ms, w_share=w_share, lower_share=lower_share)
        return model_ms(
            fwd, **common, scale=scale if forward_scale is None else forward_scale, freeze_ratio=0.0
        ) + model_ms(bwd, **common, scale=scale, freeze_ratio=freeze_ratio)
    kind = act.kind
    weight = w_share * b_ms * scale
    weight_now = weight * (1.0 - freeze_ratio * (1.0 - lower_share))
    if kind == "F":
        return f_ms * scale
    if kind == "I":
        return b_ms * scale - weight
    if kind == "W":
        return weight_now
    return b_ms * scale - weight + weight_now  # "B"


def synthetic_trace(
    schedule: str,
    pp: int,
    num_microbatches: int,
    *,
    f_ms: float = 1.0,
    b_ms: float = 2.0,
    w_share: float = 0.5,
    lower_share: float = 0.3,
    stage_scale: list[float] | None = None,
    jitter: float = 0.0,
    seed: int = 0,
    steps: int = 3,
    stable_ratio: float | None = None,
) -> Trace:
    """A validated synthetic :class:`Trace` for ``schedule`` at this size (see the module docstring)."""
    f_ms = _check_number(f_ms, "f_ms", 0.0, math.inf)
    b_ms = _check_number(b_ms, "b_ms", 0.0, math.inf)
    w_share = _check_number(w_share, "w_share", 0.0, 1.0)
    lower_share = _check_number(lower_share, "lower_share", 0.0, 1.0)
    jitter = _check_number(jitter, "jitter", 0.0, 1.0, hi_open=True)
    if stable_ratio is not None:
        stable_ratio = _check_number(stable_ratio, "stable_ratio", 0.0, 1.0)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise PlannerError(f"steps must be an integer >= 1, got {steps!r}")
    meta = schedule_meta(schedule, pp, num_microbatches)
    num_stages = meta["num_stages"]
    if stage_scale is None:
        scales = [1.0] * num_stages
    else:
        if len(stage_scale) != num_stages:
            raise PlannerError(f"stage_scale has {len(stage_scale)} entries, expected num_stages={num_stages}")
        scales = [_check_number(x, f"stage_scale[{s}]", 0.0, math.inf) for s, x in enumerate(stage_scale)]

    phases: list[tuple[str, float]] = [("upper", 0.0), ("lower", 1.0)]
    if stable_ratio is not None:
        phases.append(("stable", stable_ratio))
    rng = random.Random(seed)
    records: dict[int, list[dict]] = {r: [] for r in range(pp)}
    step = 0
    for phase, ratio in phases:
        for _ in range(steps):
            step += 1
            for r in range(pp):
                for a in meta["rank_orders"][str(r)]:
                    act = parse_action(a)
                    freezes = act.kind in FREEZABLE_KINDS
                    ms = model_ms(
                        a,
                        f_ms=f_ms,
                        b_ms=b_ms,
                        w_share=w_share,
                        lower_share=lower_share,
                        scale=scales[act.stage],
                        freeze_ratio=ratio if freezes else 0.0,
                        forward_scale=scales[act.parts[0].stage],
                    )
                    if jitter:
                        ms *= rng.uniform(1.0 - jitter, 1.0 + jitter)
                    records[r].append(
                        {
                            "step": step,
                            "action": a,
                            "ms": round(ms, 6),
                            "phase": phase,
                            "freeze_ratio": ratio if freezes else 0.0,
                        }
                    )
    source = f"<synthetic {meta['schedule']} pp={pp} microbatches={num_microbatches}>"
    return trace_from_records(meta, records, source)


def write_trace(trace: Trace, directory: str | os.PathLike[str]) -> str:
    """Write ``trace`` as a spec-conformant trace directory (``meta.json`` + one records file per rank
    and replica, named by ``rank_file_name``).

    Creates the directory if needed and overwrites those files; returns the directory path.
    Raises :class:`PlannerError` (one line) when it cannot be written.
    """
    root = os.fspath(directory)
    by_file: dict[tuple[int, int], list[str]] = {
        (d, r): [] for d in range(trace.meta.replicas) for r in range(trace.meta.pp_degree)
    }
    for rec in trace.records:
        obj = {
            "step": rec.step,
            "action": rec.action,
            "ms": rec.ms,
            "phase": rec.phase,
            "freeze_ratio": rec.freeze_ratio,
        }
        if rec.start_ms is not None:
            obj["start_ms"] = rec.start_ms
        by_file[rec.replica, rec.rank].append(json.dumps(obj))
    files = {META_FILE: json.dumps(trace.meta.to_json(), indent=1) + "\n"}
    files.update({rank_file_name(r, d): "".join(line + "\n" for line in lines) for (d, r), lines in by_file.items()})
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as e:
        raise PlannerError(f"{root}: cannot create trace directory: {e.strerror}") from None
    for name, text in files.items():
        replace_atomically(os.path.join(root, name), lambda tmp, text=text: _write_text(tmp, text))
    return root


def _write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def simulate_batch(meta: TraceMeta, durations: dict[str, float], edge_ms: EdgeDelays | None = None) -> float:
    """Batch time (ms) of one training batch with these action durations: the DAG's longest path
    (with the delays ``edge_ms`` on its edges, ``planner.timing.comm``, when given)."""
    return longest_path(build_dag(meta), durations, edge_ms)[0]
