"""The placement grid: random jobs matched to TimelyFreeze jobs (grid expansion, command, results rows)."""

import pytest

from timelyfreeze.config import Freeze, knob_of
from timelyfreeze.experiments.command import build_command, matched_dump
from timelyfreeze.experiments.grid import GridError, expand_grid, load_grid_file
from timelyfreeze.experiments.results import cell_knob, knob_sort_key

CONFIG = "torchtitan_configs/llama3_debug_finetune_cpu.toml"


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
    assert len(jobs) == 30 and sum(j.matched_to is not None for j in jobs) == 12


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
