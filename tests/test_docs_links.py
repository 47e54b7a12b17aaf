"""README.md and docs/**/*.md: every relative link resolves, and the README stays short.

A link is ``[text](target)`` or ``![alt](target)`` outside code; web links (``scheme://``, ``mailto:``) are
not followed. A target must name an existing file or folder, relative to the page. An anchor (``#part``),
on its own or after a Markdown page, must be the GitHub anchor of a heading of that page
(``timelyfreeze.config.doc.heading_anchor``; a repeated heading gets ``-1``, ``-2``, ... as on GitHub).
No torch needed.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import pytest

from timelyfreeze.config.doc import heading_anchor

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 300

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+).+?\1", re.S)
# link text may hold one level of brackets: [1.246 [1.163, 1.330]](cells.csv)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def pages() -> list[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def prose(text: str) -> str:
    """The text without fenced code blocks and code spans (their brackets are not links)."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def links(text: str) -> list[str]:
    return _LINK.findall(prose(text))


@lru_cache(maxsize=None)
def anchors(page: Path) -> frozenset[str]:
    """GitHub's anchors of every heading of ``page``."""
    seen: dict[str, int] = {}
    out = set()
    for heading in _HEADING.findall(_FENCE.sub("", page.read_text(encoding="utf-8"))):
        slug = heading_anchor(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return frozenset(out)


def broken(page: Path) -> list[str]:
    bad = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
            continue  # https://, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with anchor #{anchor}")
    return bad


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken(page) == []


def test_readme_is_short():
    n = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines, at most {README_MAX_LINES}"


def test_checker_finds_what_it_should(tmp_path):
    (tmp_path / "there.md").write_text("# A `b.c` heading, too\n\n## Same\n\n## Same\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md) [ok](there.md#a-bc-heading-too) [ok](there.md#same-1) [ok](https://x.org/y)\n"
        "[1.2 [1.1, 1.3]](missing.csv) ![pic](gone.png) [bad](there.md#nope) [self](#nope)\n"
        "`[not a link](nowhere)`\n```\n[not a link](nowhere)\n```\n",
        encoding="utf-8",
    )
    assert broken(page) == [
        "missing.csv: no such file",
        "gone.png: no such file",
        "there.md#nope: no heading with anchor #nope",
        "#nope: no heading with anchor #nope",
    ]
