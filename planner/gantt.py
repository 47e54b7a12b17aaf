"""Per-rank timeline (Gantt) plots of one training batch, one panel per batch variant.

A panel given durations places every action at its earliest start on the schedule DAG (the longest path
from the source, so the same model the planner optimises); a panel given a measured step
(:class:`planner.timing.spans.StepTimeline`) places every action at its measured start (``start_ms``, from the
step's first start) and ends at the step's measured span. One row per pipeline rank, coloured by kind.
Frozen work is shown by the box fading in proportion to its freeze ratio, a dark bar along its
bottom as long as that fraction of the box, and the ratio printed under the action name where the
box is wide enough. Boxes on the critical
path of a DAG panel get a black outline. All panels share the time axis so batch times compare at a glance.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence

from planner.errors import PlannerError
from planner.fileio import replace_atomically
from planner.lp.budget import format_r_max
from planner.plan import check_plan_matches
from planner.schedule.actions import KINDS, PAIR, parse_action
from planner.schedule.dag import build_dag, longest_path
from planner.timing.spans import StepTimeline, representative_step, step_spans, step_timeline
from planner.trace.load import TraceMeta, node_weights

KIND_COLORS = {"F": "#4C72B0", "B": "#DD8452", "I": "#55A868", "W": "#8172B3", PAIR: "#C44E52"}
FROZEN_COLOR = "#222222"
KIND_LABELS = {
    "F": "F forward",
    "B": "B backward",
    "I": "I input grad",
    "W": "W weight grad",
    PAIR: "F+B overlapped pair",
}

Ratios = Mapping[str, float] | Sequence[Mapping[str, float] | None] | None


def _legend_width_in(meta: TraceMeta) -> float:
    """Width (inches) the one-row legend needs at font size 8, with every entry it can show for ``meta``."""
    kinds = {parse_action(a).kind for a in meta.all_actions()}
    labels = [KIND_LABELS[k] for k in KINDS if k in kinds]
    labels += ["frozen fraction (faded box, bar, label)", "critical path", "batch end"]
    return sum(0.075 * len(label) + 0.45 for label in labels)


def stable_panel(trace) -> tuple[dict[str, float], dict[str, float], list[str]] | None:
    """The measured stable-phase panel of a timeline: median ms and median freeze ratio per action over the
    trace's ``stable`` records (with several replicas, per replica, then the per-action maximum over
    replicas, as ``node_weights`` combines the bounds the plan is made from), and the actions that have
    none (the panel needs every action). None when the trace has no stable record at all."""
    ms: dict[tuple[int, str], list[float]] = {}
    ratio: dict[str, list[float]] = {}
    for rec in trace.records:
        if rec.phase == "stable":
            ms.setdefault((rec.replica, rec.action), []).append(rec.ms)
            ratio.setdefault(rec.action, []).append(rec.freeze_ratio)
    if not ms:
        return None
    med: dict[str, float] = {}
    for (_, a), v in ms.items():
        med[a] = max(float(statistics.median(v)), med.get(a, 0.0))
    missing = [a for a in trace.meta.all_actions() if a not in med]
    return med, {a: float(statistics.median(v)) for a, v in ratio.items()}, missing


PHASE_LABELS = {"upper": "nothing frozen (upper bound)", "stable": "stable phase"}
"""How a measured panel's title names the phases a timeline shows."""

NO_TIMESTAMPS = "medians on the DAG's longest path; the trace has no comparable start_ms"
"""Title note of a measured panel drawn from medians (a trace without timestamps, or ranks on several hosts)."""


def measured_panel(trace, phase: str, spans: dict[int, float]) -> tuple[str, StepTimeline, dict[str, float]] | None:
    """``(title, timeline, ratios)`` of the measured panel of ``phase``: its representative step
    (:func:`planner.timing.spans.representative_step`) at the measured starts; None when no step of the phase
    has a span in ``spans`` (``step_spans(trace)``)."""
    step = representative_step(trace, phase, spans)
    if step is None:
        return None
    tl = step_timeline(trace, step)
    title = f"measured, {PHASE_LABELS.get(phase, phase)}: step {step} (the phase's median span), from start_ms"
    return title, tl, tl.ratios


