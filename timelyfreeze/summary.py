"""Human-readable end-of-run summary (from ``summary.json``; see ``docs/run-outputs.md``)."""

from __future__ import annotations


def format_summary(s: dict) -> str:
    """The end-of-run summary printed by pipeline rank 0."""

    def f(x, unit="", nd=1):
        return "n/a" if x is None else f"{x:,.{nd}f}{unit}"

    lines = [f"[freeze] ===== summary: {s['method']} on {s['schedule']} (PP={s['pp_degree']}, "
             f"{s['num_stages']} stages, {s['num_microbatches']} microbatches, {s['steps']} steps) ====="]
    lines.append("  phases: " + ", ".join(f"{p} {a}-{b}" for p, (a, b) in s["phases"].items()))
    mb = s["mean_batch_ms"]
    pred = s.get("predicted_batch_ms") or {}
    if pred:
        lines.append(
            f"  batch time, predicted: no-freeze {f(pred.get('no_freeze'), ' ms')}, all-frozen "
            f"{f(pred.get('all_frozen'), ' ms')}, planned {f(pred.get('planned'), ' ms')}"
        )
    lines.append("  batch time, measured:  " + ", ".join(f"{p} {f(v, ' ms')}" for p, v in mb.items()))
    if pred and mb.get("upper") and mb.get("stable"):
        lines.append(
            f"  speedup over upper bound: measured {mb['upper'] / mb['stable']:.3f}x, "
            f"predicted {pred['no_freeze'] / pred['planned']:.3f}x"
        )
    tps = s["tokens_per_s"]
    lines.append(f"  throughput: {f(tps['all'], ' tok/s')} overall, {f(tps['stable'], ' tok/s')} steady")
    lines.append(f"  average freeze ratio (by elements, whole run): {s['avg_freeze_ratio']:.3f}")
    lc = s["loss_curve"]
    if lc:
        lines.append(f"  loss: {lc[0][1]:.3f} (step {lc[0][0]}) -> {lc[-1][1]:.3f} (step {lc[-1][0]})"
                     + (f", validation {s['val_loss']:.3f}" if s.get("val_loss") is not None else ""))
    for failure in s.get("failures") or []:
        lines.append(f"  FAILED: {failure}")
    for k, v in s.get("paths", {}).items():
        if v:
            lines.append(f"  {k}: {v}")
    return "\n".join(lines)
