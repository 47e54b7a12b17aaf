"""What a finished runtime-benchmark job's dump says (``bench``): phase medians, the plan in force
after a re-plan, the overhead bench's paired differences, and where the stable error comes from
(``decompose``; the module docstring of ``bench`` defines the quantities)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from planner.schedule.dag import build_dag, longest_path
from planner.timing.comm import estimate_edge_delays
from planner.timing.spans import achieved_share, forward_medians
from planner.trace.archive import TRACE_NAME, find_trace
from planner.trace.load import load_trace

MODE_ENV = "TIMELYFREEZE_OVERHEAD_MODE"
"""An overhead job's mode in its environment (``overhead_trainer``): ``plain`` (the default), ``probe`` (its stable
steps include the no-op probe) or ``masked`` (its detached steps apply the plan's masks)."""

PROFILE_ENV = "TIMELYFREEZE_OVERHEAD_PROFILE"
"""A folder in an overhead job's environment (``bench_runtime.py --profile``): each rank profiles the runtime's own
code in its attached stable steps and writes ``profile_rank<r>.pstats`` there (``overhead_trainer``)."""

CYCLES = {
    "plain": ("hooks", "plain", "plain"),
    "probe": ("hooks", "plain", "probe", "plain", "plain"),
    "masked": ("hooks", "masked", "masked"),
}
"""The kinds of an overhead job's stable steps per mode (``overhead_trainer``), repeated. Each attached step has
detached steps (``BASE``) on both sides, and the cycles have an odd length, so every kind falls on odd and even
steps alike: on the test machine odd steps ran about 0.8 % slower than even ones (stable phases of 30
TimelyFreeze runs), which a cycle of two put entirely on the attached steps."""

BASE = {"plain": "plain", "probe": "plain", "masked": "masked"}
"""The detached kind an attached step is compared with, per mode: TorchTitan's own step (``plain``), or at a
plan's ratios TorchTitan's step with the same plan's masks applied by a minimal path (``masked``)."""


def phase_median(metrics: list[dict], phase: str) -> float:
    """Median batch time (ms) of the metrics rows of ``phase``; NaN without any."""
    vals = [m["batch_ms"] for m in metrics if m.get("phase") == phase]
    return statistics.median(vals) if vals else float("nan")


def after_replan(dump: Path) -> dict:
    """A load run after its first re-plan: per stable step ``k`` the plan in force (the latest re-plan
    before ``k``) predicts ``P_k`` (planned) and ``N_k`` (no-freeze, under the load it was re-planned for);
    medians over those steps of ``M_k / P_k - 1`` and of the share ``(N_k / M_k - 1) / (N_k / P_k - 1)``.
    {} without a re-plan that has stable steps after it."""
    out = Path(dump) / "timelyfreeze"
    s = json.loads((out / "summary.json").read_text())
    replans = s.get("replans") or []
    if not replans:
        return {}
    plans = [(e["step"], json.loads(Path(e["plan"]).read_text())["batch_time_ms"]) for e in replans]
    errors, shares, measured, planned = [], [], [], []
    for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()):
        if m.get("phase") != "stable" or m["step"] <= plans[0][0]:
            continue
        bt = [b for step, b in plans if step < m["step"]][-1]
        errors.append(m["batch_ms"] / bt["planned"] - 1)
        shares.append(share(bt["no_freeze"] / m["batch_ms"], bt["no_freeze"] / bt["planned"]))
        measured.append(m["batch_ms"])
        planned.append(bt["planned"])
    if not errors:
        return {}
    return {
        "replan_step": plans[0][0],
        "steps_after": len(errors),
        "stable_after_ms": statistics.median(measured),
        "pred_after_planned_ms": statistics.median(planned),
        "error_after_pct": 100 * statistics.median(errors),
        "share_after_pct": statistics.median(shares),
    }


def decompose(dump: Path) -> dict:
    """``{"model_gap_pct", "action_drift_pct", "upper_f_ms"}`` of a phases run (module docstring; the last:
    :func:`upper_f_ms`); {} without a trace."""

    out = Path(dump) / "timelyfreeze"
    if find_trace(out / TRACE_NAME) is None:
        return {}
    trace = load_trace(out / TRACE_NAME)
    edges = estimate_edge_delays(trace)
    dag = build_dag(trace.meta)
    rows = {
        m["step"]: m
        for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
        if m.get("phase") == "stable" and m.get("predicted_batch_ms")
    }
    steps: dict[int, dict[str, float]] = {}
    for rec in trace.records:
        if rec.step in rows and rec.replica == 0:
            steps.setdefault(rec.step, {})[rec.action] = rec.ms
    gap, drift = [], []
    for k, durations in steps.items():
        if len(durations) != len(trace.meta.all_actions()):
            continue
        length = longest_path(dag, durations, edges)[0]
        gap.append(rows[k]["batch_ms"] / length - 1)
        drift.append(length / rows[k]["predicted_batch_ms"] - 1)
    if not gap:
        return {}
    return {
        "model_gap_pct": 100 * statistics.median(gap),
        "action_drift_pct": 100 * statistics.median(drift),
        "upper_f_ms": upper_f_ms(trace),
    }


