"""Which pre-trained checkpoint fine-tuning starts from: the committed one when this machine's tokenizer is
the one it was trained with, else one built here (``scripts/pretrain.py``), else none."""

from __future__ import annotations

import sys

import pytest

from timelyfreeze.data import corpus


def _checkpoint(root, step):
    d = root / "checkpoint" / f"step-{step}"
    d.mkdir(parents=True)
    (d / ".metadata").write_bytes(b"m")
    return d


@pytest.fixture
def places(tmp_path, monkeypatch):
    committed = tmp_path / "committed"
    monkeypatch.setattr(corpus, "COMMITTED_PRETRAINED", committed)
    monkeypatch.setenv("TIMELYFREEZE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(corpus, "tokenizer_sha256", lambda: "a" * 64)
    return committed


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the committed checkpoint is for Python 3.11")
def test_the_committed_checkpoint_wins_when_its_tokenizer_matches(places):
    assert (
        corpus.pretrained_checkpoint() is None and "no committed checkpoint" in corpus.committed_pretrained_mismatch()
    )
    _checkpoint(places, 10)
    step = _checkpoint(places, 240)
    (places / "tokenizer.sha256").write_text("a" * 64 + "  tokenizer.json\n")
    assert corpus.committed_pretrained_mismatch() is None and corpus.pretrained_checkpoint() == step

    built = _checkpoint(corpus.pretrained_dir(), 240)
    (corpus.pretrained_dir() / "DONE").write_text("1 s\n")
    assert corpus.pretrained_checkpoint() == step  # committed first
    (places / "tokenizer.sha256").write_text("b" * 64 + "  tokenizer.json\n")
    assert "trained with tokenizer bbbb" in corpus.committed_pretrained_mismatch()
    assert corpus.pretrained_checkpoint() == built  # another tokenizer: the one built here
    (corpus.pretrained_dir() / "DONE").unlink()
    assert corpus.pretrained_checkpoint() is None  # an unfinished build is no checkpoint


def test_the_repository_ships_a_whole_checkpoint():
    root = corpus.COMMITTED_PRETRAINED
    step = corpus.last_checkpoint(root / "checkpoint")
    assert step is not None and (step / ".metadata").is_file() and list(step.glob("*.distcp"))
    sha = (root / "tokenizer.sha256").read_text().split()[0]
    assert len(sha) == 64 and int(sha, 16) >= 0
    assert "step: 240" in (root / "pretrain.log").read_text()


@pytest.mark.torchrun
def test_fine_tuning_starts_from_the_committed_checkpoint(tmp_path):
    """The comparison setting loads the committed weights: TorchTitan says so, and the first validation loss
    is the pre-trained model's (about 5.3; a freshly initialised debug model scores above 7)."""
    from tests.torchrun_util import torchrun

    why_not = corpus.committed_pretrained_mismatch()
    if why_not is not None:
        pytest.skip(f"the committed checkpoint does not apply on this machine: {why_not}")
    run = torchrun(
        "llama3_debug_finetune_cpu.toml",
        tmp_path / "dump",
        "--training.steps",
        "2",
        "--freeze.method",
        "none",
        "--checkpoint.interval",
        "100000",
    )
    assert run.rc == 0, run.tail()
    step = corpus.last_checkpoint(corpus.COMMITTED_PRETRAINED / "checkpoint")
    assert f"Loading the checkpoint from {step}" in run.log
    (first_step, first_loss), *_ = run.summary()["val_curve"]
    assert first_step == 1 and first_loss < 6.0
