"""Every validation reads the same held-out batches: the trainer rewinds TorchTitan's text dataset with
its own checkpoint API (``state_dict``/``load_state_dict``). This guards that API: if TorchTitan changes
it, this test fails loudly instead of validations silently scoring different slices."""

from __future__ import annotations

import copy
import itertools

import torch

from timelyfreeze.data import corpus


def test_the_dataset_rewinds_to_the_same_batches():
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataset

    corpus.register_datasets()
    tok = HuggingFaceTokenizer(str(corpus.ensure_tokenizer()))
    ds = HuggingFaceTextDataset("pystdlib_val", None, tok, seq_len=64, infinite=False)
    start = copy.deepcopy(ds.state_dict())
    first = [x["input"] for x, _ in itertools.islice(iter(ds), 5)]
    second = [x["input"] for x, _ in itertools.islice(iter(ds), 5)]
    assert any(not torch.equal(a, b) for a, b in zip(first, second))  # without a rewind: the next slice
    ds.load_state_dict(copy.deepcopy(start))
    again = [x["input"] for x, _ in itertools.islice(iter(ds), 5)]
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_val_heads_span_many_files():
    """``pystdlib_val_heads``: the first lines of each held-out file, so a few validation batches score many files."""
    from torchtitan.hf_datasets import text_datasets

    assert corpus.head_of("a\nbb\nccc\n", 5) == "a\nbb\n" and corpus.head_of("short", 100) == "short"
    assert corpus.head_of("x" * 10, 4) == "xxxx"  # no line end within: a plain cut
    corpus.register_datasets()
    cfg = text_datasets.DATASETS["pystdlib_val_heads"]
    heads = cfg.loader(cfg.path)["text"]
    texts = corpus.read_texts("val")
    assert len(heads) == len(texts) and all(
        t.startswith(h) and len(h) <= corpus.HEAD_CHARS for h, t in zip(heads, texts)
    )


def test_trainer_gets_its_validator_and_metrics_processor_from_torchtitans_train_spec():
    """The trainer extends TorchTitan through its ``TrainSpec`` builders, not by patching instances: the llama3
    spec, once registered for freezing, builds the fixed-batch validator and the listening metrics processor
    (idempotently: a second trainer in the same process registers nothing new)."""
    from torchtitan.components.validate import Validator
    from torchtitan.protocols.train_spec import get_train_spec

    from timelyfreeze.titan import spec as titan_spec

    titan_spec.use_freeze_spec("llama3")
    titan_spec.use_freeze_spec("llama3")
    spec = get_train_spec("llama3")
    assert spec.build_validator_fn is titan_spec.build_validator
    assert spec.build_metrics_processor_fn is titan_spec.build_metrics_processor
    assert issubclass(titan_spec.FixedBatchValidator, Validator)
