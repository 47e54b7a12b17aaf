"""A user's instruction data in the Alpaca format, read into ``Pair``s.

The file holds JSON lines (one object a line; blank lines are skipped) or one JSON array of objects. Each object
has ``instruction`` (a non-empty string), ``output`` (the response: a non-empty string) and optionally ``input``
(a string; absent or empty: none). Other keys are ignored. A file that breaks a rule is one
``FreezeConfigError`` naming the file, the record (line, or array index) and the field.
"""

from __future__ import annotations

import json
from pathlib import Path

from timelyfreeze.data.instruct_pairs import Pair
from timelyfreeze.job.errors import FreezeConfigError


def read_alpaca(path: str | Path, setting: str = "[instruct] data_path") -> list[Pair]:
    """The pairs of the Alpaca-format file at ``path`` (named in errors with the ``setting`` that gave it)."""
    path = Path(path)
    where = f"{setting} = {str(path)!r}"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise FreezeConfigError(f"{where}: cannot read the file ({type(e).__name__}: {e})") from None
    records: list[tuple[str, object]] = []
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise FreezeConfigError(f"{where}: not a JSON array ({e})") from None
        records = [(f"record {i}", item) for i, item in enumerate(items)]
    else:
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append((f"line {n}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise FreezeConfigError(f"{where}: line {n} is not a JSON object ({e.msg})") from None
    if not records:
        raise FreezeConfigError(f"{where}: the file holds no records")
    return [_pair(rec, f"{where}: {label}", f"{path.name}:{label.split()[-1]}") for label, rec in records]


def _pair(rec: object, where: str, source: str) -> Pair:
    if not isinstance(rec, dict):
        raise FreezeConfigError(f"{where} is not a JSON object")
    for field in ("instruction", "output"):
        if field not in rec:
            raise FreezeConfigError(f"{where}: field {field!r} is missing")
        if not isinstance(rec[field], str):
            raise FreezeConfigError(f"{where}: field {field!r} must be a string")
        if not rec[field].strip():
            raise FreezeConfigError(
                f"{where}: field {field!r} is empty" + (" (an empty response)" if field == "output" else "")
            )
    inp = rec.get("input", "")
    if inp is None:
        inp = ""
    if not isinstance(inp, str):
        raise FreezeConfigError(f"{where}: field 'input' must be a string")
    return Pair(rec["instruction"], inp, rec["output"], source)
