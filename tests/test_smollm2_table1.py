"""The SmolLM2 Table 1 page (docs/results/smollm2-table1/): its committed pilot figures are what the committed
run wrote, and the setting its protocol names is the committed config."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "results" / "smollm2-table1"
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
