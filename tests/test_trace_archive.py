"""planner.trace.archive: a trace folder as one lossless trace.tar.gz, read wherever the folder was (no torch)."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import pytest

from planner import cli
from planner.errors import PlannerError
from planner.trace import archive
from planner.trace.archive import archive_path, find_trace, pack_trace, read_archive, traces_in, write_archive
from planner.trace.load import load_trace
from planner.trace.simulate import synthetic_trace, write_trace

ROOT = Path(__file__).resolve().parents[1]


def make_trace(job: Path) -> tuple[Path, dict[str, bytes]]:
    """A synthetic trace at ``<job>/dump/timelyfreeze/trace`` and its files' bytes."""
    folder = job / "dump" / "timelyfreeze" / "trace"
    write_trace(synthetic_trace("1F1B", 2, 4, jitter=0.1, seed=3, stable_ratio=0.4), folder)
    return folder, {f.name: f.read_bytes() for f in folder.iterdir()}


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


def test_round_trip_is_byte_identical_and_the_folder_goes(tmp_path):
    folder, files = make_trace(tmp_path / "job")
    lines = []
    got = pack_trace(folder, say=lines.append)
    assert got == folder.parent / "trace.tar.gz" == archive_path(folder)
    assert not folder.exists() and not (folder.parent / ".trace.removing").exists()
    assert read_archive(got) == files
    assert len(lines) == 1 and "3 files" in lines[0] and " -> " in lines[0] and "KiB" in lines[0]


def test_the_same_files_give_the_same_bytes(tmp_path):
    a, files = make_trace(tmp_path / "a")
    b = tmp_path / "b" / "trace"
    b.mkdir(parents=True)
    for name in reversed(sorted(files)):  # other creation order, times and modes
        (b / name).write_bytes(files[name])
        os.utime(b / name, (1e9, 1e9))
        (b / name).chmod(0o600)
    assert pack_trace(a).read_bytes() == pack_trace(b).read_bytes()


def test_committed_archives_are_what_the_packer_writes(tmp_path):
    """The packed runs of docs/results/runtime/first-plan were written by the packer this module replaced: the
    same gzip header and the same tar stream inside. (The deflate bytes between them are compared on one machine
    only, by the test above: another zlib build, e.g. zlib-ng, may compress the same stream differently.)"""
    committed = sorted(ROOT.glob("docs/results/runtime/first-plan/jobs/*/trace.tar.gz"))[:2]
    assert committed, "no committed trace archive under docs/results/runtime/first-plan/jobs"
    for k, arc in enumerate(committed):
        folder = tmp_path / str(k) / "trace"
        folder.mkdir(parents=True)
        for name, data in read_archive(arc).items():
            (folder / name).write_bytes(data)
        write_archive(folder, tmp_path / str(k) / "copy.tar.gz")
        copy, committed_bytes = (tmp_path / str(k) / "copy.tar.gz").read_bytes(), arc.read_bytes()
        assert copy[:10] == committed_bytes[:10]  # gzip header: no name, mtime 0, the same flags
        assert gzip.decompress(copy) == gzip.decompress(committed_bytes)


def test_packing_a_packed_trace_is_a_no_op_that_says_so(tmp_path):
    folder, _ = make_trace(tmp_path / "job")
    arc = pack_trace(folder)
    data, mtime = arc.read_bytes(), arc.stat().st_mtime_ns
    for given in (folder, arc):
        lines = []
        assert pack_trace(given, say=lines.append) == arc
        assert len(lines) == 1 and "already packed (3 files," in lines[0]
    assert arc.read_bytes() == data and arc.stat().st_mtime_ns == mtime
    with pytest.raises(PlannerError, match="no trace folder there, nor an archive trace.tar.gz"):
        pack_trace(tmp_path / "elsewhere" / "trace")


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda b: b[: len(b) // 2], "corrupt trace archive"),  # truncated
        (lambda b: b[:-8] + bytes(8), "corrupt trace archive"),  # CRC and length wrong
        (lambda b: b[:40] + bytes([b[40] ^ 0xFF]) + b[41:], "corrupt trace archive"),  # deflate data
        (lambda b: b"not gzip at all", "corrupt trace archive"),
        (lambda b: gzip.compress(b"x" * 1024, mtime=0), "corrupt trace archive"),  # gzip, but no tar
    ],
)
def test_a_corrupt_archive_is_one_error_line_naming_it(tmp_path, damage, why):
    arc = pack_trace(make_trace(tmp_path / "job")[0])
    arc.write_bytes(damage(arc.read_bytes()))
    for read in (read_archive, load_trace):
        with pytest.raises(PlannerError) as e:
            read(arc)
        assert one_line(e).startswith(f"{arc}: {why}")
    with pytest.raises(PlannerError) as e:
        load_trace(arc.with_name("trace"))  # the packed folder's path reads the archive
    assert one_line(e).startswith(f"{arc}: ")


def test_missing_and_not_a_file_are_one_error_line(tmp_path):
    with pytest.raises(PlannerError, match="trace archive does not exist"):
        load_trace(tmp_path / "trace.tar.gz")
    with pytest.raises(PlannerError, match=r"trace directory does not exist \(nor an archive trace.tar.gz\)"):
        load_trace(tmp_path / "trace")
    (tmp_path / "dir.tar.gz").mkdir()
    with pytest.raises(PlannerError, match="dir.tar.gz: not a file"):
        read_archive(tmp_path / "dir.tar.gz")


