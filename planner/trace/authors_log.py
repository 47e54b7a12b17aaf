"""Logs of the paper authors' TorchTitan fork (``orangingq/torchtitan``) as this project's traces (no torch).

Their TimelyFreeze runs print, from the last pipeline rank, blocks of one batch's actions::

    [rank3]:2026-01-02 14:04:49,048 - ✅ Pipeline schedule is saved as: .../260102_1404_max_batch_time.svg
    [rank3]:			> Batch Time: 677.09 ms, GPU Bubble Ratio: 31.50%, 26.86%, 35.22%, 27.45%
    [rank3]:			  [Rank 0]	[S0,MB0,F]  0-18-18ms      | [S0,MB1,F]  18-13-32ms     | ...

one ``[Rank r]`` line per pipeline rank, one ``[S<stage>,MB<microbatch>,<kind>]  start-duration-endms`` entry
per action (kind ``F``, ``B``, ``BI`` = input grad, ``BW`` = weight grad; an ``AFR(..)`` note may follow).
What each block is (read from their code and logs, ``docs/formats.md``, "Importing the authors' logs"):

* ``..._max_batch_time.svg`` / ``..._min_batch_time.svg``: the upper / lower bound's per-action durations,
  measured; their start times are *simulated* (list scheduling on the DAG), so they are not kept.
* ``..._frozen_pipeline_schedule.svg``: their LP's plan (durations chosen, starts simulated), followed by a
  ``> Batch Time: X ms (Average Freeze Ratio: .., Time Reduction Rate: ..)`` line.
* ``..._step<N>_rank<r>.svg``: *measured*, per action the median start (relative to its rank's first action)
  and median duration over the last 50 pipeline batches before step ``N``.  Within a rank the gaps are real;
  across ranks the clocks are pinned (rank ``r``'s first action starts at rank ``r-1``'s first action's end).

Every number is printed truncated to a whole ms; the importer takes the middle of each interval (``+0.5``).

:func:`parse_log` reads a log; :func:`log_to_trace` makes the trace: phase ``upper`` from the upper-bound
block (no ``start_ms``), phase ``lower`` from the measured blocks inside the lower-bound monitoring window
(with ``start_ms``), phase ``stable`` from the measured blocks from step ``stable_from`` on (a reference
window: the planner never reads it) and ``progressive`` for those between.  The meta's ``authors`` field keeps
what the log says about their own plan and bounds.
"""

from __future__ import annotations

import gzip
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from planner.errors import PlannerError
from planner.schedule.meta import TRACE_FORMAT, validate_meta
from planner.schedule.orders import rank_orders
from planner.trace.load import Record, Trace
from planner.trace.simulate import write_trace

__all__ = [
    "TRUNCATION_MS",
    "AuthorsLog",
    "Block",
    "Entry",
    "import_log",
    "log_to_trace",
    "needed_lines",
    "parse_log",
    "parse_text",
]

TRUNCATION_MS = 0.5
"""Added to every printed (int-truncated) start and duration: the middle of the interval it stands for."""
BATCHES_PER_BLOCK = 50
"""Pipeline batches a measured block's medians cover (the last ones before its step)."""
_KINDS = {"F": "F", "B": "B", "BI": "I", "BW": "W"}
_FREEZABLE = ("B", "W")

_HEADER = re.compile(r"^\[rank(\d+)\]:.*Pipeline schedule is saved as: \S*?([^/\s]+)\.svg\s*$")
_BATCH = re.compile(r"^\[rank(\d+)\]:\s*> Batch Time: ([0-9.]+) ms")
_RANK_LINE = re.compile(r"^\[rank(\d+)\]:\s*\[Rank (\d+)\]\s(.*)$")
_ENTRY = re.compile(r"^\[S(\d+),MB(\d+),(F|B|BI|BW)\]\s+(-?\d+)-(-?\d+)-(-?\d+)ms(?:\s+AFR\([^)]*\):\s*[-0-9.]+)?$")
_PLAN_LINE = re.compile(
    r"> Batch Time: ([0-9.]+) ms \(Average Freeze Ratio: ([0-9.]+), Time Reduction Rate: ([0-9.]+)\)"
)
_SCHEDULE = re.compile(r"Using pipeline schedule (\S+) with (\d+) microbatches and (\d+) stages")
_ACCUM = re.compile(r"gradient accumulation steps (\d+)")
_STEP_MARK = re.compile(r"\[Step (\d+)\] \S+\s+(Monitoring|Setting) (Upperbound|Lowerbound)")
_STEP_BLOCK = re.compile(r"_step(\d+)_rank\d+$")


