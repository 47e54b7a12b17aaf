"""Egeria's activation cache is exact: on the multi-epoch config (PP=2, 1F1B, a 16-sample set, two steps an
epoch) two runs with the same scripted Egeria decisions, one with the cache and one without, report the same
training and validation losses bit for bit, while the cache run serves most first-stage forwards from the
cache. The script freezes the embedding, then deeper, unfreezes everything (a new generation) and freezes past
the first stage (whose forward for a hit is then a look-up and whose backward is empty)."""

from __future__ import annotations

import pytest

from tests.torchrun_util import ROOT, SHORT_SEQUENCES, torchrun

pytestmark = pytest.mark.torchrun

STEPS = 20
ARGS = [
    "--training.steps",
    str(STEPS),
    "--training.dataset",
    "pystdlib_finetune_fixed16",
    "--lr_scheduler.warmup_steps",
    "2",
    "--freeze.warmup_steps",
    "2",
    "--validation.freq",
    "7",
    "--validation.steps",
    "1",
    *SHORT_SEQUENCES,  # the fixed set's samples are cut at the run's seq_len: the same ids, half the compute
]
ENV = {"EGERIA_SCRIPT": "3:1,6:3,11:0,13:5"}


def test_cache_on_and_off_give_the_same_losses_bit_for_bit(tmp_path):
    runs = {}
    for cache in ("true", "false"):
        runs[cache] = torchrun(
            "llama3_debug_egeria_epochs_cpu.toml",
            tmp_path / cache,
            *ARGS,
            "--freeze.egeria.cache" if cache == "true" else "--freeze.egeria.no-cache",
            target=(str(ROOT / "tests" / "egeria_cache_job.py"),),
            env=ENV,
        )
        assert runs[cache].rc == 0, runs[cache].tail()
    on, off = (runs[c].metrics() for c in ("true", "false"))
    assert [(r["step"], r.get("loss"), r.get("val_loss")) for r in on] == [
        (r["step"], r.get("loss"), r.get("val_loss")) for r in off
    ]
    assert sum(1 for r in on if "val_loss" in r) >= 2  # steps 1, 7, 14
    s = runs["true"].summary()["method_summary"]
    assert s["cache"] is True and s["cache_hits"] > 0 and s["cache_invalidations"] >= 2, s
    # steps 4-6 freeze the embedding, 7-11 layers 0-2, 14-20 the whole first stage; a step's 8 microbatches
    # are the 8 samples of one half-epoch, each seen first as a miss
    assert s["cache_misses"] == 2 * 8 * 3 and s["cache_hits"] == (1 + 3 + 5) * 8, s
    assert s["forward_ms_saved"] > 0
    hits = [r["cache_hits"] for r in on if "cache_hits" in r]
    assert sum(hits) == s["cache_hits"]
    assert runs["false"].summary()["method_summary"]["cache"] is False