def test_load_trace_gives_the_same_trace_from_folder_and_archive(tmp_path):
    folder, _ = make_trace(tmp_path / "job")
    before = load_trace(folder)
    arc = pack_trace(folder)
    for path in (arc, folder, str(folder)):
        after = load_trace(path)
        assert (after.meta, after.records) == (before.meta, before.records)
        assert after.source == str(arc)
    assert find_trace(folder) == arc and find_trace(arc) == arc and find_trace(tmp_path) is None


def test_errors_inside_an_archive_name_the_member(tmp_path):
    folder, files = make_trace(tmp_path / "job")
    (folder / "actions_rank1.jsonl").write_bytes(files["actions_rank1.jsonl"] + b"{bad\n")
    arc = pack_trace(folder)
    with pytest.raises(PlannerError, match=r"trace.tar.gz/actions_rank1.jsonl:\d+: invalid JSON"):
        load_trace(arc)


def test_a_kill_while_removing_never_leaves_a_partial_trace_folder(tmp_path, monkeypatch):
    folder, files = make_trace(tmp_path / "job")
    expected = load_trace(folder)

    def killed(path):  # removes one file of the renamed folder, then the process dies
        next(Path(path).iterdir()).unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(archive.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        pack_trace(folder)
    monkeypatch.undo()
    removing = folder.parent / ".trace.removing"
    assert not folder.exists() and len(list(removing.iterdir())) == len(files) - 1
    got = load_trace(folder)  # not the partial folder: the archive
    assert (got.meta, got.records) == (expected.meta, expected.records)
    assert traces_in(tmp_path) == [archive_path(folder)]
    lines = []
    pack_trace(folder, say=lines.append)
    assert "already packed" in lines[0] and "removed .trace.removing" in lines[0] and not removing.exists()


def test_a_kill_before_the_rename_leaves_the_whole_folder(tmp_path, monkeypatch):
    folder, files = make_trace(tmp_path / "job")

    def killed(*a):
        raise KeyboardInterrupt

    monkeypatch.setattr(archive.os, "rename", killed)
    with pytest.raises(KeyboardInterrupt):
        pack_trace(folder)
    monkeypatch.undo()
    assert {f.name: f.read_bytes() for f in folder.iterdir()} == files and archive_path(folder).is_file()
    assert traces_in(tmp_path) == [folder]  # the folder wins; packing it again finishes the job
    pack_trace(folder)
    assert not folder.exists() and read_archive(archive_path(folder)) == files


def test_an_archive_that_reads_back_wrong_keeps_the_folder(tmp_path, monkeypatch):
    folder, files = make_trace(tmp_path / "job")
    monkeypatch.setattr(archive, "read_archive", lambda p: {**files, "meta.json": b"{}"})
    with pytest.raises(PlannerError, match="meta.json differs") as e:
        pack_trace(folder)
    assert "folder kept" in one_line(e)
    assert {f.name: f.read_bytes() for f in folder.iterdir()} == files and not archive_path(folder).exists()


def test_only_plain_trace_folders_are_packed(tmp_path):
    folder, files = make_trace(tmp_path / "job")
    (folder / "sub").mkdir()
    with pytest.raises(PlannerError, match="sub: not a regular file"):
        pack_trace(folder)
    shutil.rmtree(folder / "sub")
    (folder / "meta.json").unlink()
    with pytest.raises(PlannerError, match="not a trace folder"):
        pack_trace(folder)
    assert len(list(folder.iterdir())) == len(files) - 1


def test_cli_pack(tmp_path, capsys):
    results = tmp_path / "results"
    a, _ = make_trace(results / "jobs" / "a")
    b, b_files = make_trace(results / "jobs" / "b")
    pack_trace(b)
    assert cli.main(["pack", str(results)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2
    assert out[0].startswith(f"{a} -> trace.tar.gz: 3 files, ") and "KiB -> " in out[0]
    assert out[1].startswith(f"{archive_path(b)}: already packed")
    assert not a.exists() and read_archive(archive_path(b)) == b_files
    assert cli.main(["pack", str(a)]) == 0 and "already packed" in capsys.readouterr().out

    for bad, needle in (
        (tmp_path / "missing", "missing: does not exist"),
        (tmp_path, None),  # fine: it holds the results
        (tmp_path / "empty", "no trace folder"),
    ):
        (tmp_path / "empty").mkdir(exist_ok=True)
        code = cli.main(["pack", str(bad)])
        err = capsys.readouterr().err
        if needle is None:
            assert code == 0 and err == ""
            continue
        assert code == 2 and err.startswith("error: ") and needle in err and err.count("\n") == 1


def test_cli_plans_from_an_archive(tmp_path, capsys):
    folder, _ = make_trace(tmp_path / "job")
    arc = pack_trace(folder)
    for given in (arc, folder):
        assert cli.main(["plan", str(given), "--r-max", "0.5", "--out", str(tmp_path / "plan.json")]) == 0
        assert "wrote" in capsys.readouterr().out
    arc.write_bytes(b"broken")
    assert cli.main(["sweep", str(arc), "--r-max", "0.5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {arc}: corrupt trace archive") and err.count("\n") == 1