def trace_panels(trace, plan=None, plan_source: str = "plan") -> tuple[list, list, list[str]]:
    """``(panels, ratios, notes)`` of ``python -m planner gantt``: the measured upper bound, the plan's batch
    (with ``plan``, checked against the trace; ``plan_source`` names it in errors) and the measured stable
    phase when the trace has one. Measured panels are real steps (:func:`measured_panel`) where the trace
    has comparable timestamps, else medians on the DAG's longest path, titled so (:data:`NO_TIMESTAMPS`).
    ``notes``: why a panel is left out."""

    meta, spans, notes = trace.meta, step_spans(trace), []
    actions = meta.all_actions()
    upper = measured_panel(trace, "upper", spans)
    if upper is None:
        upper = (f"measured, nothing frozen (upper bound), {NO_TIMESTAMPS}", node_weights(trace).w_max, None)
    panels, ratios = [upper[:2]], [upper[2]]
    if plan is not None:
        check_plan_matches(plan, meta.schedule, meta.num_stages, meta.num_microbatches, plan_source)
        missing = [a for a in actions if a not in plan.actions]
        if missing:
            raise PlannerError(f"{plan_source}: plan has no entry for action {missing[0]!r} of the trace")
        panels.append((f"planned, r_max={format_r_max(plan.r_max)}", {a: plan.actions[a].duration for a in actions}))
        ratios.append({a: plan.actions[a].freeze_ratio for a in actions})
    stable = measured_panel(trace, "stable", spans)
    if stable is None and (medians := stable_panel(trace)) is not None:
        if medians[2]:
            notes.append(f"no stable panel: {len(medians[2])} actions have no 'stable' record (e.g. {medians[2][0]})")
        else:
            stable = (f"measured, stable phase, {NO_TIMESTAMPS}", medians[0], medians[1])
    if stable is not None:
        panels.append(stable[:2])
        ratios.append(stable[2])
    return panels, ratios, notes


def _panel_ratios(ratios: Ratios, n_panels: int) -> list[Mapping[str, float] | None]:
    if ratios is None:
        return [None] * n_panels
    if isinstance(ratios, Mapping):
        return [ratios] * n_panels
    ratios = list(ratios)
    if len(ratios) != n_panels:
        raise PlannerError(f"ratios has {len(ratios)} entries, expected one per panel ({n_panels})")
    return ratios


def plot_timeline(
    meta: TraceMeta,
    durations_by_panel: Sequence[tuple[str, Mapping[str, float] | StepTimeline]],
    out_path: str | os.PathLike[str],
    ratios: Ratios = None,
    title: str | None = None,
) -> list[float]:
    """Draw the panels into a PNG at ``out_path`` (written atomically); returns each panel's batch time.

    ``durations_by_panel``: ``[(title, {action: ms})]``, every action of ``meta`` in every such panel, or
    ``[(title, StepTimeline)]`` for a measured step (its batch time is its span).
    ``ratios``: freeze ratios to show, either one ``{action: ratio}`` for all panels or a list with
    one entry (or None) per panel.
    """
    if not durations_by_panel:
        raise PlannerError("nothing to plot: no timeline panels")
    per_panel = _panel_ratios(ratios, len(durations_by_panel))
    dag = build_dag(meta)
    solved = []
    for panel_title, durations in durations_by_panel:
        if isinstance(durations, StepTimeline):
            solved.append((panel_title, list(durations.boxes), durations.span_ms, None))
            continue
        makespan, starts, critical = longest_path(dag, dict(durations))
        boxes = [
            (a, r, starts[a], float(durations[a])) for r in range(meta.pp_degree) for a in meta.rank_orders.get(r, [])
        ]
        solved.append((panel_title, boxes, makespan, set(critical)))

    import matplotlib  # deferred: matplotlib is heavy and only plots need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: matplotlib is heavy and only plots need it

    pp = meta.pp_degree
    n_panels = len(solved)
    xmax = max(m for _, _, m, _ in solved) or 1.0
    longest_order = max((len(o) for o in meta.rank_orders.values()), default=1)
    width_in = min(40.0, max(10.0, 0.3 * longest_order, _legend_width_in(meta)))
    height_in = 1.2 + n_panels * (0.55 * pp + 0.9)
    fig, axes = plt.subplots(n_panels, 1, figsize=(width_in, height_in), dpi=110, sharex=True, squeeze=False)
    # Horizontal pixels per ms (axes span ~88% of the figure width after tight_layout).
    boxes = _Boxes(fig.dpi, width_in * 0.88 * fig.dpi / (xmax * 1.02), 7 if pp <= 8 else 6)
    for ax, (panel_title, panel_boxes, makespan, critical), panel_ratios in zip(
        (a[0] for a in axes), solved, per_panel
    ):
        for a, r, x, w in panel_boxes:
            ratio = min(max(float(panel_ratios.get(a, 0.0)), 0.0), 1.0) if panel_ratios else 0.0
            boxes.draw(ax, a, r, x, w, ratio, critical is not None and a in critical)
        ax.axvline(makespan, color="crimson", linestyle="--", linewidth=1)
        what = "batch" if critical is not None else "measured span"
        ax.set_title(f"{panel_title}: {what} {makespan:.2f} ms", loc="left", fontsize=10)
        ax.set_ylim(pp - 0.5, -0.5)
        ax.set_yticks(range(pp))
        ax.set_yticklabels([f"rank {r}" for r in range(pp)])
        ax.grid(True, axis="x", alpha=0.25)
    axes[-1][0].set_xlim(0, xmax * 1.02)
    measured = [isinstance(d, StepTimeline) for _, d in durations_by_panel]
    axes[-1][0].set_xlabel(
        "time (ms): "
        + "; ".join(
            x
            for x, on in (
                ("earliest start on the schedule DAG", not all(measured)),
                ("measured, from the step's first start", any(measured)),
            )
            if on
        )
    )
    head = title or f"{meta.schedule}, pp={pp}, {meta.num_stages} stages, {meta.num_microbatches} microbatches"
    fig.suptitle(head, fontsize=11, x=0.01, ha="left")
    boxes.legend(fig, height_in)
    try:
        replace_atomically(out_path, lambda tmp: fig.savefig(tmp, format="png"))
    finally:
        plt.close(fig)
    return [m for _, _, m, _ in solved]


