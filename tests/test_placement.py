"""The placement grid: random jobs matched to TimelyFreeze jobs (grid expansion, command, results rows), and
bracketed ones (``bracket = true``: the TimelyFreeze job runs again right after; the block reruns whole)."""

import sys
from pathlib import Path

import pytest

from timelyfreeze.config.freeze import Freeze, knob_of
from timelyfreeze.experiments.sweep.cli import main as sweep_main
from timelyfreeze.experiments.sweep.command import build_command, matched_dump
from timelyfreeze.experiments.sweep.grid import GridError, Job, back_to_back, expand_grid, load_grid_file
from timelyfreeze.experiments.sweep.results import _parse_job_id, cell_knob, knob_sort_key
from timelyfreeze.experiments.sweep.runner import job_spec, resume_plan, summary_path, write_json

CONFIG = "torchtitan_configs/llama3_debug_finetune_cpu.toml"
FAKE = f"{sys.executable} {Path(__file__).resolve().parent / 'fake_job.py'}"


def _grid(**methods):
    return {"schedules": ["1F1B"], "seeds": [0, 1], "methods": {"none": True, **methods}}


def test_matched_jobs_follow_the_job_they_match():
    jobs = expand_grid(_grid(timelyfreeze=[0.6, 0.8], random={"matched": "timelyfreeze"}))
    ids = [j.job_id for j in jobs]
    assert ids[:5] == [
        "1F1B__none__seed=0",
        "1F1B__timelyfreeze__r_max=0.6__seed=0",
        "1F1B__random__ratio=matched-timelyfreeze-r_max0.6__seed=0",
        "1F1B__timelyfreeze__r_max=0.8__seed=0",
        "1F1B__random__ratio=matched-timelyfreeze-r_max0.8__seed=0",
    ]
    matched = [j for j in jobs if j.matched_to]
    assert len(matched) == 4 and all(j.knob_value == "matched" and j.method == "random" for j in matched)
    assert all(j.matched_to.endswith(f"seed={j.seed}") for j in matched)
    assert matched[0].spec()["matched_to"] == "1F1B__timelyfreeze__r_max=0.6__seed=0"


def test_the_committed_placement_grid_expands():
    jobs = expand_grid(load_grid_file("scripts/placement_grid.toml"))
    assert len(jobs) == 60 and sum(j.matched_to is not None for j in jobs) == 24


@pytest.mark.parametrize(
    "spec, msg",
    [
        ({"matched": "apf"}, "must name a planned method"),
        ({"matched": "timelyfreeze_apf"}, "is not a method of this grid"),
        ({"matched": "timelyfreeze", "values": [0.5]}, "either values or matched"),
    ],
)
def test_bad_matched_entries(spec, msg):
    with pytest.raises(GridError, match=msg):
        expand_grid(_grid(timelyfreeze=[0.6], random=spec))


def test_only_random_can_be_matched():
    with pytest.raises(GridError, match="cannot be matched"):
        expand_grid(_grid(timelyfreeze=[0.6], apf={"matched": "timelyfreeze"}))


def test_a_bracketed_job_is_followed_by_its_targets_repeat():
    jobs = expand_grid(_grid(timelyfreeze=[0.6, 0.8], random={"matched": "timelyfreeze", "bracket": True}))
    assert [j.job_id for j in jobs[:7]] == [
        "1F1B__none__seed=0",
        "1F1B__timelyfreeze__r_max=0.6__seed=0",
        "1F1B__random__ratio=matched-timelyfreeze-r_max0.6__seed=0",
        "1F1B__timelyfreeze__r_max=0.6__seed=0__repeat=1",
        "1F1B__timelyfreeze__r_max=0.8__seed=0",
        "1F1B__random__ratio=matched-timelyfreeze-r_max0.8__seed=0",
        "1F1B__timelyfreeze__r_max=0.8__seed=0__repeat=1",
    ]
    assert (
        build_command(jobs[3], CONFIG, dump_folder="/o/jobs/b/dump")[8:]
        == build_command(jobs[1], CONFIG, dump_folder="/o/jobs/b/dump")[8:]
    )  # the repeat runs with its target's arguments


