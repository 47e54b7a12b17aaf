"""``python -m planner``: plan, sweep, gantt, orders, simulate, import-log and pack subcommands.

``plan`` and ``sweep`` plan with the runtime's defaults (``planner.defaults``): cross-rank delays, the gap
model, anchored monitoring windows and the jitter factors; ``--no-...`` flags turn each off (``--gaps``,
``--anchor`` and ``--no-cliff``, the old ways to ask for the defaults, are still accepted).  ``--cliff`` turns on
the lower-bound cliff rule (``planner.timing.cliff``; off by default).

Every user error (bad trace, bad plan, bad argument, unwritable output) is printed as a single
``error: <message>`` line on stderr with exit status 2, never as a traceback.

The modules only one other command uses (the Gantt chart, the sweep, the schedules' orders, the simulator, the
authors' log importer) are imported by that command when it runs: ``plan`` does not wait for them.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
from collections.abc import Sequence

from planner.defaults import PLAN_DEFAULTS
from planner.errors import PlannerError
from planner.lp.budget import parse_r_max
from planner.lp.solve import SOLVERS
from planner.plan import load_plan, plan_from_trace, plan_summary, write_plan
from planner.schedule.dag import build_dag
from planner.timing import monitor
from planner.timing.cliff import apply_cliffs, find_cliffs
from planner.timing.comm import estimate_edge_delays, summary_line
from planner.timing.estimate import DEFAULT_ESTIMATOR, ESTIMATORS, estimate_weights
from planner.timing.gaps import delay_fields, gap_line, with_gap_costs
from planner.trace.archive import pack_trace, traces_in
from planner.trace.load import load_trace


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one ``error: ...`` line (exit 2) instead of usage + message."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise PlannerError(" ".join(message.split()))


def _unit_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"r_max must be a number in [0, 1], got {text!r}") from None
    if not math.isfinite(v) or not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"r_max must be a number in [0, 1], got {text!r}")
    return v


def _r_max_arg(text: str) -> float | tuple[float, ...]:

    try:
        return parse_r_max(text)
    except PlannerError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _unit_float_list(text: str) -> list[float]:
    parts = [p.strip() for p in text.split(",")]
    if not parts or any(p == "" for p in parts):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of r_max values in [0, 1], got {text!r}")
    return [_unit_float(p) for p in parts]


def _float_list(text: str) -> list[float]:
    try:
        values = [float(p) for p in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of numbers, got {text!r}") from None
    return values


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return v


def _finite_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return v


def _gap_arg(text: str) -> float:
    v = _finite_float(text)
    if not 0 <= v < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return v


_TRACE_HELP = "a trace folder, its trace.tar.gz, or the folder's path after it was packed"
_SOLVER_HELP = (
    f"LP solver: {', '.join(SOLVERS)} (default auto: the whole LP below 20,000 actions, else the region "
    "method; all give the same optimum when --gap is 0)"
)
_GAP_HELP = (
    "largest certified relative gap in batch time accepted from the region method, in [0, 1) (default: "
    "0.001 when auto picks the region method, else 0 = the exact optimum; with the default, where the "
    "region method cannot certify 0.001 it keeps its best plan if within 0.01 and says so, where a given "
    "G is kept at the whole LP's cost); the plan records the lower bound and the gap reached"
)
_ESTIMATOR_HELP = (
    f"node-weight estimator: {', '.join(ESTIMATORS)} (default {DEFAULT_ESTIMATOR}; median: each action's own "
    "medians; pooled: one value per stage and kind, except microbatches whose data show an effect; "
    "see docs/formats.md)"
)
_NO_COMM_HELP = (
    "ignore the delays on cross-rank edges measured in the trace (records with start_ms; "
    "see docs/formats.md) and plan on compute times alone"
)
_NO_GAPS_HELP = (
    "do not put on each rank-order edge the mean gap measured between those two kinds of action on that rank "
    "when the next one's input was there (runtime work between actions; planner/timing/gaps.py, "
    "docs/formats.md; on by default, as in the runtime; --no-comm also turns it off)"
)
_NO_ANCHOR_HELP = (
    "do not bring the lower-bound window to the upper one's machine speed (its F/I factor) first; the plan "
    "still records the factors (field monitoring). On by default, as in the runtime"
)
_NO_JITTER_HELP = "do not record the jitter factors of the plan's predictions (field jitter; on by default)"
_CLIFF_HELP = (
    "lift the lower bound of a stage whose all-frozen backward also drops its input gradient "
    "(planner/timing/cliff.py; field cliff). Off by default: it did not improve predictions of the held-out "
    "runs of docs/results/authors-logs/heldout.md"
)


def _add_default_switches(q: argparse.ArgumentParser, *, plan: bool) -> None:
    """The ``--no-...`` switches of the defaults (``planner.defaults``) and the old ``--gaps``/``--anchor``."""
    q.add_argument("--no-gaps", action="store_true", help=_NO_GAPS_HELP)
    q.add_argument("--gaps", action="store_true", help="the default; accepted for old command lines")
    q.add_argument("--no-anchor", action="store_true", help=_NO_ANCHOR_HELP)
    q.add_argument("--anchor", action="store_true", help="the default; accepted for old command lines")
    q.add_argument("--cliff", action="store_true", help=_CLIFF_HELP)
    q.add_argument("--no-cliff", action="store_true", help="the default; accepted for old command lines")
    if plan:
        q.add_argument("--no-jitter", action="store_true", help=_NO_JITTER_HELP)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m planner", description="TimelyFreeze offline planner: traces -> freeze plans.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")

    q = sub.add_parser("plan", help="solve the freeze LP for one r_max (or one per stage) and write PLAN.json")
    q.add_argument("trace", metavar="TRACE", help=_TRACE_HELP)
    q.add_argument(
        "--r-max",
        type=_r_max_arg,
        required=True,
        metavar="R or R0,R1,...",
        help="max mean freeze ratio per stage, in [0, 1]: one value for every stage, or one per stage "
        "(as many as the trace has stages)",
    )
    q.add_argument("--out", required=True, metavar="PLAN.json")
    q.add_argument("--solver", default="auto", choices=SOLVERS, help=_SOLVER_HELP)
    q.add_argument("--gap", type=_gap_arg, metavar="G", help=_GAP_HELP)
    q.add_argument("--estimator", default=DEFAULT_ESTIMATOR, choices=ESTIMATORS, help=_ESTIMATOR_HELP)
    q.add_argument("--no-comm", action="store_true", help=_NO_COMM_HELP)
    _add_default_switches(q, plan=True)

    q = sub.add_parser("sweep", help="predicted batch time for several r_max values")
    q.add_argument("trace", metavar="TRACE", help=_TRACE_HELP)
    q.add_argument("--r-max", type=_unit_float_list, required=True, metavar="R1,R2,...")
    q.add_argument("--csv", metavar="PATH")
    q.add_argument("--png", metavar="PATH")
    q.add_argument("--solver", default="auto", choices=SOLVERS, help=_SOLVER_HELP)
    q.add_argument("--gap", type=_gap_arg, metavar="G", help=_GAP_HELP)
    q.add_argument("--estimator", default=DEFAULT_ESTIMATOR, choices=ESTIMATORS, help=_ESTIMATOR_HELP)
    q.add_argument("--no-comm", action="store_true", help=_NO_COMM_HELP)
    _add_default_switches(q, plan=False)

    q = sub.add_parser("gantt", help="per-rank timeline PNG of the measured (and planned) batch")
    q.add_argument("trace", metavar="TRACE", help=_TRACE_HELP)
    q.add_argument("--plan", metavar="PLAN.json")
    q.add_argument("--out", required=True, metavar="timeline.png")

    q = sub.add_parser("orders", help="print the per-rank executed action order of a schedule")
    q.add_argument("--schedule", required=True)
    q.add_argument("--pp", type=_positive_int, required=True)
    q.add_argument("--microbatches", type=_positive_int, required=True)
    q.add_argument("--stages-per-rank", type=_positive_int)
    q.add_argument("--json", action="store_true", help="print a complete meta.json instead")

    q = sub.add_parser("simulate", help="write a synthetic trace (no GPU needed)")
    q.add_argument("--schedule", required=True)
    q.add_argument("--pp", type=_positive_int, required=True)
    q.add_argument("--microbatches", type=_positive_int, required=True)
    q.add_argument("--out", required=True, metavar="TRACE_DIR")
    q.add_argument("--f-ms", type=_finite_float, default=1.0, help="forward ms per stage (default 1.0)")
    q.add_argument("--b-ms", type=_finite_float, default=2.0, help="full backward ms per stage (default 2.0)")
    q.add_argument("--w-share", type=_finite_float, default=0.5, help="weight-grad share of the backward")
    q.add_argument(
        "--lower-share",
        type=_finite_float,
        default=0.3,
        help="weight-grad time left when everything is frozen, as a share",
    )
    q.add_argument("--stage-scale", type=_float_list, metavar="S0,S1,...", help="per-stage time multipliers")
    q.add_argument("--jitter", type=_finite_float, default=0.0)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--steps", type=_positive_int, default=3, help="records per action and phase")
    q.add_argument("--stable-ratio", type=_unit_float, help="also write 'stable' records at this freeze ratio")

    q = sub.add_parser(
        "import-log", help="turn a log of the paper authors' TorchTitan fork into a trace (docs/formats.md)"
    )
    q.add_argument("log", metavar="LOG")
    q.add_argument("--out", required=True, metavar="TRACE_DIR")
    q.add_argument(
        "--stable-from",
        type=_positive_int,
        metavar="STEP",
        help="first step of the stable reference window (default: twice the lower window's last step)",
    )

    q = sub.add_parser(
        "pack", help="pack trace folders into trace.tar.gz beside them, losslessly, and remove the folders"
    )
    q.add_argument(
        "folders",
        nargs="+",
        metavar="FOLDER",
        help="a trace folder, or a job or results folder: every trace/ folder below it",
    )
    return p


# ------------------------------------------------------------------------------------------ commands


def _cmd_plan(args: argparse.Namespace) -> None:

    trace = load_trace(args.trace)
    # (a per-stage r_max must match the trace's stages: checked with the problem, a one-line PlannerError)
    plan = plan_from_trace(
        trace,
        args.r_max,
        solver=args.solver,
        estimator=args.estimator,
        comm=not args.no_comm,
        gap=args.gap,
        **_switches(args),
        jitter=PLAN_DEFAULTS["jitter"] and not args.no_jitter,
    )
    write_plan(plan, args.out)  # an unwritable path is a one-line PlannerError naming it
    print(plan_summary(plan, trace.meta))
    print(f"node weights: estimator {args.estimator}")
    f = ", ".join(f"{x:.3f}" for x in plan.extra["monitoring"]["factors"]["lower"])
    done = "anchored" if plan.extra["monitoring"]["anchored"] else "not anchored (--no-anchor)"
    print(f"monitoring: lower-bound window F factor {f} against the upper window; {done}")
    cliff = plan.extra.get("cliff")
    if cliff and cliff["stages"]:
        print(
            f"lower-bound cliff: stage(s) {', '.join(map(str, cliff['stages']))} drop their input gradient when "
            f"all frozen; their B planned on the floor share {cliff['share']:.3f} of the other stages"
        )
    if "jitter" in plan.extra:
        j = plan.extra["jitter"]
        print(f"jitter: {j['steps']} residual steps, planned batch x{j['planned']:.4f}")
    if "comm" in plan.extra:
        print(summary_line(plan.extra["comm"]))
    if "gaps" in plan.extra:
        print(gap_line(plan.extra["gaps"]))
    print(f"wrote {args.out}")


def _switches(args: argparse.Namespace) -> dict:
    """``gaps``, ``anchor`` and ``cliff`` of ``plan_from_trace``: the defaults less the ``--no-...`` flags
    (``--gaps`` with ``--no-comm`` asks for what cannot be had: an error, as before)."""
    if args.gaps and args.no_comm:
        raise PlannerError("--gaps needs the cross-rank delays: drop --no-comm")
    if args.cliff and args.no_cliff:
        raise PlannerError("--cliff and --no-cliff contradict each other: give one")
    return {
        "gaps": PLAN_DEFAULTS["gaps"] and not args.no_gaps and not args.no_comm,
        "anchor": PLAN_DEFAULTS["anchor"] and not args.no_anchor,
        "cliff": (PLAN_DEFAULTS["cliff"] or args.cliff) and not args.no_cliff,
    }


def _cmd_sweep(args: argparse.Namespace) -> None:
    from planner.rmax_sweep import format_table, plot_sweep, sweep, write_csv

    sw = _switches(args)
    trace = load_trace(args.trace)
    dag = build_dag(trace.meta)
    edge_ms = {} if args.no_comm else estimate_edge_delays(trace, dag)
    if sw["gaps"]:
        edge_ms = with_gap_costs(trace, dag, edge_ms)[0]
    if sw["anchor"]:
        trace_w = monitor.anchored(trace, monitor.monitoring_summary(trace, True)["factors"])
    else:
        trace_w = trace
    weights = estimate_weights(trace_w, args.estimator)
    if sw["cliff"]:
        weights = apply_cliffs(weights, find_cliffs(weights))
    rows = sweep(
        trace.meta,
        weights,
        args.r_max,
        solver=args.solver,
        edge_ms=edge_ms,
        gap=args.gap,
    )
    print(
        f"{trace.meta.schedule}, pp={trace.meta.pp_degree}, {trace.meta.num_microbatches} microbatches, "
        f"estimator {args.estimator}"
    )
    fields = delay_fields(dag, edge_ms)
    if "comm" in fields:
        print(summary_line(fields["comm"]))
    if "gaps" in fields:
        print(gap_line(fields["gaps"]))
    print(format_table(rows))
    if args.csv:
        write_csv(rows, args.csv)
        print(f"wrote {args.csv}")
    if args.png:
        plot_sweep(rows, args.png, title=f"{trace.meta.schedule}, pp={trace.meta.pp_degree}: predicted throughput")
        print(f"wrote {args.png}")


def _cmd_gantt(args: argparse.Namespace) -> None:
    from planner.gantt import plot_timeline, trace_panels
    from planner.timing.spans import StepTimeline

    trace = load_trace(args.trace)
    plan = None
    if args.plan:
        plan = load_plan(args.plan)
    panels, ratios, notes = trace_panels(trace, plan, args.plan)
    for note in notes:
        print(f"note: {note}")
    times = plot_timeline(trace.meta, panels, args.out, ratios=ratios)
    for (title, durations), t in zip(panels, times):
        print(f"{title}: {'measured span' if isinstance(durations, StepTimeline) else 'batch'} {t:.3f} ms")
    print(f"wrote {args.out}")


def _cmd_orders(args: argparse.Namespace) -> None:
    from planner.schedule.orders import rank_orders, schedule_meta

    if args.json:
        print(json.dumps(schedule_meta(args.schedule, args.pp, args.microbatches, args.stages_per_rank), indent=1))
        return
    for r, order in rank_orders(args.schedule, args.pp, args.microbatches, args.stages_per_rank).items():
        print(f"rank {r}: {' '.join(order)}")


def _cmd_simulate(args: argparse.Namespace) -> None:
    from planner.trace.simulate import synthetic_trace, write_trace

    trace = synthetic_trace(
        args.schedule,
        args.pp,
        args.microbatches,
        f_ms=args.f_ms,
        b_ms=args.b_ms,
        w_share=args.w_share,
        lower_share=args.lower_share,
        stage_scale=args.stage_scale,
        jitter=args.jitter,
        seed=args.seed,
        steps=args.steps,
        stable_ratio=args.stable_ratio,
    )
    write_trace(trace, args.out)
    m = trace.meta
    print(
        f"wrote {args.out}: synthetic {m.schedule} trace, pp={m.pp_degree}, {m.num_stages} stages, "
        f"{m.num_microbatches} microbatches, {len(trace.records)} records"
    )


def _cmd_import_log(args: argparse.Namespace) -> None:
    from planner.trace.authors_log import import_log

    trace = import_log(args.log, args.out, stable_from=args.stable_from)
    m, a = trace.meta, trace.meta.extra["authors"]
    counts: dict[str, int] = {}
    for rec in trace.records:
        counts[rec.phase] = counts.get(rec.phase, 0) + 1
    print(
        f"wrote {args.out}: {m.schedule}, pp={m.pp_degree}, {m.num_stages} stages, {m.num_microbatches} "
        f"microbatches; records " + ", ".join(f"{k} {v}" for k, v in counts.items())
    )
    if "plan_batch_ms" in a:
        print(
            f"authors' bounds and plan: upper {a['upper_batch_ms']} ms, lower {a.get('lower_batch_ms')} ms, "
            f"planned {a['plan_batch_ms']} ms"
        )


def _cmd_pack(args: argparse.Namespace) -> None:
    traces: dict = {}  # every bad argument is found before anything is packed
    for folder in args.folders:
        found = traces_in(folder)
        if not found:
            raise PlannerError(f"{folder}: no trace folder (trace/ with meta.json) or trace.tar.gz below it")
        traces.update(dict.fromkeys(found))
    for t in traces:
        pack_trace(t, say=print)


_COMMANDS = {
    "plan": _cmd_plan,
    "sweep": _cmd_sweep,
    "gantt": _cmd_gantt,
    "orders": _cmd_orders,
    "simulate": _cmd_simulate,
    "import-log": _cmd_import_log,
    "pack": _cmd_pack,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 2 user error).

    The cyclic garbage collector is off while a command runs (and back as it was after): a plan allocates
    millions of acyclic objects (records, dicts, lists) that reference counting frees, and the collector's
    passes over them took 15 % of a 98k-action plan (issue 48)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        args = build_parser().parse_args(argv)
        _COMMANDS[args.command](args)
    except PlannerError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        print(f"error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    finally:
        if collecting:
            gc.enable()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
