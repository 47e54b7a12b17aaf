"""Action names as torch.distributed.pipelining spells them: ``<stage><kind><microbatch>`` (e.g. ``2B5``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

KINDS = ("F", "B", "I", "W")
"""F forward, B full backward, I input-grad backward, W weight-grad backward."""
FREEZABLE_KINDS = ("B", "W")
"""Kinds whose duration shrinks when parameters are frozen."""

_ACTION_RE = re.compile(r"^(\d+)([FBIW])(\d+)$")


@dataclass(frozen=True, order=True)
class Action:
    stage: int
    kind: str
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"


def _match(name: str) -> re.Match[str]:
    m = _ACTION_RE.match(name) if isinstance(name, str) else None
    if m is None:
        raise ValueError(f"not an action name: {name!r} (expected <stage><F|B|I|W><microbatch>, e.g. '2B5')")
    return m


def parse_action(name: str) -> Action:
    """Parse ``"2B5"``; raises ``ValueError`` (message names the bad string) for anything else."""
    m = _match(name)
    return Action(int(m.group(1)), m.group(2), int(m.group(3)))


def action_kind(name: str) -> str:
    """The kind of an action name (``"2B5"`` -> ``"B"``), with :func:`parse_action`'s checks and errors.
    For loops over every action of a batch: building the :class:`Action` costs 4x the match."""
    return _match(name).group(2)