def test_a_repeat_changes_only_the_repeated_jobs_id_and_spec():
    a = Job("1F1B", "timelyfreeze", 0.8, 3)
    assert "repeat" not in a.spec()  # finished jobs of the earlier grids stay resumable
    b = Job("1F1B", "timelyfreeze", 0.8, 3, repeat=1)
    assert b.job_id == "1F1B__timelyfreeze__r_max=0.8__seed=3__repeat=1" and b.spec() == {**a.spec(), "repeat": 1}
    assert _parse_job_id(b.job_id) == {
        "schedule": "1F1B",
        "method": "timelyfreeze",
        "knob": {"name": "r_max", "value": 0.8},
        "seed": 3,
        "repeat": 1,
    }


@pytest.mark.parametrize(
    "spec, msg",
    [
        ({"matched": "timelyfreeze", "bracket": "yes"}, "must be true or false"),
        ({"values": [0.5], "bracket": True}, "bracket needs matched"),
    ],
)
def test_bad_bracket_entries(spec, msg):
    with pytest.raises(GridError, match=msg):
        expand_grid({"schedules": ["1F1B"], "methods": {"timelyfreeze": [0.6], "random": spec}})


def test_a_block_runs_again_whole(tmp_path, monkeypatch, capsys):
    base = tmp_path / "base.toml"
    base.write_text("[training]\nsteps = 20\n[parallelism]\npipeline_parallel_degree = 2\n")
    grid = tmp_path / "grid.toml"
    grid.write_text(
        f'config = "{base}"\nschedules = ["1F1B"]\nseeds = [0, 1]\n'
        '[methods]\ntimelyfreeze = [0.5]\nrandom = {matched = "timelyfreeze", bracket = true}\n'
    )
    out, calls = tmp_path / "o", tmp_path / "calls.txt"

    def run(fail: str = "") -> list[str]:
        calls.unlink(missing_ok=True)
        monkeypatch.setenv("FAKE_JOB_FAIL", fail)
        sweep_main(["run", "--grid", str(grid), "--out", str(out), "--launcher", FAKE, "--no-report"])
        return calls.read_text().split() if calls.exists() else []

    monkeypatch.setenv("FAKE_JOB_CALLS", str(calls))
    ids = [j.job_id for j in expand_grid(load_grid_file(grid))]
    assert run("random") == ids  # both R jobs fail; every A and B is ok
    capsys.readouterr()
    assert run() == ids  # each block runs again whole, in its order, though its A and B were done
    assert capsys.readouterr().out.count("runs again with its block") == 4
    assert run() == []  # every block done: nothing runs
    (out / "jobs" / ids[5] / "job.json").unlink()  # seed 1's B incomplete: its whole block, and only it, runs
    assert run() == ids[3:]


def test_an_all_ok_block_that_did_not_run_back_to_back_runs_again_whole(tmp_path):
    jobs = expand_grid(_grid(timelyfreeze=[0.5], random={"matched": "timelyfreeze", "bracket": True}))
    ids = [j.job_id for j in jobs if j.method != "none"]  # seed 0's block, then seed 1's
    assert len(ids) == 6
    for k, job in enumerate(j for j in jobs if j.method != "none"):
        minute = k + (2 if k == 5 else 0)  # each job runs a minute; seed 1's B starts 120 s after its R ended
        d = tmp_path / "jobs" / job.job_id
        summary_path(d).parent.mkdir(parents=True)
        summary_path(d).write_text("{}")
        times = {"start_time": f"2030-01-01T10:{minute:02d}:00", "end_time": f"2030-01-01T10:{minute + 1:02d}:00"}
        write_json(d / "job.json", {"spec": job_spec(job, None), "status": "ok", **times})
    plan = {job.job_id: (skip, why) for job, _, skip, why in resume_plan(jobs, tmp_path, None, None)}
    assert [plan[i] for i in ids[:3]] == [(True, "done")] * 3  # back to back: skipped
    assert [plan[i] for i in ids[3:]] == [(False, "runs again with its block: its jobs did not run back to back")] * 3
    assert back_to_back([("2030-01-01T10:00:00+00:00", "2030-01-01T10:01:00+00:00")] * 2) == (False, -60.0)
    assert back_to_back([("2030-01-01T10:00:00", None)]) == (None, None)


