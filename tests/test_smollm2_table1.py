"""The SmolLM2 Table 1 page (docs/results/smollm2-table1/): its committed pilot figures are what the committed
run wrote, and the setting its protocol names is the committed config."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "results" / "smollm2-table1"
TTA = ROOT / "docs" / "results" / "smollm2-tta"
CONFIG = ROOT / "torchtitan_configs" / "smollm2_135m_instruct_cpu.toml"


@pytest.mark.parametrize("job", ["pretrained_seq256", "pretrained"])
def test_the_pretrained_score_on_the_page_is_what_the_committed_pilot_job_wrote(job):
    out = PAGE / "pilot" / job / "timelyfreeze"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in rows if "val_acc" in r][-1]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["method"] == "none"
    row = f"| {val['val_acc']:.3f} | {val['val_acc_norm']:.3f} | {val['val_acc_chance']:.3f} | {val['val_loss']:.3f} |"
    assert row in (PAGE / "README.md").read_text()
    assert val["val_questions"] == 200


def test_the_protocols_setting_is_the_committed_config():
    cfg = tomllib.loads(CONFIG.read_text())
    assert cfg["model"]["flavor"] == "smollm2_135m" and cfg["training"]["dataset"] == "instruct"
    assert cfg["instruct"] == {"questions": 200, "choices": 4, "distractors": "same_source", "seed": 0}
    assert cfg["freeze"]["replan"] is False and cfg["training"]["steps"] == 24
    assert cfg["training"]["seq_len"] == cfg["validation"]["seq_len"] == 128  # amendment 1


def test_the_pilot_table_is_what_the_committed_pilot_jobs_give():
    """pilot.md, recomputed from the pilot's dumps and pilot.log; every pilot row on the page is in it."""
    from timelyfreeze.experiments.studies.smollm2_table1 import pilot_md

    text = (PAGE / "pilot" / "pilot.md").read_text()
    assert pilot_md(PAGE / "pilot") == text
    page = (PAGE / "README.md").read_text()
    for job, name in (("1F1B_none", "1F1B, none"), ("ZBVZeroBubble_timelyfreeze", "ZBVZeroBubble, TimelyFreeze 0.8")):
        row = next(line for line in text.splitlines() if line.startswith(f"| {job} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        # the page's row: the job's name, then its step, wall-clock, T_fixed, accuracy, acc_norm, loss, McNemar
        assert f"| {name} | {' | '.join(cells[2:])} |" in page


def test_the_grids_run_the_sized_steps_on_the_protocols_config():
    from timelyfreeze.experiments.sweep.grid import expand_grid, load_grid_file

    for grid, jobs in (("smollm2_table1_grid.toml", 42), ("smollm2_rmax_grid.toml", 36)):
        g = load_grid_file(ROOT / "scripts" / grid)
        assert Path(g["config"]) == CONFIG and len(expand_grid(g)) == jobs
        assert g["overrides"]["training.steps"] == 24 and g["schedules"] == ["1F1B", "ZBVZeroBubble"]
        assert g["overrides"]["optimizer.lr"] == 3e-4  # amendment 2


def test_the_time_to_accuracy_grid_is_its_protocols():
    """docs/results/smollm2-tta/README.md: Study 1's setting, 3 arms x 2 schedules x 3 seeds, every freezing job
    extended to at most 48 steps, the held-out loss every 2 steps and the accuracy only where a job ends."""
    from timelyfreeze.experiments.sweep.grid import expand_grid, load_grid_file

    g = load_grid_file(ROOT / "scripts" / "smollm2_tta_grid.toml")
    jobs = expand_grid(g)
    assert Path(g["config"]) == CONFIG and len(jobs) == 18 and g["seeds"] == [0, 1, 2]
    assert {j.method for j in jobs} == {"none", "timelyfreeze", "random"}
    assert all((j.extend is None) == (j.method == "none") for j in jobs) and g["extend_to_target"] == 2.0
    over = g["overrides"]
    assert over["training.steps"] == 24 and over["optimizer.lr"] == 3e-4 and over["validation.freq"] == 2
    assert over["instruct.accuracy_freq"] > 2 * over["training.steps"]
    assert (ROOT / "docs" / "results" / "smollm2-tta" / "README.md").is_file()


def test_the_study1_table_so_far_is_what_its_committed_jobs_give():
    """The partial Table 1 (study1/report/smollm2.md) recomputed from the committed jobs."""
    from timelyfreeze.experiments.studies.smollm2_table1 import cells, job_rows, md

    study = PAGE / "study1"
    assert md(cells(job_rows(study))) in (study / "report" / "smollm2.md").read_text()


def test_where_each_study1_jobs_time_went_is_what_its_committed_traces_give():
    """study1/report/actions.md (per job, rank and action kind) recomputed from the committed traces."""
    from timelyfreeze.experiments.studies.smollm2_table1 import action_rows, actions_md

    assert actions_md(action_rows(PAGE / "study1")) in (PAGE / "study1" / "report" / "actions.md").read_text()


def test_the_zbv_weight_gradient_check_is_what_its_committed_jobs_give():
    """dev-zbv-weight-grad/results.md recomputed from the check's committed dumps: its four jobs, in order."""
    from timelyfreeze.experiments.studies.zbv_w_check import COLUMNS, rows
    from timelyfreeze.experiments.sweep.report import md_table

    folder = PAGE / "dev-zbv-weight-grad"
    got = rows(folder)
    assert [r["job"] for r in got] == ["1_none", "2_none_mmap32m", "3_autofreeze", "4_none"]
    assert md_table(got, COLUMNS) in (folder / "results.md").read_text()


def test_every_readme_figure_of_the_real_model_is_in_its_file():
    from tests.figures_util import linked_figures

    readme = (ROOT / "README.md").read_text()
    for target, path in (
        (r"smollm2-table1/pilot/pilot\.md", PAGE / "pilot" / "pilot.md"),
        (r"smollm2-table1/study1/report/smollm2\.md", PAGE / "study1" / "report" / "smollm2.md"),
        (r"smollm2-table1/study2/report/smollm2\.md", PAGE / "study2" / "report" / "smollm2.md"),
        (r"smollm2-tta/study3/report/report\.md", TTA / "study3" / "report" / "report.md"),
        (r"smollm2-tta/study3/report/smollm2\.md", TTA / "study3" / "report" / "smollm2.md"),
    ):
        quoted = [q for q in linked_figures(readme, target) if q != "so far"]
        text = path.read_text()
        assert quoted and all(q in text for q in quoted), (path, quoted)


def test_the_time_to_accuracy_study_is_what_its_committed_jobs_give():
    """Study 3 (docs/results/smollm2-tta/): its 18 jobs, the per-cell time-to-accuracy table of report.md and the
    SmolLM2 table of smollm2.md recomputed from the committed jobs, and the secondary reading with the machine's
    speed out (amendment 1) that its Results quote from smollm2_cells.csv."""
    import csv

    from timelyfreeze.experiments.stats import cell_stats, fmt_ci
    from timelyfreeze.experiments.studies.smollm2_table1 import cells, job_rows, md
    from timelyfreeze.experiments.sweep.report import md_cells
    from timelyfreeze.experiments.sweep.results import load_rows
    from timelyfreeze.experiments.sweep.tta import tta_rows

    study = TTA / "study3"
    rows = load_rows(study)
    assert len(rows) == 18 and {r["status"] for r in rows} == {"ok"}
    assert md_cells(cell_stats(tta_rows(rows))) in (study / "report" / "report.md").read_text()
    jobs = job_rows(study)
    got = cells(jobs)
    assert md(got) in (study / "report" / "smollm2.md").read_text()
    # the Results' reading that the seed moves only the freezing draws: every no-freezing job the same accuracy and
    # target held-out loss
    assert {r["val_acc"] for r in jobs if r["method"] == "none"} == {0.495}
    assert {round(t["target_loss"], 3) for t in tta_rows(rows) if t["method"] != "none"} == {2.525}
    with open(study / "report" / "smollm2_cells.csv", newline="") as f:
        written = list(csv.DictReader(f))
    results = (TTA / "README.md").read_text()
    for c, w in zip(got, written, strict=True):
        assert (c["schedule"], c["method"]) == (w["schedule"], w["method"])
        fwd = fmt_ci(c["tta_ratio_fwd_mean"], c["tta_ratio_fwd_lo"], c["tta_ratio_fwd_hi"])
        assert fwd == fmt_ci(*(float(w[f"tta_ratio_fwd_{k}"]) for k in ("mean", "lo", "hi")))
        if c["method"] != "none":
            assert fwd in results, (c["schedule"], c["method"], fwd)


def test_the_rmax_sweep_is_what_its_committed_jobs_give():
    """Study 2 (Figure 6): its 36 jobs all ok, study2/report/smollm2.md's table recomputed from them, and every
    r_max point Figure 6 draws (κ - 1 against Δ accuracy, with their intervals) the cell that smollm2_cells.csv
    holds. Fails until the study's last job is committed and its report written."""
    import csv

    from timelyfreeze.experiments.studies.smollm2_table1 import cells, job_rows, md
    from timelyfreeze.experiments.sweep.results import load_rows

    study = PAGE / "study2"
    rows = load_rows(study)
    assert len(rows) == 36 and {r["status"] for r in rows} == {"ok"}
    got = cells(job_rows(study))
    assert md(got) in (study / "report" / "smollm2.md").read_text()
    assert (study / "report" / "figure6.png").is_file()
    with open(study / "report" / "smollm2_cells.csv", newline="") as f:
        written = list(csv.DictReader(f))
    assert len(written) == len(got) == 12  # per schedule: no freezing and r_max 0.2, 0.4, 0.6, 0.8, 1.0
    for c, w in zip(got, written, strict=True):
        assert (c["schedule"], c["method"], c["seeds"]) == (w["schedule"], w["method"], int(w["seeds"])) and c[
            "seeds"
        ] == 3
        if c["method"] == "timelyfreeze":
            for q in ("kappa", "dacc"):
                for s in ("mean", "lo", "hi"):
                    assert c[f"{q}_{s}"] == pytest.approx(float(w[f"{q}_{s}"]), rel=1e-12, abs=1e-15)
