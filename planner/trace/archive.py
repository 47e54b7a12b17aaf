"""Trace archives: a trace folder as one lossless ``<folder>.tar.gz`` where the folder sat (``trace/`` ->
``trace.tar.gz``; the format: ``docs/formats.md``).

The archive holds every file of the folder as ``trace/<name>``: regular files only, sorted by name, mode 0644,
owner 0/0 with no names, mtime 0, in a PAX tar compressed by gzip at level 9 with mtime 0 and no file name, so
the same files give the same bytes. :func:`pack_trace` writes it atomically, reads it back, and removes the folder
only when the archive holds exactly its files and bytes; the folder is first renamed ``.<folder>.removing``, so a
kill while removing never leaves a partial trace folder that a reader would take for the trace.
:func:`find_trace` says where the trace a path names is (the folder, else its archive) and :func:`read_archive`
gives an archive's files; every problem is a one-line :class:`PlannerError` naming the path.
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import tarfile
import zlib
from collections.abc import Callable
from pathlib import Path

from planner.errors import PlannerError
from planner.fileio import replace_atomically, sync_dir
from planner.schedule.meta import META_FILE

SUFFIX = ".tar.gz"
TRACE_NAME = "trace"
"""The folder name the runtime writes a trace under (``<dump_folder>/timelyfreeze/trace``), and the one folder every
archive holds its files in."""
_MODE = 0o644


def archive_path(folder: str | os.PathLike[str]) -> Path:
    """Where the archive of the trace folder ``folder`` goes: ``<folder>.tar.gz`` beside it."""
    folder = Path(folder)
    return folder.with_name(folder.name + SUFFIX)


def is_archive_path(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a trace archive (by its name: ``*.tar.gz``)."""
    return os.fspath(path).endswith(SUFFIX)


def find_trace(path: str | os.PathLike[str]) -> Path | None:
    """The trace that ``path`` names: the folder ``path`` when it holds ``meta.json``, else the archive (``path``
    itself when it is one, or ``<path>.tar.gz``); None when neither is there."""
    p = Path(path)
    if is_archive_path(p):
        return p if p.is_file() else None
    if (p / META_FILE).is_file():
        return p
    a = archive_path(p)
    return a if a.is_file() else None


def traces_in(path: str | os.PathLike[str]) -> list[Path]:
    """The traces ``path`` is or holds: ``[path]`` for a trace folder (any name, with ``meta.json``) or archive,
    the archive for a packed folder's path; for any other folder every ``trace/`` folder with ``meta.json`` below
    it and every ``trace.tar.gz`` with no such folder beside it, sorted. A path that does not exist or is
    neither is a PlannerError."""
    p = Path(path)
    if (is_archive_path(p) and p.is_file()) or (p / META_FILE).is_file():
        return [p]
    if not p.exists() and archive_path(p).is_file():  # a trace folder packed already
        return [archive_path(p)]
    if not p.exists():
        raise PlannerError(f"{p}: does not exist")
    if not p.is_dir():
        raise PlannerError(f"{p}: not a trace folder, a trace archive or a folder that holds them")
    found = []
    for here, dirs, files in os.walk(p):
        folder = Path(here) / TRACE_NAME
        if TRACE_NAME in dirs and (folder / META_FILE).is_file():
            found.append(folder)
            dirs.remove(TRACE_NAME)  # a trace folder holds no traces
        elif TRACE_NAME + SUFFIX in files:
            found.append(archive_path(folder))
    return sorted(found)


def folder_files(folder: str | os.PathLike[str]) -> dict[str, bytes]:
    """Every file of the trace folder ``folder`` by name; a folder without ``meta.json``, one holding anything but
    regular files (a subfolder, a link), or an unreadable file is a PlannerError."""
    folder = Path(folder)
    if not (folder / META_FILE).is_file():
        raise PlannerError(f"{folder}: not a trace folder (no {META_FILE})")
    files = {}
    try:
        for f in sorted(folder.iterdir()):
            if f.is_symlink() or not f.is_file():
                raise PlannerError(f"{f}: not a regular file; a trace folder is packed only when it holds files alone")
            files[f.name] = f.read_bytes()
    except OSError as e:
        raise PlannerError(f"{e.filename or folder}: cannot read: {e.strerror or e}") from None
    return files


def write_archive(folder: str | os.PathLike[str], dest: str | os.PathLike[str]) -> None:
    """Write the trace folder ``folder`` as an archive to ``dest``, atomically (module docstring: the same files
    give the same bytes); the folder stays."""
    files = folder_files(folder)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, compresslevel=9, mtime=0) as gz:
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for name, data in sorted(files.items()):
                    info = tarfile.TarInfo(f"{TRACE_NAME}/{name}")
                    info.size, info.mode, info.mtime = len(data), _MODE, 0
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    tar.addfile(info, io.BytesIO(data))

    replace_atomically(dest, write)