def upper_f_ms(trace) -> float:
    """The machine's speed before anything differs between two runs of a pair: the sum over the forward
    actions of their median time in the upper-bound window (replica 0). Forward actions do not depend on the
    plan, and the upper window comes before any plan or load, so the ratio of two runs' values is the ratio
    of their machines' speeds (the re-plan A/B divides it out)."""

    return sum(forward_medians(trace, "upper").values())


def share(measured: float, predicted: float) -> float:
    """The achieved share (%) of a predicted speed-up (``planner.timing.spans.achieved_share``); NaN when nothing
    was predicted."""

    got = achieved_share(measured, predicted)
    return 100 * got if got is not None else float("nan")


def overhead_figures(rows: list[dict]) -> dict:
    """An overhead job's figures from its stable steps' rows (``overhead_trainer``): per attached kind
    (``hooks``; ``probe`` where the job has it) the mean :func:`paired_differences` over the median detached
    step (``masked`` steps where the job has them, else ``plain``), and the median direct cost (and, where the
    rows have them, the median own cost without the gather's wait, and that wait: ``own_pct``, ``own_ms``,
    ``wait_ms``; and its split, ``own_actions_ms``, ``own_draws_ms``, ``own_step_ms``, or in rows of the older bench
    ``own_hook_ms``, ``own_profiler_ms``, ``own_step_ms``). With masked steps also the
    masks' own cost per masked step (``draw_pct``: the method's selection for every (stage, microbatch);
    ``switch_pct``: the ``requires_grad`` switches) and the mean applied freeze ratio of each kind."""
    base = "masked" if any(r["kind"] == "masked" for r in rows) else "plain"
    plain = statistics.median(r["s"] for r in rows if r["kind"] == base)
    hooks = [r for r in rows if r["kind"] == "hooks"]
    diffs = paired_differences(rows, base=base)
    out = {
        "pairs": len(diffs),
        "plain_ms": plain * 1e3,
        "hooks_ms": statistics.median(r["s"] for r in hooks) * 1e3,
        "diff_ms": statistics.fmean(diffs) * 1e3,
        "overhead_pct": 100 * statistics.fmean(diffs) / plain,
    }
    if all("direct_s" in r for r in hooks):
        direct = statistics.median(r["direct_s"] for r in hooks)
        out |= {"direct_ms": direct * 1e3, "direct_pct": 100 * direct / plain}
    if hooks and all("own_s" in r for r in hooks):  # the gather's wait out (rows of older jobs have none)
        own, wait = (statistics.median(r[k] for r in hooks) for k in ("own_s", "wait_s"))
        out |= {"own_ms": own * 1e3, "own_pct": 100 * own / plain, "wait_ms": wait * 1e3}
    if hooks and all("own_step_s" in r for r in hooks):  # the most-spending rank's own time, split by part
        for part in ("actions", "draws", "hook", "profiler", "step"):  # (hook, profiler: rows of the older bench)
            if all(f"own_{part}_s" in r for r in hooks):
                out[f"own_{part}_ms"] = statistics.median(r[f"own_{part}_s"] for r in hooks) * 1e3
    if any(r["kind"] == "probe" for r in rows):
        out["probe_pct"] = 100 * statistics.fmean(paired_differences(rows, "probe")) / plain
    if base == "masked":
        masked = [r for r in rows if r["kind"] == "masked"]
        for key in ("draw", "switch"):
            out[f"{key}_pct"] = 100 * statistics.median(r[f"{key}_s"] for r in masked) / plain
        if all("hook_s" in r for r in hooks):
            out["hook_pct"] = 100 * statistics.median(r["hook_s"] for r in hooks) / plain
        for kind, rs in (("hooks", hooks), ("masked", masked)):
            out[f"ratio_{kind}"] = statistics.fmean(r["ratio"] for r in rs)
    return out


def paired_differences(rows: list[dict], kind: str = "hooks", base: str = "plain") -> list[float]:
    """Per attached step of ``kind`` (``hooks``, or the overhead probe's ``probe``), its wall time minus the
    mean of its detached (``base``) neighbours' (the steps before and after; one where only one is detached): a
    drift of the machine that is linear over three steps cancels, which pairing with the next step alone does
    not (a job speeding up after its ramp would count as overhead)."""
    by_step = {r["step"]: r for r in rows}
    out = []
    for s, r in sorted(by_step.items()):
        if r["kind"] != kind:
            continue
        near = [by_step[n]["s"] for n in (s - 1, s + 1) if by_step.get(n, {}).get("kind") == base]
        if near:
            out.append(r["s"] - statistics.fmean(near))
    return out
