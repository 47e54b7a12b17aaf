"""The end-of-run summary: ``build`` makes ``summary.json``'s dict, ``format_summary`` the printed text.

See ``docs/run-outputs.md`` for every field.
"""

from __future__ import annotations

import statistics
from typing import Any

from planner.timing.spans import achieved_share, f_factor, phase_spans, step_spans
from planner.trace.load import Trace

SUMMARY_FORMAT = "timelyfreeze-run/1"


def build(
    *,
    history: list[dict],
    steady_phases: tuple[str, ...],
    tokens_per_step: int,
    run: dict[str, Any],
    predicted_batch_ms: dict | None,
    val_curve: list,
    method_summary: dict,
    failures: list[str],
    replans: list[dict] | None = None,
    trace: Trace | None = None,
    monitoring: dict | None = None,
    rescales: list[dict] | None = None,
    f_factor_dag: float | None = None,
    acc_curve: list[dict] | None = None,
) -> dict:
    """``summary.json`` from the per-step metrics rows (``history``) and what the run knows about itself
    (``run``: method, knob, schedule, pp_degree, num_stages, num_microbatches, seed); ``trace``, when rank 0
    could load the run's whole trace, gives the pipeline spans and the F factor (``planner.timing.spans``);
    ``monitoring`` (the monitoring windows' F factors and warnings) and ``rescales`` (uniform changes that
    kept the plan) make the ``monitoring`` entry (None with neither); ``f_factor_dag``: the stable phase's
    F factor through the monitoring plan's DAG (``planner.timing.spans.dag_f_factor``), which the shares with the
    F factor out use where it is known."""
    hist = sorted(history, key=lambda h: h["step"])
    ranges: dict[str, list[int]] = {}
    by_phase: dict[str, list[dict]] = {}
    for h in hist:
        rng = ranges.setdefault(h["phase"], [h["step"], h["step"]])
        rng[1] = h["step"]
        by_phase.setdefault(h["phase"], []).append(h)

    def tps(rows):
        t = sum(r["step_ms"] for r in rows) / 1e3
        return tokens_per_step * len(rows) / t if rows and t > 0 else None

    steady_rows = [h for h in hist if h["phase"] in steady_phases]
    losses = [[h["step"], h["loss"]] for h in hist if h["loss"] is not None]
    spans = step_spans(trace) if trace is not None else {}
    median_batch = {p: statistics.median(r["batch_ms"] for r in rows) for p, rows in by_phase.items()}
    span = phase_spans(trace, spans) if spans else {}
    return {
        "format": SUMMARY_FORMAT,
        **run,
        "steps": len(hist),
        "tokens_per_step": tokens_per_step,
        "phases": ranges,
        "tokens_per_s": {"all": tps(hist), "stable": tps(steady_rows)},
        "mean_batch_ms": {p: statistics.fmean(r["batch_ms"] for r in rows) for p, rows in by_phase.items()}
        | {"all": statistics.fmean(h["batch_ms"] for h in hist) if hist else None},
        "replica_mean_batch_ms": {
            p: [statistics.fmean(col) for col in zip(*(r["replica_batch_ms"] for r in rows))]
            for p, rows in by_phase.items()
            if all("replica_batch_ms" in r for r in rows)
        },
        "median_batch_ms": median_batch,
        "span_ms": span,
        "step_span_ms": [[k, round(ms, 3)] for k, ms in spans.items()],
        "predicted_batch_ms": predicted_batch_ms,
        "speedup": speedup(
            median_batch, span, predicted_batch_ms, f_factor(trace) if trace is not None else None, f_factor_dag
        ),
        "avg_freeze_ratio": statistics.fmean(h["freeze_ratio"] for h in hist) if hist else 0.0,
        "final_loss": losses[-1][1] if losses else None,
        "val_loss": val_curve[-1][1] if val_curve else None,
        "loss_curve": losses,
        "val_curve": val_curve,
        **accuracy_fields(acc_curve or []),
        "method_summary": method_summary,
        "failures": list(failures),
        "replans": list(replans or []),
        "monitoring": {**(monitoring or {}), "rescales": list(rescales or [])} if monitoring or rescales else None,
    }


