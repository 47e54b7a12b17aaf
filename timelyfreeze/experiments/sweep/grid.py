"""A sweep's grid: a grid file (TOML or JSON) or grid flags -> the jobs, their ids and knobs.

Grid file::

    config = "torchtitan_configs/debug.toml"    # base TOML (relative to the grid file; --config wins)
    schedules = ["1F1B", "GPipe"]
    seeds = [0, 1]
    extend_to_target = 2.0                      # time to accuracy: see timelyfreeze.experiments.sweep.extend
    [overrides]                                 # --section.field overrides for every job
    "training.steps" = 40
    [methods]
    none = true                                 # no knob: one job per (schedule, seed)
    timelyfreeze = [0.4, 0.8]                   # the knob values (here r_max)
    timelyfreeze_apf = {values = [0.8], overrides = {"freeze.apf.threshold" = 0.05}}
    apf = [0.05]
    random = {matched = "timelyfreeze"}         # one random job per timelyfreeze job of the same (seed, schedule),
                                                # freezing the per-stage shares that run realised (knob "matched");
                                                # with bracket = true the timelyfreeze job runs again right after it
    [schedule_overrides.Interleaved1F1B]        # extra overrides for jobs of one schedule
    "parallelism.pipeline_parallel_layers_per_stage" = 1

Method names and knobs are ``timelyfreeze.config.freeze.METHODS`` / ``METHOD_KNOBS`` (the runtime's table).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import tomllib
from pathlib import Path
from typing import Any, Sequence

from timelyfreeze.config.freeze import METHOD_KNOBS, METHODS, PLANNED_METHODS

# method -> (knob name as summary.json spells it, CLI flag); a method without a knob (``none``) has None.
KNOBS: dict[str, tuple[str, str] | None] = {
    m: (METHOD_KNOBS[m].split(".")[-1], f"--freeze.{METHOD_KNOBS[m]}") if m in METHOD_KNOBS else None for m in METHODS
}
NO_FREEZING = "none"
"""The baseline method: time-to-accuracy and predicted throughput are measured against its runs."""


class GridError(ValueError):
    """A grid file or grid flag that cannot be expanded; the message says what is wrong."""


@dataclasses.dataclass(frozen=True)
class Job:
    schedule: str
    method: str
    knob_value: float | str | None
    """The knob's value; ``"matched"`` for a job matched to another (``matched_to``)."""
    seed: int
    overrides: tuple[tuple[str, Any], ...] = ()
    """``--section.field`` overrides in order (grid, then schedule, then method ones)."""
    extend: float | None = None
    """Time-to-accuracy extension (``extend_to_target``): the job may train up to this many times the
    no-freezing run's steps until it reaches that run's final validation loss; None for ``none`` jobs."""
    matched_to: str | None = None
    """The job id whose realised per-stage freeze shares this job freezes (``random = {matched = ...}``): it
    runs right after that job and reads its dump folder (``--freeze.random.matched``)."""
    repeat: int = 0
    """0 for a job's first run; 1 for its second run with the same settings, right after the job matched to it
    (``random = {matched = ..., bracket = true}``), so that the matched job is bracketed in time by the two."""

    @property
    def knob_name(self) -> str | None:
        knob = KNOBS[self.method]
        return knob[0] if knob else None

    @property
    def job_id(self) -> str:
        parts = [self.schedule, self.method]
        if self.matched_to is not None:
            # the matched job's cell without its schedule and seed: 1F1B__random__ratio=matched-timelyfreeze-r_max0.6
            parts.append(f"{self.knob_name}=matched-" + "-".join(self.matched_to.split("__")[1:-1]).replace("=", ""))
        elif self.knob_name is not None:
            parts.append(f"{self.knob_name}={fmt_value(self.knob_value)}")
        parts.append(f"seed={self.seed}")
        if self.repeat:
            parts.append(f"repeat={self.repeat}")
        return "__".join(parts)

    def spec(self) -> dict[str, Any]:
        """What identifies the job's result: a finished job with another spec is stale."""
        return (
            {
                "schedule": self.schedule,
                "method": self.method,
                "knob": None if self.knob_name is None else {"name": self.knob_name, "value": self.knob_value},
                "seed": self.seed,
                "overrides": [[k, v] for k, v in self.overrides],
            }
            | ({"extend_to_target": self.extend} if self.extend is not None else {})
            | ({"matched_to": self.matched_to} if self.matched_to is not None else {})
            | ({"repeat": self.repeat} if self.repeat else {})
        )