@dataclass(frozen=True)
class Entry:
    """One printed action: this project's action name, and the printed start, duration, end (whole ms)."""

    action: str
    start: int
    dur: int
    end: int


@dataclass
class Block:
    """One printed block: ``kind`` is ``upper``, ``lower_bound``, ``plan``, ``measured`` or ``other``;
    ``step`` for measured blocks; ``batch_ms`` the printed batch time; ``ranks``: rank -> entries in order."""

    name: str
    kind: str
    step: int | None
    batch_ms: float | None
    ranks: dict[int, list[Entry]]
    line: int


@dataclass
class AuthorsLog:
    """What :func:`parse_log` read from one log."""

    source: str
    schedule: str
    num_microbatches: int
    num_stages: int
    accumulation: int
    upper_window: tuple[int, int] | None
    lower_window: tuple[int, int] | None
    blocks: list[Block]
    plan_batch_ms: float | None = None
    plan_reduction: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def measured(self) -> list[Block]:
        return [b for b in self.blocks if b.kind == "measured"]

    def first(self, kind: str) -> Block | None:
        return next((b for b in self.blocks if b.kind == kind), None)


def _block_kind(name: str) -> tuple[str, int | None]:
    if name.endswith("_max_batch_time"):
        return "upper", None
    if name.endswith("_min_batch_time"):
        return "lower_bound", None
    if name.endswith("_frozen_pipeline_schedule"):
        return "plan", None
    m = _STEP_BLOCK.search(name)
    if m:
        return "measured", int(m.group(1))
    return "other", None


def _entries(text: str, where: str) -> list[Entry]:
    out = []
    for part in text.split("|"):
        part = part.strip()
        if not part:
            continue
        m = _ENTRY.match(part)
        if m is None:
            raise PlannerError(f"{where}: cannot read the action entry {part[:60]!r}")
        s, mb, kind, start, dur, end = m.groups()
        out.append(Entry(f"{int(s)}{_KINDS[kind]}{int(mb)}", int(start), int(dur), int(end)))
    return out


def parse_text(text: str, source: str) -> AuthorsLog:
    """Read a log's text (module docstring); a malformed or incomplete log is a one-line :class:`PlannerError`
    naming ``source`` and the line."""
    schedule = None
    num_mb = num_stages = None
    accumulation = None
    marks: dict[tuple[str, str], int] = {}
    blocks: list[Block] = []
    plan_ms = plan_rr = None
    cur: Block | None = None
    cur_rank = None
    for i, line in enumerate(text.splitlines(), 1):
        if schedule is None and (m := _SCHEDULE.search(line)):
            schedule, num_mb, num_stages = m.group(1), int(m.group(2)), int(m.group(3))
        if accumulation is None and (m := _ACCUM.search(line)):
            accumulation = int(m.group(1))
        if m := _STEP_MARK.search(line):
            marks.setdefault((m.group(2), m.group(3)), int(m.group(1)))
        if m := _HEADER.match(line):
            kind, step = _block_kind(m.group(2))
            cur = Block(m.group(2), kind, step, None, {}, i)
            cur_rank = m.group(1)
            blocks.append(cur)
            continue
        if plan_ms is None and (m := _PLAN_LINE.search(line)):
            plan_ms, plan_rr = float(m.group(1)), float(m.group(3))
            continue
        if cur is None:
            continue
        if (m := _BATCH.match(line)) and m.group(1) == cur_rank and cur.batch_ms is None and not cur.ranks:
            cur.batch_ms = float(m.group(2))
        elif (m := _RANK_LINE.match(line)) and m.group(1) == cur_rank:
            r = int(m.group(2))
            if r in cur.ranks:
                raise PlannerError(f"{source}:{i}: block {cur.name!r} has rank {r} twice")
            cur.ranks[r] = _entries(m.group(3), f"{source}:{i}")
    if schedule is None:
        raise PlannerError(f"{source}: no 'Using pipeline schedule ... with N microbatches and S stages' line")
    for b in blocks:
        if b.kind != "other" and (not b.ranks or sorted(b.ranks) != list(range(len(b.ranks)))):
            raise PlannerError(f"{source}:{b.line}: block {b.name!r} lacks rank lines (has {sorted(b.ranks)})")
    upper = (
        (marks[("Monitoring", "Upperbound")], marks[("Setting", "Upperbound")])
        if (("Monitoring", "Upperbound") in marks and ("Setting", "Upperbound") in marks)
        else None
    )
    lower = (
        (marks[("Monitoring", "Lowerbound")], marks[("Setting", "Lowerbound")])
        if (("Monitoring", "Lowerbound") in marks and ("Setting", "Lowerbound") in marks)
        else None
    )
    return AuthorsLog(source, schedule, num_mb, num_stages, accumulation or 1, upper, lower, blocks, plan_ms, plan_rr)