def accuracy_fields(acc_curve: list[dict]) -> dict:
    """The held-out accuracy's summary fields: the last validation's ``val_acc``, ``val_acc_norm``,
    ``val_acc_chance``, ``val_questions`` and the per-question ``val_acc_right`` and ``val_acc_norm_right``
    (``choice_task.Accuracy``; None without accuracy) and ``acc_curve`` (``[step, acc]``)."""
    last = acc_curve[-1] if acc_curve else {}
    keys = ("val_acc", "val_acc_norm", "val_acc_chance", "val_questions", "val_acc_right", "val_acc_norm_right")
    return {k: last.get(k) for k in keys} | {"acc_curve": [[a["step"], a["val_acc"]] for a in acc_curve]}


def speedup(
    median_batch: dict, span: dict, predicted: dict | None, f: float | None, f_dag: float | None = None
) -> dict | None:
    """The ``speedup`` field: measured (upper / stable, from the medians of the batch wall time and of the
    span) against predicted (``no_freeze / planned``) and the shares achieved, raw and with the machine's
    F factor taken out (``f_dag`` where known, else the pooled ``f``); None without a plan or without both
    an upper and a stable phase."""
    if not predicted or not predicted.get("planned") or "upper" not in median_batch or "stable" not in median_batch:
        return None
    pred = predicted["no_freeze"] / predicted["planned"]
    wall = median_batch["upper"] / median_batch["stable"]
    by_span = span["upper"] / span["stable"] if "upper" in span and "stable" in span else None
    out = f_dag if f_dag is not None else f
    return {
        "predicted": pred,
        "measured": wall,
        "measured_span": by_span,
        "f_factor": f,
        "f_factor_dag": f_dag,
        "share": achieved_share(wall, pred),
        "share_f_corrected": achieved_share(wall * out, pred) if out is not None else None,
        "share_span": achieved_share(by_span, pred),
        "share_span_f_corrected": achieved_share(by_span * out, pred) if out is not None and by_span else None,
    }