def fmt_value(v: Any) -> str:
    """Short, file-name-safe text of a knob value: 0.8 -> '0.8', 1e-05 -> '1e-05', 90.0 -> '90'."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (int, float)):
        return format(v, "g")
    return str(v)


def load_grid_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_bytes()
        grid = json.loads(text) if path.suffix == ".json" else tomllib.loads(text.decode())
    except (OSError, ValueError) as e:  # tomllib.TOMLDecodeError and JSONDecodeError are ValueErrors
        raise GridError(f"{path}: {e}") from e
    if not isinstance(grid, dict):
        raise GridError(f"{path}: the grid must be a table/object")
    if "config" in grid and not Path(grid["config"]).is_absolute():
        grid["config"] = str((path.parent / grid["config"]).resolve())
    return grid


def parse_method_flag(text: str) -> tuple[str, list[float] | None]:
    """``timelyfreeze=0.4,0.8`` -> ("timelyfreeze", [0.4, 0.8]); ``none`` -> ("none", None)."""
    name, _, values = text.partition("=")
    name = name.strip()
    if not values.strip():
        return name, None
    try:
        return name, [float(v) for v in values.split(",") if v.strip()]
    except ValueError as e:
        raise GridError(f"--method {text!r}: knob values must be numbers ({e})") from e


def parse_set_flag(text: str) -> tuple[str, Any]:
    """``training.steps=40`` -> ("training.steps", 40); values are read as TOML when they parse."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise GridError(f"--set {text!r}: expected section.field=value")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip().lstrip("-"), value


MATCHABLE = {"random": "freeze.random.matched"}
"""Methods that can freeze another job's realised per-stage shares -> the setting that names its dump folder."""


def _method_entries(methods: Any) -> list[tuple[str, list[Any] | None, dict[str, Any]]]:
    if not isinstance(methods, dict) or not methods:
        raise GridError("the grid names no methods (a [methods] table or --method flags)")
    out = []
    for name, spec in methods.items():
        if name not in KNOBS:
            raise GridError(f"unknown method {name!r}; known: {', '.join(KNOBS)}")
        overrides: dict[str, Any] = {}
        if isinstance(spec, dict):
            unknown = set(spec) - {"values", "overrides", "matched", "bracket"}
            if unknown:
                raise GridError(
                    f"method {name!r}: unknown keys {sorted(unknown)} (values, overrides, matched, bracket)"
                )
            if "bracket" in spec and "matched" not in spec:
                raise GridError(f"method {name!r}: bracket needs matched")
            overrides = dict(spec.get("overrides", {}))
            if "matched" in spec:
                out.append((name, [_matched_target(name, spec)], overrides))
                continue
            spec = spec.get("values")
        if KNOBS[name] is None:
            if spec not in (None, True, [], False):
                raise GridError(f"method {name!r} has no knob: write {name} = true")
            if spec is False:
                continue
            out.append((name, None, overrides))
            continue
        if isinstance(spec, (int, float)) and not isinstance(spec, bool):
            spec = [spec]
        if not isinstance(spec, list) or not spec:
            knob = KNOBS[name][0]
            raise GridError(f"method {name!r} needs a list of {knob} values, got {spec!r}")
        for v in spec:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise GridError(f"method {name!r}: knob value {v!r} is not a number")
        out.append((name, list(spec), overrides))
    return out


@dataclasses.dataclass(frozen=True)
class _Matched:
    """A grid entry's ``matched = "<method>"``: one job per job of that method (same seed and schedule);
    ``bracket``: that job runs again right after it (``Job.repeat``)."""

    method: str
    bracket: bool = False


def _matched_target(name: str, spec: dict[str, Any]) -> _Matched:
    target = spec["matched"]
    if name not in MATCHABLE:
        raise GridError(f"method {name!r} cannot be matched to another run (only {', '.join(MATCHABLE)})")
    if "values" in spec:
        raise GridError(f"method {name!r}: give either values or matched, not both")
    if not isinstance(target, str) or target not in PLANNED_METHODS:
        raise GridError(
            f"method {name!r}: matched = {target!r} must name a planned method ({', '.join(sorted(PLANNED_METHODS))})"
        )
    bracket = spec.get("bracket", False)
    if not isinstance(bracket, bool):
        raise GridError(f"method {name!r}: bracket = {bracket!r} must be true or false")
    return _Matched(target, bracket)


def _as_list(x: Any, what: str) -> list[Any]:
    if x is None:
        raise GridError(f"the grid names no {what}")
    lst = x if isinstance(x, list) else [x]
    if not lst:
        raise GridError(f"the grid names no {what}")
    return lst


