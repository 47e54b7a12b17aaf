"""docs/config.md is generated from the ``[freeze]`` field docstrings (their one home) and stays in step."""

from __future__ import annotations

from dataclasses import dataclass, field

from timelyfreeze.config import doc as config_doc
from timelyfreeze.config.freeze import Freeze


def test_committed_page_is_the_generated_one():
    committed = config_doc.DOC_PATH.read_text(encoding="utf-8")
    assert committed == config_doc.render(), "docs/config.md is stale: run python scripts/config_doc.py"


def test_every_field_and_section_has_a_docstring():
    assert config_doc.undocumented(Freeze) == []


def test_page_lists_every_field_of_every_section_with_its_flag():
    page = config_doc.render()
    for path, _, fields in config_doc.sections(Freeze):
        assert f"## `[freeze{'.' + path if path else ''}]`" in page
        for fd in fields:
            assert f"flag `--freeze.{fd.path}`" in page


@dataclass
class _Inner:
    knob: float = 0.5
    """The knob, ``0..1``."""


@dataclass
class _Base:
    base_flag: bool = True
    """From the base class."""


@dataclass
class _Outer(_Base):
    name: str = "x"
    """A name
    over two lines."""
    sizes: list[int] = field(default_factory=lambda: [1, 2])
    undocumented: int = 3
    inner: _Inner = field(default_factory=_Inner)
    """The nested section."""


def test_generator_on_a_made_up_config():
    """Nested sections, inherited fields, factories, TOML defaults, missing docstrings are all handled."""
    secs = config_doc.sections(_Outer)
    assert [path for path, _, _ in secs] == ["", "inner"]
    top = {fd.path: fd for fd in secs[0][2]}
    assert list(top) == ["base_flag", "name", "sizes", "undocumented"]
    assert top["base_flag"].default == "true" and top["base_flag"].doc == "From the base class."
    assert top["name"].default == '"x"' and top["name"].doc == "A name over two lines."
    assert top["sizes"].default == "[1, 2]" and top["sizes"].type == "list[int]"
    assert secs[1][2][0].path == "inner.knob" and secs[1][2][0].doc == "The knob, `0..1`."
    assert config_doc.undocumented(_Outer) == ["sizes", "undocumented"]
    page = config_doc.render(_Outer)
    assert "## `[freeze.inner]`" in page and "The nested section." in page
    assert "| [`inner.knob`](#innerknob) | `float` | `0.5` |" in page
    assert "### `inner.knob`" in page and config_doc.heading_anchor("`inner.knob`") == "innerknob"
