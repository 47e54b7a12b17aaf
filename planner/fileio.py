"""File I/O with one-line errors: atomic writes (temp file, fsync, ``os.replace``), fsync of a folder, and
JSON reads."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from planner.errors import PlannerError


def replace_atomically(path: str | os.PathLike[str], write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)``, fsync the result, then move it to ``path``; readers never see a
    partial file. An ``OSError`` becomes a one-line :class:`PlannerError` naming ``path``; the
    temporary file is removed."""
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise PlannerError(f"{path}: cannot write: {e.strerror or e}") from None


def sync_dir(path: str | os.PathLike[str]) -> None:
    """fsync the folder ``path``, so that the renames and removals inside it so far survive a crash. An
    ``OSError`` becomes a one-line :class:`PlannerError` naming ``path``."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise PlannerError(f"{path}: cannot sync the folder: {e.strerror or e}") from None


@dataclass(frozen=True)
class Rows:
    """A JSON object of objects of one shape, given as rows: member ``keys[i]`` is ``dict(zip(fields, rows[i]))``
    (what :func:`write_json_atomically` writes for a ``one_line`` value without building those dicts)."""

    keys: list[Any]
    fields: tuple[Any, ...]
    rows: list[tuple]

    def as_dict(self) -> dict:
        return {k: dict(zip(self.fields, row)) for k, row in zip(self.keys, self.rows, strict=True)}


def write_json_atomically(path: str | os.PathLike[str], obj: Any, one_line: str | None = None) -> None:
    """Write ``obj`` as JSON with ``indent=1`` and a trailing newline, atomically.  ``one_line``: a top-level key
    of ``obj`` whose value (an object, or :class:`Rows`) is written with one member per line, each member compact
    (for large maps: the C encoder, ~10x faster than ``indent`` on 100k entries); still valid JSON."""

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            if one_line is None or one_line not in obj:
                json.dump(obj, f, indent=1)
            else:
                rest = {k: v for k, v in obj.items() if k != one_line}
                head = json.dumps(rest, indent=1)
                f.write(head[:-2] + ",\n" if rest else "{\n")
                f.write(f" {json.dumps(one_line)}: {{\n")
                value = obj[one_line]
                f.write(",\n".join(_row_members(value) if isinstance(value, Rows) else _members(value)))
                f.write("\n }\n}")
            f.write("\n")

    replace_atomically(path, write)


def _members(mapping: dict) -> Iterator[str]:
    """Each member of ``mapping`` as ``  "key": value``, the value as the C encoder writes it compactly.  A value
    that is an object of finite floats (a plan's actions) is formatted from one template per key set
    (``float.__repr__`` is what the encoder writes for a finite float): a fifth of the encoder's cost per call."""
    enc, esc = json.JSONEncoder().encode, json.encoder.encode_basestring_ascii
    templates: dict[tuple, str] = {}
    for k, v in mapping.items():
        if type(k) is str and type(v) is dict:
            vals = tuple(v.values())
            if set(map(type, vals)) <= {float} and math.isfinite(sum(vals)):  # (a sum that overflows: the encoder)
                keys = tuple(v)
                t = templates.get(keys)
                if t is None and all(type(kk) is str for kk in keys):
                    t = templates[keys] = _float_object_template(keys)
                if t is not None:
                    yield f"  {esc(k)}: {t % vals}"
                    continue
        yield f"  {enc(k)}: {enc(v)}"


def _float_object_template(keys: tuple[str, ...], conversion: str = "r") -> str:
    """A %-template of the compact JSON object with string ``keys`` whose values, finite floats, fill its ``%r``s
    (``float.__repr__`` is what the encoder writes for a finite float); ``conversion="s"``: ``%s``, for the values'
    reprs already made."""
    esc = json.encoder.encode_basestring_ascii
    return "{" + ", ".join(esc(k).replace("%", "%%") + f": %{conversion}" for k in keys) + "}"


def _row_members(rows: Rows) -> Iterator[str]:
    """:func:`_members` of ``rows.as_dict()``, the same text: where every key and field is a string and every value
    a finite float (a plan's actions), from one template and one check over all rows, without a dict per row and
    without a Python call per row (:func:`_float_reprs` formats the numbers)."""
    values = list(chain.from_iterable(rows.rows))
    nf = len(rows.fields)
    if (
        {*map(type, rows.keys)} <= {str}
        and {*map(type, rows.fields)} <= {str}
        and {*map(len, rows.rows)} <= {nf}
        and {*map(type, values)} <= {float}
        and math.isfinite(sum(values))  # (a sum that overflows: _members, the same text)
    ):
        t = "  %s: " + _float_object_template(rows.fields, "s")
        text = _float_reprs(values)
        esc = json.encoder.encode_basestring_ascii
        return map(t.__mod__, zip(map(esc, rows.keys), *(text[i::nf] for i in range(nf)), strict=True))
    return _members(rows.as_dict())


def _float_reprs(values: list[float]) -> list[str]:
    """``list(map(repr, values))`` for finite floats, each distinct value formatted once: a plan's 491,520 numbers
    hold about 75,000 distinct ones (a forward's ``w_min`` is its ``w_max``, most durations are ``w_max``, most
    ratios 0), and ``float.__repr__`` was most of writing the plan. Distinct by their bits, so 0.0 and -0.0 (equal
    numbers) keep their own reprs."""
    bits, at = np.unique(np.array(values, dtype=np.float64).view(np.int64), return_inverse=True)
    text = np.array(list(map(repr, bits.view(np.float64).tolist())), dtype=object)
    return text[at.reshape(-1)].tolist()


def read_json(path: str | os.PathLike[str], missing: str) -> Any:
    """Parse a JSON file; a missing file, an unreadable one or bad JSON is a one-line PlannerError
    (``missing`` says what the file is for, e.g. "plan file does not exist")."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise PlannerError(f"{path}: {missing}") from None
    except OSError as e:
        raise PlannerError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise PlannerError(f"{path}: not UTF-8 text: {e.reason}") from None
    return parse_json(text, path)


def parse_json(text: str | bytes, where: str) -> Any:
    """Parse JSON text (bytes: UTF-8) that came from ``where``; bad JSON or bytes that are not UTF-8 are a
    one-line PlannerError naming ``where`` (and the line)."""
    try:
        return json.loads(text.decode("utf-8") if isinstance(text, bytes) else text)
    except UnicodeDecodeError as e:
        raise PlannerError(f"{where}: not UTF-8 text: {e.reason}") from None
    except json.JSONDecodeError as e:
        raise PlannerError(f"{where}:{e.lineno}: invalid JSON: {e.msg}") from None
