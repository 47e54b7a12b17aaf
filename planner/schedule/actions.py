"""Action names as torch.distributed.pipelining spells them (``str(_Action)``): ``<stage><kind><microbatch>``
(e.g. ``2B5``), and DualPipeV's overlapped pairs ``(<stage>F<mb>;<stage>B<mb>)OVERLAP_F_B``
(e.g. ``(0F3;3B1)OVERLAP_F_B``: the forward of stage 0, microbatch 3 and the full backward of stage 3,
microbatch 1, run by one schedule action).

A pair is one action of the schedule (one DAG node, one trace record, one planned freeze ratio). Its
``stage`` and ``microbatch`` are its *backward* part's: that is the part whose duration shrinks when
parameters are frozen, so the pair's freeze ratio is the one of that (stage, microbatch), and it counts
towards that stage's budget. ``Action.forward`` holds the forward part's (stage, microbatch).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

PAIR = "OVERLAP_F_B"
"""Kind of an overlapped forward+backward pair (torch's ``_ComputationType.OVERLAP_F_B``)."""
KINDS = ("F", "B", "I", "W", PAIR)
"""F forward, B full backward, I input-grad backward, W weight-grad backward, OVERLAP_F_B a forward and a
full backward of two stages of one rank run as one action (DualPipeV)."""
FREEZABLE_KINDS = ("B", "W", PAIR)
"""Kinds whose duration shrinks when parameters are frozen (a pair's through its backward part)."""

_ACTION_RE = re.compile(r"^(\d+)([FBIW])(\d+)$")
_PAIR_RE = re.compile(r"^\((\d+)F(\d+);(\d+)B(\d+)\)OVERLAP_F_B$")


@dataclass(frozen=True, order=True)
class Action:
    stage: int
    kind: str
    microbatch: int
    forward: tuple[int, int] | None = None
    """Pairs only: (stage, microbatch) of the forward part; ``stage``/``microbatch`` are the backward part's."""

    def __str__(self) -> str:
        if self.forward is not None:
            return f"({self.forward[0]}F{self.forward[1]};{self.stage}B{self.microbatch}){PAIR}"
        return f"{self.stage}{self.kind}{self.microbatch}"

    @property
    def parts(self) -> tuple[Action, ...]:
        """The plain actions this one runs: itself, or a pair's forward and backward (in torch's order)."""
        if self.forward is None:
            return (self,)
        return (Action(self.forward[0], "F", self.forward[1]), Action(self.stage, "B", self.microbatch))


def pair_action(fwd_stage: int, fwd_microbatch: int, bwd_stage: int, bwd_microbatch: int) -> Action:
    """The OVERLAP_F_B pair of forward (fwd_stage, fwd_microbatch) and full backward (bwd_stage, bwd_microbatch)."""
    return Action(bwd_stage, PAIR, bwd_microbatch, (fwd_stage, fwd_microbatch))


def _bad(name: object) -> ValueError:
    return ValueError(
        f"not an action name: {name!r} (expected <stage><F|B|I|W><microbatch>, e.g. '2B5', "
        "or a pair (<stage>F<microbatch>;<stage>B<microbatch>)OVERLAP_F_B)"
    )


@lru_cache(maxsize=None)
def parse_action(name: str) -> Action:
    """Parse ``"2B5"`` or ``"(0F3;3B1)OVERLAP_F_B"``; raises ``ValueError`` (message names the bad string)
    for anything else (``TypeError`` for an unhashable value). Each name is parsed once per process (the
    :class:`Action` is frozen, so the cached one is shared; a hit costs no Python call): a 100k-action batch
    asks for every name a dozen times."""
    if not isinstance(name, str):
        raise _bad(name)
    m = _ACTION_RE.match(name)
    if m is not None:
        return Action(int(m.group(1)), m.group(2), int(m.group(3)))
    p = _PAIR_RE.match(name)
    if p is None:
        raise _bad(name)
    return pair_action(int(p.group(1)), int(p.group(2)), int(p.group(3)), int(p.group(4)))


_PLAIN_LINES = re.compile(r"^(0|[1-9][0-9]*)([FBIW])(0|[1-9][0-9]*)$", re.MULTILINE | re.ASCII)
_GROUPS = tuple(map(operator.itemgetter, range(3)))


def plain_fields(names: list[str]) -> tuple[list[int], list[str], list[int]] | None:
    """Stage, kind and microbatch of every name when each is a plain action in canonical form (``str`` of its
    :class:`Action`, e.g. ``"2B5"``), read by one regular-expression scan over all of them; None when any is not
    (a pair, a non-canonical or a bad name: :func:`parse_action` then says what each is). The fields
    :func:`parse_action` gives, without an object per name: a 100k-action batch is read in a few hundredths of a
    second."""
    text = "\n".join(names)
    found = _PLAIN_LINES.findall(text)
    if len(found) != len(names) or text.count("\n") != len(names) - 1 or not names:
        return None  # (a name with a line break in it could pass as two)
    stage, kind, microbatch = (list(map(get, found)) for get in _GROUPS)  # (a column at a time, not zip(*found))
    return list(map(int, stage)), kind, list(map(int, microbatch))


def action_fields(names: list[str]) -> tuple[list[int], list[str], list[int]]:
    """Stage, kind and microbatch of every name, as :func:`parse_action` gives them (a pair: its backward part's
    stage and microbatch, kind ``OVERLAP_F_B``): :func:`plain_fields`' one scan where every name is a plain one,
    else :func:`parse_action` name by name, which raises on the first bad one."""
    plain = plain_fields(names)
    if plain is not None:
        return plain
    acts = [parse_action(a) for a in names]
    return [a.stage for a in acts], [a.kind for a in acts], [a.microbatch for a in acts]


def action_kind(name: str) -> str:
    """The kind of an action name (``"2B5"`` -> ``"B"``), with :func:`parse_action`'s checks and errors."""
    return parse_action(name).kind


def part_owners(names: Iterable[str]) -> dict[str, str]:
    """``{part name: pair name}`` for the two parts of every pair among ``names`` (``"0F3"`` and ``"3B1"``
    -> ``"(0F3;3B1)OVERLAP_F_B"``); plain actions are not listed. What a runtime that sees the parts one
    by one needs to name and time the action they belong to."""
    out: dict[str, str] = {}
    for name in names:
        act = parse_action(name)
        if act.forward is not None:
            for part in act.parts:
                out[str(part)] = name
    return out
