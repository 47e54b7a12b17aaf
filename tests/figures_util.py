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


def overhead_job_rows(folder) -> list[dict]:
    """The overhead jobs of a results folder (its ``results.jsonl`` and packed ``jobs/``): each job's figures
    recomputed from its committed step times (``bench_overhead.json``), checked against its result line, as report
    rows (kind, schedule, repeat and the figures)."""
    import json

    from timelyfreeze.experiments.runtime.analysis import overhead_figures

    rows = []
    for line in (folder / "results.jsonl").read_text().splitlines():
        rec = json.loads(line)
        job = folder / "jobs" / f"{rec['kind']}_{rec['schedule']}_{rec['repeat']}"
        steps = json.loads((job / "bench_overhead.json").read_text())
        fig = overhead_figures([r for r in steps if r["kind"] != "cycle"])
        assert fig == {k: rec[k] for k in fig}, job
        rows.append({"kind": rec["kind"], "schedule": rec["schedule"], "repeat": rec["repeat"], **fig})
    return rows
