"""The committed measurements of the runtime's own cost (issue 48 item 5): ``docs/results/runtime/overhead-3`` (after
the one-pass drift check and the overlapped gather), ``overhead-4`` (after the freezing hook's and the step's second
pass), ``overhead-5`` (fewer switches, one longest path a step), ``overhead-6`` (the draws in ``begin_batch``),
``overhead-7`` (each action's whole frame counted), ``overhead-8`` (the switches set lazily) and ``overhead-9`` (the
draws of a 0/1 plan kept).
Every figure each page quotes is what its committed step times give. Fails when a file is missing."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.figures_util import linked_figures, overhead_job_rows
from timelyfreeze.experiments.runtime import report as rr
from timelyfreeze.experiments.stats import mean_ci

ROOT = Path(__file__).resolve().parents[1]
RUNS = ("overhead-3", "overhead-4", "overhead-5", "overhead-6", "overhead-7", "overhead-8", "overhead-9")
SCHEDULES = ("1F1B", "ZBVZeroBubble")


def _folder(run: str) -> Path:
    return ROOT / "docs" / "results" / "runtime" / run


def _lines(run: str) -> list[dict]:
    return [json.loads(line) for line in (_folder(run) / "results.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("run", RUNS)
def test_each_jobs_figures_are_what_its_committed_step_times_give_and_the_report_holds_their_means(run):
    lines = _lines(run)
    assert sorted((r["schedule"], r["repeat"]) for r in lines) == [(s, k) for s in SCHEDULES for k in range(6)]
    rows = overhead_job_rows(_folder(run))
    assert all("own_pct" in r for r in rows)  # every job of these protocols split the gather's wait out
    report = (_folder(run) / "bench_runtime.md").read_text()
    made = [line for line in rr._overhead_means(rows, SimpleNamespace(schedules=list(SCHEDULES), r_max=0.6)) if line]
    assert len(made) == 2 and all(line in report for line in made)


@pytest.mark.parametrize("run", RUNS)
def test_the_pages_figures_are_the_means_of_the_result_lines(run):
    """The page's table, row by row (own %, own ms, direct %, direct ms, the gather's wait in ms), each row 1F1B then
    ZBV: the mean [95 % t-interval] over the 6 jobs, linked to ``results.jsonl``; the README quotes some of them."""
    lines = _lines(run)
    made = []
    for key, unit in (("own_pct", "%"), ("own_ms", "ms"), ("direct_pct", "%"), ("direct_ms", "ms"), ("wait_ms", "ms")):
        for schedule in SCHEDULES:
            m, lo, hi, n = mean_ci(r[key] for r in lines if r["schedule"] == schedule)
            assert n == 6
            made.append(f"{m:.2f} [{lo:.2f}, {hi:.2f}] {unit}")
    assert linked_figures((_folder(run) / "README.md").read_text(), r"results\.jsonl") == made
    for q in linked_figures((ROOT / "README.md").read_text(), rf"{run}/results\.jsonl"):
        assert q in made, q


@pytest.mark.parametrize("run", ("overhead-4", "overhead-5", "overhead-6"))
def test_the_split_and_conditions_are_the_result_lines(run):
    """These pages also quote *own*'s split by part (mean ms per step), the jobs' load and their masked steps."""
    lines = _lines(run)
    page = (_folder(run) / "README.md").read_text()
    parts = ("own_hook_ms", "own_profiler_ms", "own_step_ms")
    split = {s: [f"{mean_ci(r[k] for r in lines if r['schedule'] == s)[0]:.2f}" for k in parts] for s in SCHEDULES}
    one = " ".join(page.split())  # the page's text, its line breaks as spaces
    rest = "`begin_step`/`end_step` and the other calls" if run == "overhead-6" else "`begin_step`/`end_step`"
    words = "1F1B the freezing hook {}, the profiler listener {}, " + rest + " {}"
    assert words.format(*split["1F1B"]) in one
    assert "ZBV {}, {} and {}.".format(*split["ZBVZeroBubble"]) in one
    load = [r["loadavg_1m"] for r in lines]
    assert f"was {min(load):.2f}-{max(load):.2f}, every job" in one
    masked = [round(r["plain_ms"]) for r in lines]
    assert f"Masked steps took {min(masked)}-{max(masked)} ms" in one


def test_overhead_5_compares_its_masked_steps_with_overhead_4s():
    """overhead-5's page: how much longer its masked steps took than overhead-4's (the mean of the jobs' medians)."""
    before, after = ([r["plain_ms"] for r in _lines(run)] for run in ("overhead-4", "overhead-5"))
    b, a = sum(before) / len(before), sum(after) / len(after)
    one = " ".join((_folder("overhead-5") / "README.md").read_text().split())
    assert f"took about {round(100 * (a / b - 1))} % longer" in one and f"{b:.0f} to {a:.0f} ms" in one


def test_overhead_6_compares_its_code_and_its_steps_with_overhead_5s():
    """overhead-6's page: the own code in ms and the masked steps against overhead-5's (means over each run's jobs),
    and the range of ZBV's jobs."""
    before, after = _lines("overhead-5"), _lines("overhead-6")
    one = " ".join((_folder("overhead-6") / "README.md").read_text().split())

    def mean(lines, key, schedule=None):
        vals = [r[key] for r in lines if schedule is None or r["schedule"] == schedule]
        return sum(vals) / len(vals)

    own = [f"{mean(x, 'own_ms', s):.2f}" for s in SCHEDULES for x in (before, after)]
    assert "fell from {} to {} (1F1B) and from {} to {} (ZBV)".format(*own) in one
    b, a = mean(before, "plain_ms"), mean(after, "plain_ms")
    assert f"ran about {round(100 * (1 - a / b))} % faster" in one and f"{b:.0f} to {a:.0f} ms" in one
    zbv = [r for r in after if r["schedule"] == "ZBVZeroBubble"]
    own_ms, steps, pct = ([r[k] for r in zbv] for k in ("own_ms", "plain_ms", "own_pct"))
    assert (
        f"{min(own_ms):.1f}-{max(own_ms):.1f} ms of own code at {min(steps):.0f}-{max(steps):.0f} ms steps, "
        f"{min(pct):.2f}-{max(pct):.2f} %" in one
    )


def _split_conditions_and_before(run: str, before_run: str) -> tuple[list[dict], list[dict], str]:
    """The checks a whole-frame page (overhead-7 on) shares: *own*'s split by part (the actions' frames, the draws, the
    rest; mean ms per step), the masked steps' switches and draw, the jobs' load and masked steps, and the run before's
    mean *own* beside its own. Returns (its lines, the run before's lines, the page's text on one line)."""
    lines, before = _lines(run), _lines(before_run)
    one = " ".join((_folder(run) / "README.md").read_text().split())

    def mean(key, schedule):
        return mean_ci(r[key] for r in lines if r["schedule"] == schedule)[0]

    split = {s: [f"{mean(k, s):.2f}" for k in ("own_actions_ms", "own_draws_ms", "own_step_ms")] for s in SCHEDULES}
    words = "1F1B the actions' frames {}, the draws {}, `begin_step`/`end_step` and the other calls {}"
    assert words.format(*split["1F1B"]) in one
    assert "ZBV {}, {} and {}.".format(*split["ZBVZeroBubble"]) in one
    for key in ("switch_pct", "draw_pct"):
        assert all(f"{mean(key, s):.3f}" in one for s in SCHEDULES)
    load = [r["loadavg_1m"] for r in lines]
    assert f"was {min(load):.2f}-{max(load):.2f}, every job" in one
    masked = [round(r["plain_ms"]) for r in lines]
    assert f"Masked steps took {min(masked)}-{max(masked)} ms" in one
    own = [f"{mean_ci(r['own_pct'] for r in before if r['schedule'] == s)[0]:.2f}" for s in SCHEDULES]
    assert "{} had {} % (1F1B) and {} % (ZBV)".format(before_run, *own) in one
    return lines, before, one


def test_overhead_7_quotes_its_split_conditions_and_overhead_6s_figures():
    """overhead-7's page: *own*'s split by part (the actions' frames, the draws, the rest; mean ms per step), the
    masked steps' switches and draw, the jobs' load and masked steps, and overhead-6's means beside its own."""
    lines, before, one = _split_conditions_and_before("overhead-7", "overhead-6")

    def mean(key, schedule):
        return mean_ci(r[key] for r in lines if r["schedule"] == schedule)[0]

    b, a = (sum(r["plain_ms"] for r in x) / len(x) for x in (before, lines))
    assert f"medians was {a:.0f} ms, against {b:.0f} ms in overhead-6" in one
    assert f"ran about {round(100 * (a / b - 1))} % slower" in one
    zbv = [r["own_pct"] for r in lines if r["schedule"] == "ZBVZeroBubble"]
    assert f"ZBV's jobs spread over {min(zbv):.2f}-{max(zbv):.2f} %" in one
    ms = [f"{mean(k, s):.1f}" for s, k in (("1F1B", "own_ms"), ("ZBVZeroBubble", "own_ms"))]
    assert "about {} ms of a 1F1B step and about {} ms of a ZBV step".format(*ms) in one


def _beside_the_verdict(lines: list[dict], one: str) -> None:
    """What a page from overhead-8 on states beside its verdict: *own less the switches* (per job ``own_pct -
    switch_pct``, mean [95 % t-interval] over the 6 jobs of each schedule), the spread of ZBV's jobs' *own*, and the
    wall comparison's means and intervals."""
    less = []
    for s in SCHEDULES:
        m, lo, hi, n = mean_ci(r["own_pct"] - r["switch_pct"] for r in lines if r["schedule"] == s)
        assert n == 6
        less.append(f"{m:.2f} [{lo:.2f}, {hi:.2f}] %")
    assert "own less the switches: 1F1B {}, ZBV {}".format(*less) in one
    zbv = [r["own_pct"] for r in lines if r["schedule"] == "ZBVZeroBubble"]
    assert f"its jobs spread over {min(zbv):.2f}-{max(zbv):.2f} %" in one
    wall = [
        "{:.2f} [{:.2f}, {:.2f}] %".format(*mean_ci(r["overhead_pct"] for r in lines if r["schedule"] == s)[:3])
        for s in SCHEDULES
    ]
    assert "The wall comparison resolves nothing ({} and {})".format(*wall) in one


def test_overhead_8_quotes_its_split_conditions_overhead_7s_figures_and_own_less_the_switches():
    """overhead-8's page: *own*'s split by part and the masked steps' switches and draw (means), the jobs' load and
    masked steps, overhead-7's means beside its own, and what it states beside the verdict."""
    lines, before, one = _split_conditions_and_before("overhead-8", "overhead-7")
    _beside_the_verdict(lines, one)
    switch7 = [f"{mean_ci(r['switch_pct'] for r in before if r['schedule'] == s)[0]:.3f}" for s in SCHEDULES]
    assert "(overhead-7, by the old rule: {} and {} %)".format(*switch7) in one
    b, a = (sum(r["plain_ms"] for r in x) / len(x) for x in (before, lines))
    assert f"medians was {a:.0f} ms, against {b:.0f} ms in overhead-7" in one


def test_overhead_9_quotes_its_split_conditions_overhead_8s_figures_and_own_less_the_switches():
    """overhead-9's page: *own*'s split by part and the masked steps' switches and draw (means), the jobs' load and
    masked steps, overhead-8's means (shares and ms) and parts beside its own, *own less the switches* beside the
    verdict, the spread of ZBV's jobs and the wall comparison."""
    lines, before, one = _split_conditions_and_before("overhead-9", "overhead-8")
    _beside_the_verdict(lines, one)

    def means(rows, key):
        return [mean_ci(r[key] for r in rows if r["schedule"] == s)[0] for s in SCHEDULES]

    b, a = (sum(r["plain_ms"] for r in x) / len(x) for x in (before, lines))
    assert f"medians was {a:.0f} ms, against {b:.0f} ms in overhead-8" in one
    ms8, ms9 = (["{:.2f}".format(m) for m in means(x, "own_ms")] for x in (before, lines))
    assert "{} and {} ms a step, against {} and {} ms here".format(*ms8, *ms9) in one
    plain = ["{:.0f}".format(means(x, "plain_ms")[0]) for x in (lines, before)]
    assert "(masked {} ms on average here, {} ms there)".format(*plain) in one
    draws, rest = ([f"{means(x, k)[1]:.2f}" for x in (before, lines)] for k in ("own_draws_ms", "own_step_ms"))
    assert "came down from {} to {} ms a step".format(*draws) in one
    assert "other calls went from {} to {} ms".format(*rest) in one


@pytest.mark.parametrize("run", ("overhead-8", "overhead-9"))
def test_the_runtime_index_quotes_overhead_8_and_9(run):
    """``docs/results/runtime/README.md``'s sentences on overhead-8 and -9: own per schedule (mean [interval], ms) and
    own less the switches, from the result lines."""
    lines = _lines(run)
    index = " ".join((ROOT / "docs" / "results" / "runtime" / "README.md").read_text().split())

    def ci(values):
        m, lo, hi, _ = mean_ci(values)
        return f"{m:.2f} % [{lo:.2f}, {hi:.2f}]"

    by = {s: [r for r in lines if r["schedule"] == s] for s in SCHEDULES}
    own = [ci(r["own_pct"] for r in by[s]) for s in SCHEDULES]
    ms = [f"{mean_ci(r['own_ms'] for r in by[s])[0]:.1f}" for s in SCHEDULES]
    assert f"gives {own[0]} (1F1B, {ms[0]} ms) and {own[1]} (ZBV, {ms[1]} ms)" in index
    less = [ci(r["own_pct"] - r["switch_pct"] for r in by[s]) for s in SCHEDULES]
    assert f"{less[0]} and {less[1]}." in index