def needed_lines(text: str) -> list[str]:
    """The lines of a log that :func:`parse_text` reads: every other line leaves its state unchanged, so the
    parse of these lines is the parse of the whole log (only the line numbers in error messages differ).
    ``scripts/extract_authors_logs.py`` commits these lines of the authors' logs."""
    searched = (_SCHEDULE, _ACCUM, _STEP_MARK, _PLAN_LINE)
    anchored = (_HEADER, _BATCH, _RANK_LINE)
    return [
        line
        for line in text.splitlines()
        if any(p.search(line) for p in searched) or any(p.match(line) for p in anchored)
    ]


def parse_log(path: str | os.PathLike[str]) -> AuthorsLog:
    """:func:`parse_text` on a file (gzip-compressed when its name ends in ``.gz``); an unreadable file is a
    one-line :class:`PlannerError`."""
    path = os.fspath(path)
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except (OSError, EOFError) as e:
        raise PlannerError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    return parse_text(text, path)


def block_span(block: Block) -> float:
    """A block's batch on its own clocks: the latest printed end over the earliest printed start (ms)."""
    ents = [e for es in block.ranks.values() for e in es]
    return max(e.end for e in ents) - min(e.start for e in ents)


def _rank_orders(log: AuthorsLog, block: Block, pp: int) -> dict[int, list[str]]:
    """This project's order of the schedule (``planner.schedule.orders.rank_orders``), with a split backward
    ``sI m, sW m`` read as one ``sB m`` where the log prints a full ``B`` (ZBV's stage 0): the log's set of
    actions per rank must then be the order's."""

    spr = log.num_stages // pp
    try:
        orders = rank_orders(log.schedule, pp, log.num_microbatches, spr if spr > 1 else None)
    except (PlannerError, ValueError, KeyError) as e:
        raise PlannerError(f"{log.source}: schedule {log.schedule!r}: {e}") from None
    out: dict[int, list[str]] = {}
    for r, order in orders.items():
        have = {e.action for e in block.ranks.get(r, [])}
        new = []
        for a in order:
            k = a.rstrip("0123456789")
            stage, mb = k[:-1], a[len(k) :]
            if k.endswith("I") and f"{stage}B{mb}" in have:
                new.append(f"{stage}B{mb}")
            elif k.endswith("W") and f"{stage}B{mb}" in have:
                continue
            else:
                new.append(a)
        if set(new) != have or len(new) != len(have):
            extra = sorted(have - set(new))[:3]
            missing = sorted(set(new) - have)[:3]
            raise PlannerError(
                f"{log.source}:{block.line}: rank {r}'s actions do not match schedule {log.schedule!r} "
                f"(log only: {extra}, schedule only: {missing})"
            )
        out[r] = new
    return out