def format_summary(s: dict) -> str:
    """The end-of-run summary printed by pipeline rank 0."""

    def f(x, unit="", nd=1):
        return "n/a" if x is None else f"{x:,.{nd}f}{unit}"

    dp = f" x {s['replicas']} replicas" if s.get("replicas", 1) > 1 else ""
    lines = [
        f"[freeze] ===== summary: {s['method']} on {s['schedule']} (PP={s['pp_degree']}{dp}, "
        f"{s['num_stages']} stages, {s['num_microbatches']} microbatches, {s['steps']} steps) ====="
    ]
    lines.append("  phases: " + ", ".join(f"{p} {a}-{b}" for p, (a, b) in s["phases"].items()))
    comp = s.get("compile")
    if comp:
        lines.append(
            f"  torch.compile: freezing unit {s.get('unit')}; {', '.join(map(str, comp['regions']))} compiled "
            f"blocks per rank, graphs compiled {', '.join(map(str, comp['graphs']))} (after the warm-up: "
            f"{', '.join('n/a' if g is None else str(g) for g in comp['graphs_after_warmup'])})"
        )
    mb = s["mean_batch_ms"]
    pred = s.get("predicted_batch_ms") or {}
    if pred:
        lines.append(
            f"  batch time, predicted: no-freeze {f(pred.get('no_freeze'), ' ms')}, all-frozen "
            f"{f(pred.get('all_frozen'), ' ms')}, planned {f(pred.get('planned'), ' ms')}"
        )
    lines.append("  batch time, measured:  " + ", ".join(f"{p} {f(v, ' ms')}" for p, v in mb.items()))
    for p, per in (s.get("replica_mean_batch_ms") or {}).items():
        lines.append(f"  {p} batch time per replica: " + ", ".join(f(v, " ms") for v in per))
    if s.get("median_batch_ms"):
        lines.append(
            "  median per phase, schedule wall time (max over ranks): "
            + ", ".join(f"{p} {f(v, ' ms')}" for p, v in s["median_batch_ms"].items())
        )
    if s.get("span_ms"):
        lines.append(
            "  median per phase, pipeline span from timestamps: "
            + ", ".join(f"{p} {f(v, ' ms')}" for p, v in s["span_ms"].items())
        )
    sp = s.get("speedup")
    if sp:
        lines.append(
            f"  speedup over upper bound (medians): predicted {sp['predicted']:.3f}x, measured "
            f"{sp['measured']:.3f}x wall, {f(sp['measured_span'], 'x', 3)} span; F factor (stable / upper) "
            f"{f(sp['f_factor'], '', 3)}"
        )
        lines.append(
            f"  share of the predicted speedup: {f(sp['share'], '', 2)} wall, {f(sp['share_f_corrected'], '', 2)} "
            f"wall with the F factor out; {f(sp['share_span'], '', 2)} span, "
            f"{f(sp['share_span_f_corrected'], '', 2)} span with the F factor out"
        )
    for e in s.get("replans") or []:
        lines.append(
            f"  re-planned after step {e['step']}: {e['reason']}; predicted batch "
            f"{e['old_planned_ms']:.1f} -> {e['new_planned_ms']:.1f} ms"
            + (f" (the plan in force, kept: {e['kept_plan_ms']:.1f} ms)" if "kept_plan_ms" in e else "")
        )
    mon = s.get("monitoring") or {}
    if mon.get("factors"):
        lines.append(
            f"  monitoring: lower-bound window F factor "
            f"{', '.join(f'{x:.3f}' for x in mon['factors']['lower'])} against the {mon['reference']} window"
            f" ({'anchored' if mon['anchored'] else 'not anchored'})"
        )
    if mon.get("jitter"):
        j = mon["jitter"]
        lines.append(
            f"  jitter (planner.timing.jitter, {j['steps']} monitoring steps): "
            f"predictions {100 * (j['planned'] - 1):+.1f} % "
            f"planned, {100 * (j['no_freeze'] - 1):+.1f} % without freezing over the plan's longest paths"
        )
    for w in mon.get("warnings") or []:
        lines.append(f"  WARNING: {w}")
    for e in mon.get("rescales") or []:
        what = (
            f"re-plan not taken after step {e['step']} (it would save {100 * e['saves']:.1f} % of the batch, "
            f"{e['frees']:+.3f} of freezing)"
            if e.get("kept_replan")
            else f"uniform change after step {e['step']}: machine factor x{e['machine_factor']:.2f}"
        )
        lines.append(
            f"  {what}, plan kept; predicted batch {e['old_predicted_ms']:.1f} -> {e['new_predicted_ms']:.1f} ms"
        )
    tps = s["tokens_per_s"]
    lines.append(f"  throughput: {f(tps['all'], ' tok/s')} overall, {f(tps['stable'], ' tok/s')} steady")
    lines.append(f"  average freeze ratio (by elements, whole run): {s['avg_freeze_ratio']:.3f}")
    lc = s["loss_curve"]
    if lc:
        lines.append(
            f"  loss: {lc[0][1]:.3f} (step {lc[0][0]}) -> {lc[-1][1]:.3f} (step {lc[-1][0]})"
            + (f", validation {s['val_loss']:.3f}" if s.get("val_loss") is not None else "")
            + (
                f", accuracy {s['val_acc']:.3f} (chance {s['val_acc_chance']:.3f})"
                if s.get("val_acc") is not None
                else ""
            )
        )
    for failure in s.get("failures") or []:
        lines.append(f"  FAILED: {failure}")
    for k, v in s.get("paths", {}).items():
        if v:
            lines.append(f"  {k}: {v}")
    return "\n".join(lines)