def test_matched_command_reads_the_sibling_dump(tmp_path):
    job = next(j for j in expand_grid(_grid(timelyfreeze=[0.6], random={"matched": "timelyfreeze"})) if j.matched_to)
    dump = tmp_path / "jobs" / job.job_id / "dump"
    cmd = build_command(job, CONFIG, dump_folder=dump)
    i = cmd.index("--freeze.random.matched")
    assert cmd[i + 1] == str(tmp_path / "jobs" / job.matched_to / "dump") == str(matched_dump(job, dump))
    assert "--freeze.random.ratio" not in cmd


def test_knob_of_a_matched_random_run():
    f = Freeze(method="random")
    f.random.matched = "somewhere"
    assert knob_of(f) == {"name": "ratio", "value": "matched"}
    f.random.matched, f.random.ratio_per_stage = "", [0.5, 0.7]
    assert knob_of(f) == {"name": "ratio", "value": "per_stage"}


def test_matched_rows_are_cells_of_their_own():
    a = {"knob_value": "matched", "matched_to": "1F1B__timelyfreeze__r_max=0.6__seed=2"}
    b = {"knob_value": "matched", "matched_to": "1F1B__timelyfreeze__r_max=0.8__seed=2"}
    assert cell_knob(a) == "matched(timelyfreeze r_max=0.6)" != cell_knob(b)
    assert cell_knob({"knob_value": 0.5}) == 0.5
    assert sorted([None, "matched", 0.8, 0.6], key=knob_sort_key) == [0.6, 0.8, None, "matched"]


def _fake_pair(out, src, seed):
    """A committed TimelyFreeze job copied twice: as itself and as the random job matched to it."""
    import json
    import shutil

    tf_id = f"1F1B__timelyfreeze__r_max=0.8__seed={seed}"
    rnd_id = f"1F1B__random__ratio=matched-timelyfreeze-r_max0.8__seed={seed}"
    for job_id in (tf_id, rnd_id):
        shutil.copytree(src / tf_id, out / "jobs" / job_id)
    rec = json.loads((out / "jobs" / rnd_id / "job.json").read_text())
    rec["spec"] = {
        **rec["spec"],
        "method": "random",
        "knob": {"name": "ratio", "value": "matched"},
        "matched_to": tf_id,
    }
    (out / "jobs" / rnd_id / "job.json").write_text(json.dumps(rec))
    summ = out / "jobs" / rnd_id / "dump" / "timelyfreeze" / "summary.json"
    s = json.loads(summ.read_text())
    s.update(method="random", knob={"name": "ratio", "value": "matched"})
    summ.write_text(json.dumps(s))


def test_placement_report_on_committed_jobs(tmp_path):
    from pathlib import Path

    from timelyfreeze.experiments.studies.placement import build_placement_report

    src = Path("docs/results/comparison/jobs")
    for seed in (0, 1):
        _fake_pair(tmp_path, src, seed)
    md = build_placement_report(tmp_path).read_text()
    import csv

    with open(tmp_path / "report" / "placement_pairs.csv") as f:
        pairs = list(csv.DictReader(f))
    assert len(pairs) == 2
    for p in pairs:  # a run paired with itself: no difference, the same shares, a finite prediction
        assert float(p["d_speedup"]) == 0.0 == float(p["d_speedup_f"]) and float(p["share_gap"]) == 0.0
        assert float(p["predicted_d_speedup"]) >= -1e-9
    with open(tmp_path / "report" / "placement_cells.csv") as f:
        cells = {c["r_max"]: c for c in csv.DictReader(f)}
    assert cells["all"]["pairs"] == "2" and cells["0.8"]["pairs"] == "2"
    assert "1F1B (2 pairs): in-run speed-up, TimelyFreeze minus matched random +0.000" in md
    assert "all schedules (2 pairs)" in md
    assert (tmp_path / "report" / "placement.png").is_file()