def log_to_trace(log: AuthorsLog, *, stable_from: int | None = None) -> Trace:
    """The trace of a parsed log (module docstring).  ``stable_from``: first step of the stable reference
    window (default: twice the step the lower-bound window ends at).  Needs the upper-bound block, a measured
    block inside the lower-bound window and the window marks; else a one-line :class:`PlannerError`."""
    src = log.source
    upper = log.first("upper")
    if upper is None:
        raise PlannerError(f"{src}: no upper-bound block ('..._max_batch_time.svg'): not a TimelyFreeze run?")
    if log.lower_window is None or log.upper_window is None:
        raise PlannerError(f"{src}: no '[Step N] ... Monitoring/Setting Lowerbound' marks: not a TimelyFreeze run?")
    lo_start, lo_end = log.lower_window
    span_steps = math.ceil(BATCHES_PER_BLOCK / log.accumulation)
    lower = [b for b in log.measured() if b.step - span_steps + 1 > lo_start and b.step <= lo_end]
    if not lower:
        raise PlannerError(
            f"{src}: no measured block ('..._step<N>_rank<r>.svg') covers only the lower-bound window "
            f"(steps {lo_start + 1}-{lo_end}, {span_steps} steps per block)"
        )
    pp = len(upper.ranks)
    stage_to_rank = [0] * log.num_stages
    for r, es in upper.ranks.items():
        for e in es:
            stage_to_rank[int(re.match(r"\d+", e.action).group())] = r
    orders = _rank_orders(log, upper, pp)
    plan = log.first("plan")
    authors: dict[str, Any] = {
        "source": os.path.basename(src),
        "upper_batch_ms": upper.batch_ms,
        "accumulation": log.accumulation,
        "upper_window": list(log.upper_window),
        "lower_window": list(log.lower_window),
        "truncation_ms": TRUNCATION_MS,
    }
    lb = log.first("lower_bound")
    if lb is not None:
        authors["lower_batch_ms"] = lb.batch_ms
    if log.plan_batch_ms is not None:
        authors["plan_batch_ms"] = log.plan_batch_ms
        authors["plan_reduction"] = log.plan_reduction
    meta_d = {
        "format": TRACE_FORMAT,
        "schedule": log.schedule,
        "pp_degree": pp,
        "num_stages": log.num_stages,
        "num_microbatches": log.num_microbatches,
        "stage_to_rank": stage_to_rank,
        "rank_orders": {str(r): o for r, o in orders.items()},
        "method": "authors-log",
        "authors": authors,
    }
    meta = validate_meta(meta_d, f"{src} (meta)")
    ratio = _plan_ratios(upper, lb, plan)
    records: list[Record] = []

    def add(block: Block, phase: str, step: int, starts: bool) -> None:
        if set(block.ranks) != set(range(pp)):
            raise PlannerError(
                f"{src}:{block.line}: block {block.name!r} has ranks {sorted(block.ranks)}, not 0-{pp - 1}"
            )
        for r, es in block.ranks.items():
            if {e.action for e in es} != set(orders[r]):
                raise PlannerError(
                    f"{src}:{block.line}: block {block.name!r}: rank {r}'s actions differ from the upper block's"
                )
            for e in es:
                kind = e.action.rstrip("0123456789")[-1]
                fr = (1.0 if phase == "lower" else ratio.get(e.action, 0.0)) if kind in _FREEZABLE else 0.0
                if phase == "upper":
                    fr = 0.0
                records.append(
                    Record(
                        step,
                        e.action,
                        e.dur + TRUNCATION_MS,
                        phase,
                        fr,
                        r,
                        0,
                        (e.start + TRUNCATION_MS) if starts else None,
                    )
                )

    add(upper, "upper", log.upper_window[1], False)
    for b in lower:
        add(b, "lower", b.step, True)
    stable_from = 2 * lo_end if stable_from is None else stable_from
    for b in log.measured():
        if b.step > lo_end:
            add(b, "stable" if b.step >= stable_from else "progressive", b.step, True)
    meta.extra["authors"]["stable_from"] = stable_from
    return Trace(meta, records, src)


def _plan_ratios(upper: Block, lb: Block | None, plan: Block | None) -> dict[str, float]:
    """Their plan's freeze ratio of each freezable action, ``(max - planned) / (max - min)`` of the printed
    durations (0 where max == min): what the stable records carry as ``freeze_ratio``."""
    if lb is None or plan is None:
        return {}
    dur = [{e.action: e.dur for es in b.ranks.values() for e in es} for b in (upper, lb, plan)]
    out = {}
    for a, hi in dur[0].items():
        lo, d = dur[1].get(a, hi), dur[2].get(a, hi)
        out[a] = min(1.0, max(0.0, (hi - d) / (hi - lo))) if hi > lo else 0.0
    return out


def import_log(path: str | os.PathLike[str], out: str | os.PathLike[str], *, stable_from: int | None = None) -> Trace:
    """Parse the log at ``path`` and write its trace directory to ``out`` (atomically, file by file)."""

    trace = log_to_trace(parse_log(path), stable_from=stable_from)
    write_trace(trace, out)
    return trace
