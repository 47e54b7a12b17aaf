"""The authors'-logs results page is recomputed from the committed lines of the paper authors' logs (issue 49):
``docs/results/authors-logs/logs`` (kept by ``scripts/extract_authors_logs.py``, sources in ``sources.csv``)."""

from __future__ import annotations

import gzip
import shutil
import subprocess
from pathlib import Path

import pytest

from planner.analysis import authors_logs
from planner.analysis.authors_logs_source import kept_path, read_sources, run_method
from planner.analysis.authors_logs_source import main as extract_main
from planner.trace.authors_log import needed_lines, parse_log, parse_text

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "results" / "authors-logs"
LOGS = PAGE / "logs"
EXCERPT = Path(__file__).parent / "data" / "authors_logs" / "gpipe_excerpt.log"


def test_needed_lines_parse_as_the_whole_log():
    text = "".join(
        f"{line}\n[rank3]:2026-01-02 14:05:00 - step: {i} loss: 2.0\n"
        for i, line in enumerate(EXCERPT.read_text().splitlines())
    )
    whole, kept = parse_text(text, "x"), parse_text("\n".join(needed_lines(text)), "x")
    assert needed_lines(text) == EXCERPT.read_text().splitlines()  # the excerpt holds only needed lines
    for a, b in zip(whole.blocks, kept.blocks, strict=True):
        assert (a.name, a.kind, a.step, a.batch_ms, a.ranks) == (b.name, b.kind, b.step, b.batch_ms, b.ranks)
    assert (whole.upper_window, whole.lower_window, whole.plan_batch_ms, whole.accumulation) == (
        kept.upper_window,
        kept.lower_window,
        kept.plan_batch_ms,
        kept.accumulation,
    )


def test_kept_logs_are_the_sources_listed(tmp_path):
    rows = read_sources(str(LOGS))
    assert (LOGS / "LICENSE").read_text().startswith("BSD 3-Clause License")
    listed = {Path(kept_path(str(LOGS), r["path"])) for r in rows}
    assert listed == set(LOGS.rglob("*.gz"))
    assert sum(r["set"] == "dev" for r in rows) == 16  # 12 TimelyFreeze-family + 4 no-freezing runs
    for r in rows:
        assert run_method(r["path"]) is not None
        with gzip.open(kept_path(str(LOGS), r["path"]), "rt", encoding="utf-8") as f:
            assert len(f.read().splitlines()) == int(r["kept_lines"])
    gz = tmp_path / "x.log.gz"
    gz.write_bytes(gzip.compress(EXCERPT.read_bytes()))
    assert parse_log(gz).plan_batch_ms == parse_log(EXCERPT).plan_batch_ms


def test_results_and_heldout_pages_are_recomputed_from_the_committed_logs(tmp_path):
    dev, test = authors_logs.run(str(LOGS))
    assert len(dev) == 16 and len(test) == 36
    authors_logs.write(dev, test, str(tmp_path))
    for name in ("results.md", "results.csv", "heldout.md", "heldout.csv"):
        assert (tmp_path / name).read_text() == (PAGE / name).read_text(), name


def test_extraction_keeps_dev_and_scorable_test_logs(tmp_path):
    """``scripts/extract_authors_logs.py`` on a small git repository laid out as the fork: the development run is
    kept whole-parse-equal, a TimelyFreeze-family log the importer cannot read is listed as excluded with its
    reason, baselines and ``old``/``eval`` folders are skipped, and the licence is copied."""
    if shutil.which("git") is None:
        pytest.skip("needs the git command (the script reads a clone of the fork)")
    repo = tmp_path / "fork"
    dev = repo / "logs" / "h200" / "260102_llama8b" / "260102_GPipe_fullrand7.log"
    noisy = "".join(f"{line}\n[rank0]: noise {i}\n" for i, line in enumerate(EXCERPT.read_text().splitlines()))
    files = {
        dev: noisy,
        repo
        / "logs"
        / "m"
        / "1224_GPipe_fullrand7_42.log": "Using pipeline schedule GPipe with 8 microbatches and 4 stages.\n",
        repo / "logs" / "m" / "1224_GPipe_apf_42.log": noisy,
        repo / "logs" / "m" / "old" / "1224_GPipe_fullrand7_42.log": noisy,
        repo / "LICENSE": "BSD 3-Clause License\n",
    }
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    out = tmp_path / "kept"
    assert extract_main([str(repo / ".git"), "--out", str(out), "--commit", "HEAD"]) == 0
    rows = read_sources(str(out))
    assert [(r["set"], r["path"], int(r["kept_lines"])) for r in rows] == [
        ("dev", "logs/h200/260102_llama8b/260102_GPipe_fullrand7.log", len(EXCERPT.read_text().splitlines()))
    ]
    kept = parse_log(kept_path(str(out), rows[0]["path"]))
    assert [b.name for b in kept.blocks] == [b.name for b in parse_log(EXCERPT).blocks]
    excluded = (out / "excluded.csv").read_text().splitlines()
    assert len(excluded) == 2 and excluded[1].startswith("logs/m/1224_GPipe_fullrand7_42.log,")
    assert (out / "LICENSE").read_text() == "BSD 3-Clause License\n"
    assert extract_main([str(tmp_path / "nothing"), "--out", str(out)]) == 2
