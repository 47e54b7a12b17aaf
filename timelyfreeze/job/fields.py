"""How a config section's settings are checked: first every field's declared type, read from the dataclass
annotations (so a field added later is covered without an edit here), then the section's own range rules.
Either way the first bad setting is one ``FreezeConfigError`` naming it: ``[freeze] monitor_steps = 2.5:
must be an integer``, ``[freeze.apf] threshold = 'x': must be a number``.

The types a TOML file or the command line can give a field: ``bool`` (only ``true``/``false``: a bool is
not an integer), ``int`` (not a bool), ``float`` (an int is a number too), ``str``, ``list[X]`` (checked
element by element, ``r_max_per_stage[1]``), ``Literal[...]``, ``X | None``, and nested sections
(dataclasses, shown as ``[freeze.apf]``).
"""

import dataclasses
import types
import typing
from typing import Any, Callable, Literal

from timelyfreeze.job.errors import FreezeConfigError

Rule = tuple[str, Callable[[Any], bool], str]
"""(field, a test its (well-typed) value must pass, what the rule says): ``("ratio", lambda v: 0 <= v <= 1,
"must lie in [0, 1]")``."""

_NOUNS: dict[type, tuple[str, str]] = {
    bool: ("true or false", "true/false values"),
    int: ("an integer", "integers"),
    float: ("a number", "numbers"),
    str: ("a string", "strings"),
}
"""What a value of each plain type is called in an error line (one, several)."""


def fail(section: str, field: str, value: Any, rule: str) -> typing.NoReturn:
    """Raise the one-line error of setting ``[section] field = value``."""
    raise FreezeConfigError(f"[{section}] {field} = {value!r}: {rule}")


def check_section(section: Any, name: str, rules: tuple[Rule, ...]) -> None:
    """The types of every field of ``section`` (shown as ``[name]``), then ``rules`` in order."""
    check_types(section, name)
    for field, ok, rule in rules:
        value = getattr(section, field)
        if not ok(value):
            fail(name, field, value, rule)


def check_types(section: Any, name: str) -> None:
    """Every field of the dataclass ``section`` holds a value of its declared type; nested sections are
    checked the same way under ``[name.field]``."""
    hints = typing.get_type_hints(type(section))
    for f in dataclasses.fields(section):
        value, kind = getattr(section, f.name), hints.get(f.name, Any)
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            if not isinstance(value, kind):
                fail(name, f.name, value, f"must be a [{name}.{f.name}] section")
            check_types(value, f"{name}.{f.name}")
            continue
        bad = _mismatch(value, kind, f.name)
        if bad is not None:
            fail(name, *bad)


def _mismatch(value: Any, kind: Any, label: str) -> tuple[str, Any, str] | None:
    """``(label, value, rule)`` of the first part of ``value`` that is not of type ``kind``, or None."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return None
    if origin in (typing.Union, types.UnionType):
        if any(_mismatch(value, arm, label) is None for arm in args):
            return None
        return label, value, "must be " + " or ".join(_noun(arm) for arm in args)
    if origin is Literal:
        return (
            None
            if value in args and type(value) in {type(a) for a in args}
            else (label, value, "choose one of " + ", ".join(map(str, args)))
        )
    if origin in (list, tuple) or kind in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return label, value, f"must be {_noun(kind)}"
        element = args[0] if args else Any
        for i, item in enumerate(value):
            bad = _mismatch(item, element, f"{label}[{i}]")
            if bad is not None:
                return bad
        return None
    if origin is not None:  # another generic (dict[str, int], ...): its container type only
        kind = origin
    return None if _is_instance(value, kind) else (label, value, f"must be {_noun(kind)}")


def _is_instance(value: Any, kind: Any) -> bool:
    if kind is type(None):
        return value is None
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return not isinstance(kind, type) or isinstance(value, kind)


def _noun(kind: Any) -> str:
    """``kind`` in words: ``an integer``, ``a list of numbers``."""
    if kind is type(None):
        return "absent (none)"
    if kind in _NOUNS:
        return _NOUNS[kind][0]
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (list, tuple) or kind in (list, tuple):
        element = args[0] if args else None
        return "a list of " + _NOUNS[element][1] if element in _NOUNS else "a list"
    return getattr(kind, "__name__", str(kind))