def expand_grid(grid: dict[str, Any]) -> list[Job]:
    """One job per (seed, schedule, method, knob value), in that nesting order (interleaved: every cell's
    seed ``i`` before any seed ``i + 1``, so the machine's slow periods spread over all cells and an
    interrupted sweep has every cell at the same depth); ``none`` has no knob and runs first in its
    (seed, schedule). A matched job runs right after the job it is matched to; a bracketed one is followed by
    that job's repeat (``Job.repeat``): ``[target, matched, target again]``, a block (``bracket_blocks``)."""
    schedules = [str(s) for s in _as_list(grid.get("schedules"), "schedules")]
    seeds = _as_list(grid.get("seeds", [0]), "seeds")
    if any(isinstance(s, bool) or not isinstance(s, int) for s in seeds):
        raise GridError(f"seeds must be integers, got {seeds!r}")
    base_over = list(dict(grid.get("overrides", {})).items())
    sched_over = grid.get("schedule_overrides", {})
    unknown = set(grid) - {
        "config",
        "schedules",
        "seeds",
        "overrides",
        "methods",
        "schedule_overrides",
        "extend_to_target",
    }
    if unknown:
        raise GridError(f"unknown grid keys {sorted(unknown)}")
    extend = grid.get("extend_to_target")
    if extend is not None and (isinstance(extend, bool) or not isinstance(extend, (int, float)) or extend < 1):
        raise GridError(f"extend_to_target = {extend!r}: must be a number >= 1 (times the no-freezing run's steps)")
    entries = _method_entries(grid.get("methods"))
    for name, values, _ in entries:
        for v in values or []:
            if isinstance(v, _Matched) and v.method not in [e[0] for e in entries]:
                raise GridError(f"method {name!r}: matched = {v.method!r} is not a method of this grid")
    if extend is not None and NO_FREEZING not in [e[0] for e in entries]:
        raise GridError(f"extend_to_target needs the {NO_FREEZING!r} method: its runs set the target loss")
    # the no-freezing job of a (seed, schedule) runs first: the time-to-accuracy targets come from it
    entries.sort(key=lambda e: e[0] != NO_FREEZING)
    jobs: list[Job] = []
    for seed in seeds:  # outermost: seed i of every cell runs before seed i + 1, so slow periods spread over all
        for schedule in schedules:
            s_over = list(dict(sched_over.get(schedule, {})).items())
            methods = [  # (method, knob values, overrides, extension) of every method of this cell
                (
                    method,
                    values if values is not None else [None],
                    tuple(base_over + s_over + list(m_over.items())),
                    None if extend is None or method == NO_FREEZING else float(extend),
                )
                for method, values, m_over in entries
            ]
            cell = [
                Job(schedule, method, value, seed, overrides, ext)
                for method, values, overrides, ext in methods
                for value in values
                if not isinstance(value, _Matched)
            ]
            for method, values, overrides, ext in methods:  # matched jobs right after the job they match
                for value in values:
                    if isinstance(value, _Matched):
                        for target in [j for j in cell if j.method == value.method]:
                            job = Job(schedule, method, "matched", seed, overrides, ext, target.job_id)
                            at = cell.index(target) + 1
                            cell[at:at] = [job, dataclasses.replace(target, repeat=1)] if value.bracket else [job]
            jobs.extend(cell)
    ids = [j.job_id for j in jobs]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise GridError(f"the grid repeats jobs: {', '.join(dup)}")
    return jobs


def bracket_blocks(jobs: list[Job]) -> dict[str, list[str]]:
    """{job_id: the ids of its block} for every job of a bracketed block: ``[target, the job(s) matched to it,
    the target's repeat]``, in run order. Such a block only means something when its jobs run back to back
    (``back_to_back``; ``runner.resume_plan`` runs it again whole when any of its jobs has to run or they did
    not)."""
    blocks: dict[str, list[str]] = {}
    for job in jobs:
        if job.repeat:
            first = dataclasses.replace(job, repeat=0).job_id
            ids = [first, *(j.job_id for j in jobs if j.matched_to == first), job.job_id]
            blocks.update(dict.fromkeys(ids, ids))
    return blocks


MAX_IDLE_S = 60.0
"""A bracketed block's jobs ran back to back when each started within this many seconds of the previous one's end."""


def _time(text: Any) -> _dt.datetime | None:
    try:
        return _dt.datetime.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        return None


def back_to_back(times: Sequence[tuple[Any, Any]], max_idle_s: float = MAX_IDLE_S) -> tuple[bool | None, float | None]:
    """(whether the jobs ran in this order, each started within ``max_idle_s`` of the previous one's end; the
    idle seconds between them in all) from each job's (start, end) ISO times (``job.json``'s ``start_time`` and
    ``end_time``); (None, None) where a time is missing or unreadable. The one rule for a bracketed block: the
    report counts it only when True, and ``runner.resume_plan`` runs it again whole otherwise."""
    parsed = [(_time(start), _time(end)) for start, end in times]
    if any(t is None for pair in parsed for t in pair):
        return None, None
    gaps = [(parsed[k + 1][0] - parsed[k][1]).total_seconds() for k in range(len(parsed) - 1)]
    return all(0 <= g <= max_idle_s for g in gaps), sum(gaps)
