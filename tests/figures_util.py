"""The figures a page quotes from a results file: the texts of the page's links to that file. Tests that check a
quoted figure against what the committed results give find the figures here, so the link syntax has one home."""

from __future__ import annotations

import re

_TEXT = r"\[([^\[\]]*(?:\[[^\[\]]*\][^\[\]]*)*)\]"  # a link's text, one level of nested brackets allowed


def linked_figures(text: str, target: str) -> list[str]:
    """The texts of the links in ``text`` whose target is ``target`` (a regular expression for the path's end,
    after an optional relative folder path), in order. A link whose text ends in ``.md``, ``.csv``, ``.json``,
    ``.jsonl`` or ``/`` names the file or folder rather than quoting a figure, and is left out."""
    link = _TEXT + r"\((?:[./\w-]*/)?" + target + r"\)"
    return [q for q in re.findall(link, text) if not q.endswith((".md", ".csv", ".json", ".jsonl", "/"))]