def read_archive(path: str | os.PathLike[str]) -> dict[str, bytes]:
    """The files of the trace archive ``path`` by name (``meta.json``, ``actions_rank0.jsonl``, ...), checked
    whole (gzip CRC and length); a missing path, a folder, a corrupt archive or a member other than a regular
    file ``trace/<name>`` is a one-line PlannerError naming ``path``."""
    p = Path(path)
    if not p.exists():
        raise PlannerError(f"{p}: trace archive does not exist")
    if not p.is_file():
        raise PlannerError(f"{p}: not a file (a trace archive is a {SUFFIX} file)")
    try:
        packed = p.read_bytes()
    except OSError as e:
        raise PlannerError(f"{p}: cannot read: {e.strerror or e}") from None
    files: dict[str, bytes] = {}
    try:
        raw = gzip.decompress(packed)
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            for m in tar:
                name = m.name.removeprefix(f"{TRACE_NAME}/")
                if not m.isreg() or name == m.name or "/" in name or name in ("", ".", ".."):
                    raise PlannerError(f"{p}: not a trace archive: member {m.name!r} is not a file {TRACE_NAME}/<name>")
                if name in files:
                    raise PlannerError(f"{p}: not a trace archive: member {m.name!r} twice")
                files[name] = tar.extractfile(m).read()
    except (OSError, EOFError, zlib.error, tarfile.TarError) as e:
        raise PlannerError(f"{p}: corrupt trace archive: {' '.join(str(e).split()) or type(e).__name__}") from None
    if not files:
        raise PlannerError(f"{p}: corrupt trace archive: it holds no file")
    return files


def unpack_trace(path: str | os.PathLike[str], folder: str | os.PathLike[str]) -> Path:
    """Write the files of the trace archive ``path`` into the folder ``folder`` (made if missing; files of the
    same names replaced), e.g. to read or edit a packed trace with other tools; ``folder``."""
    out = Path(folder)
    files = read_archive(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (out / name).write_bytes(data)
    except OSError as e:
        raise PlannerError(f"{e.filename or out}: cannot write: {e.strerror or e}") from None
    return out


def size_text(n: int) -> str:
    """A size in bytes as people read it: ``812 B``, ``40.3 KiB``, ``1.25 MiB``."""
    if n < 1024:
        return f"{n} B"
    return f"{n / 1024:.1f} KiB" if n < 1024**2 else f"{n / 1024**2:.2f} MiB"


def _remove_tree(path: Path) -> None:
    try:
        shutil.rmtree(path)
    except OSError as e:
        raise PlannerError(f"{e.filename or path}: cannot remove: {e.strerror or e}") from None


def pack_trace(folder: str | os.PathLike[str], say: Callable[[str], None] | None = None) -> Path:
    """Pack the trace folder ``folder`` into :func:`archive_path` and remove the folder; the archive's path.

    The archive is written atomically and the parent folder synced, then read back; only when it holds exactly
    the folder's files with the same bytes is the folder renamed ``.<name>.removing``, removed and the parent
    synced; else the archive is removed and the folder stays (PlannerError). Packing a packed trace (``folder``
    gone or the archive's own path given) checks the archive, removes a ``.removing`` folder an interrupted
    packing left, and changes nothing else. ``say`` gets one line: what was packed, sizes before and after,
    or that it was packed already."""
    p = Path(folder)
    if is_archive_path(p):
        p = p.with_name(p.name[: -len(SUFFIX)])
    archive, parent = archive_path(p), p.parent
    removing = parent / f".{p.name}.removing"
    if not (p / META_FILE).is_file():
        if not archive.is_file():
            what = "not a trace folder (no meta.json)" if p.is_dir() else "no trace folder there"
            raise PlannerError(f"{p}: {what}, nor an archive {archive.name} beside it")
        files = read_archive(archive)
        note = ""
        if removing.exists():
            _remove_tree(removing)
            sync_dir(parent)
            note = f"; removed {removing.name}, left by an interrupted packing"
        before, after = sum(map(len, files.values())), archive.stat().st_size
        if say:
            say(f"{archive}: already packed ({len(files)} files, {size_text(before)} -> {size_text(after)}){note}")
        return archive
    write_archive(p, archive)
    sync_dir(parent)
    files = folder_files(p)
    back = read_archive(archive)
    if back != files:
        differ = sorted(set(back) ^ set(files)) or sorted(n for n in files if back[n] != files[n])
        archive.unlink(missing_ok=True)
        raise PlannerError(f"{archive}: read back, {differ[0]} differs from {p}; archive removed, the folder kept")
    if removing.exists():
        _remove_tree(removing)
    try:
        os.rename(p, removing)
    except OSError as e:
        raise PlannerError(f"{p}: cannot rename to {removing.name}: {e.strerror or e}") from None
    _remove_tree(removing)
    sync_dir(parent)
    if say:
        before, after = sum(map(len, files.values())), archive.stat().st_size
        say(f"{p} -> {archive.name}: {len(files)} files, {size_text(before)} -> {size_text(after)}")
    return archive