class _Boxes:
    """Draws the action boxes of a figure (``px_per_ms`` horizontal pixels per ms, labels at font size ``fs``)
    and remembers what its legend must show."""

    def __init__(self, dpi: float, px_per_ms: float, fs: int) -> None:
        self.dpi, self.px_per_ms, self.fs = dpi, px_per_ms, fs
        self.widths: dict[tuple[str, int], float] = {}
        self.kinds_seen: set[str] = set()
        self.any_frozen = False

    def char_pt(self, c: str, size: int) -> float:
        """Advance width of one character in points (cached; label widths are sums of these)."""
        from matplotlib.textpath import TextPath  # deferred: matplotlib is heavy and only plots need it

        if (c, size) not in self.widths:
            self.widths[c, size] = TextPath((0, 0), c + c, size=size).get_extents().width / 2
        return self.widths[c, size]

    def draw(self, ax, a: str, r: int, x: float, w: float, ratio: float, on_path: bool) -> None:
        """Action ``a`` on rank ``r`` from ``x`` for ``w`` ms, frozen by ``ratio``, outlined if ``on_path``."""
        from matplotlib.patches import Rectangle  # deferred: matplotlib is heavy and only plots need it

        kind = parse_action(a).kind
        self.kinds_seen.add(kind)
        frozen = ratio >= 0.005
        self.any_frozen |= frozen
        ax.add_patch(
            Rectangle(
                (x, r - 0.4),
                w,
                0.8,
                facecolor=KIND_COLORS[kind],
                alpha=1.0 - 0.6 * ratio if frozen else 1.0,
                edgecolor="none",
                linewidth=0,
            )
        )
        if frozen:  # a dark bar along the bottom, as long as the frozen fraction of the box
            ax.add_patch(Rectangle((x, r + 0.24), w * ratio, 0.16, facecolor=FROZEN_COLOR, linewidth=0))
        ax.add_patch(
            Rectangle(
                (x, r - 0.4),
                w,
                0.8,
                fill=False,
                edgecolor="black" if on_path else "white",
                linewidth=1.3 if on_path else 0.5,
            )
        )
        fs = self.fs
        short = a[1 : a.index(")")] if kind == PAIR else a  # "(0F3;3B1)OVERLAP_F_B" -> "0F3;3B1"
        label = short if not frozen else f"{short}\n{ratio:.2f}"
        text_pt = max(sum(self.char_pt(c, fs) for c in part) for part in label.split("\n"))
        if w * self.px_per_ms >= text_pt * self.dpi / 72 + 4:
            ax.text(
                x + w / 2,
                r - (0.06 if frozen else 0.0),
                label,
                ha="center",
                va="center",
                fontsize=fs if not frozen else fs - 1,
                linespacing=0.95,
                color="white" if not frozen else "black",
                clip_on=True,
            )

    def legend(self, fig, height_in: float) -> None:
        """The one-row legend at the bottom and the layout (title row on top, fixed heights in inches)."""
        import matplotlib.pyplot as plt  # deferred: matplotlib is heavy and only plots need it
        from matplotlib.patches import Patch

        handles = [Patch(facecolor=KIND_COLORS[k], label=KIND_LABELS[k]) for k in KINDS if k in self.kinds_seen]
        if self.any_frozen:
            handles.append(Patch(facecolor=FROZEN_COLOR, label="frozen fraction (faded box, bar, label)"))
        handles.append(Patch(facecolor="white", edgecolor="black", linewidth=1.3, label="critical path"))
        handles.append(plt.Line2D([], [], color="crimson", linestyle="--", label="batch end"))
        fig.legend(
            handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=len(handles), fontsize=8, frameon=False
        )
        fig.tight_layout(rect=(0, 0.35 / height_in, 1, 1 - 0.3 / height_in))
