"""Atomic file output: write to a sibling temporary file, then ``os.replace`` it into place."""

from __future__ import annotations

import os
from collections.abc import Callable

from .errors import PlannerError


def replace_atomically(path: str | os.PathLike[str], write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)``, then move the result to ``path``; readers never see a partial file.

    An ``OSError`` becomes a one-line :class:`PlannerError` naming ``path``; the temporary file is removed.
    """
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise PlannerError(f"{path}: cannot write: {e.strerror or e}") from None
