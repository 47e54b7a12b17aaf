"""Instruction fine-tuning data as TorchTitan datasets: ``instruct`` (training) and ``instruct_heldout``
(validation).

Each pair (``timelyfreeze.data.instruct_pairs``: the embedded stdlib pairs, or a user's Alpaca file,
``[instruct] data_path`` / ``heldout_path``) is rendered in the chat template (``timelyfreeze.data.chat_template``)
and encoded; samples are packed whole, in order, into sequences of ``seq_len + 1`` tokens, the rest of a sequence
padded (a sample never spans two sequences, so every response sees its own prompt). The labels are the next
tokens where the next token is a response token, else TorchTitan's ignore index (``-100``,
``torchtitan.components.loss.IGNORE_INDEX``): prompt tokens, padding, and the first token of the next sample in
a sequence cost nothing. The training pairs are shuffled once (a fixed seed) before packing; the held-out ones
keep their order.

The sequences are served by ``epoch_data.FixedSequenceDataset`` (every epoch the same sequences, its position in
TorchTitan's dataloader checkpoint), so a resumed run reads exactly the batches an uninterrupted one would.

A sample of a user's file longer than the sequence is a ``FreezeConfigError`` naming the file and the sample
(an embedded pair that long is left out); so is a data file that breaks the Alpaca format
(``timelyfreeze.data.alpaca``).
"""

from __future__ import annotations

import functools
import random
from dataclasses import asdict

import torch

from timelyfreeze.data.alpaca import read_alpaca
from timelyfreeze.data.chat_template import ChatTemplate, encode_sample
from timelyfreeze.data.epoch_data import FixedSequenceDataset
from timelyfreeze.data.instruct_pairs import Pair, stdlib_pairs
from timelyfreeze.job.errors import FreezeConfigError

IGNORE_INDEX = -100
"""TorchTitan's ignore index (``torchtitan.components.loss.IGNORE_INDEX``; a test checks they agree)."""
TRAIN, HELDOUT = "instruct", "instruct_heldout"
DATASETS = {TRAIN: "train", HELDOUT: "heldout"}
"""Dataset name -> split."""
SHUFFLE_SEED = 0


def is_instruct(name: str) -> bool:
    return name.lower() in DATASETS


def template_of(cfg) -> ChatTemplate:
    """The chat template of an ``[instruct]`` section."""
    return ChatTemplate(turn=cfg.turn, system=cfg.system)


def pairs_for(split: str, cfg) -> tuple[list[Pair], str]:
    """``(pairs, what they are, for error lines)`` of ``split`` under the ``[instruct]`` section ``cfg``."""
    path, setting = (cfg.data_path, "data_path") if split == "train" else (cfg.heldout_path, "heldout_path")
    if path:
        return read_alpaca(path, f"[instruct] {setting}"), f"[instruct] {setting} = {path!r}"
    return list(stdlib_pairs(split)), f"the embedded {split} pairs"


def check_files(cfg) -> None:
    """Read the ``[instruct]`` section's data files (an error line for the first bad record) before anything is
    built: every rank fails the same way before any process group exists."""
    for split, path in (("train", cfg.data_path), ("heldout", cfg.heldout_path)):
        if path:
            pairs_for(split, cfg)


def encode_pairs(
    pairs: list[Pair],
    template: ChatTemplate,
    tokenizer,
    seq_len: int,
    what: str,
    section: str = "training",
    drop_long: bool = False,
):
    """``[(token ids, prompt length)]`` of every pair; one longer than ``seq_len + 1`` tokens is left out with
    ``drop_long`` (the embedded pairs), else an error naming ``what`` the pairs are and the ``[section]
    seq_len`` (a user's file: every sample they gave is trained on, or the run does not start)."""
    out = []
    for p in pairs:
        ids, n_prompt = encode_sample(tokenizer, template.prompt(p.user), template.response(p.output))
        if len(ids) > seq_len + 1 and drop_long:
            continue
        if len(ids) > seq_len + 1:
            raise FreezeConfigError(
                f"{what}: the sample from {p.source} is {len(ids)} tokens, longer than the sequence "
                f"([{section}] seq_len = {seq_len}, + 1 for the last label)"
            )
        out.append((ids, n_prompt))
    return out


def pack(samples, seq_len: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens (N, seq_len + 1), labels (N, seq_len))`` of ``samples`` (``[(ids, prompt length)]``, each at
    most ``seq_len + 1`` tokens) packed whole, in order (module docstring)."""
    rows: list[tuple[list[int], list[bool]]] = []
    ids: list[int] = []
    scored: list[bool] = []
    for sample, n_prompt in samples:
        if ids and len(ids) + len(sample) > seq_len + 1:
            rows.append((ids, scored))
            ids, scored = [], []
        ids = ids + list(sample)
        scored = scored + [False] * n_prompt + [True] * (len(sample) - n_prompt)
    if ids:
        rows.append((ids, scored))
    tokens = torch.full((len(rows), seq_len + 1), pad_id, dtype=torch.int64)
    labels = torch.full((len(rows), seq_len), IGNORE_INDEX, dtype=torch.int64)
    for r, (ids, scored) in enumerate(rows):
        row = torch.tensor(ids, dtype=torch.int64)
        tokens[r, : len(ids)] = row
        keep = torch.tensor(scored[1:], dtype=torch.bool)
        labels[r, : len(ids) - 1] = torch.where(keep, row[1:], IGNORE_INDEX)
    return tokens, labels


def pad_id_of(tokenizer) -> int:
    """The id padding uses (never a label): the tokenizer's EOS, else 0."""
    eos = getattr(tokenizer, "eos_id", None)
    return eos if isinstance(eos, int) else 0


def build_dataset(
    name: str, cfg, tokenizer, seq_len: int, dp_rank: int = 0, dp_world_size: int = 1, infinite: bool = True
) -> FixedSequenceDataset:
    """The packed dataset of ``instruct`` / ``instruct_heldout`` under the ``[instruct]`` section ``cfg``."""
    split = DATASETS[name.lower()]
    pairs, what = pairs_for(split, cfg)
    if split == "train":
        pairs = pairs[:]
        random.Random(SHUFFLE_SEED).shuffle(pairs)
    section = "training" if split == "train" else "validation"
    embedded = not (cfg.data_path if split == "train" else cfg.heldout_path)
    samples = encode_pairs(pairs, template_of(cfg), tokenizer, seq_len, what, section, drop_long=embedded)
    tokens, labels = pack(samples, seq_len, pad_id_of(tokenizer))
    return FixedSequenceDataset(tokens, dp_rank, dp_world_size, infinite=infinite, labels=labels)


def build_dataloader(name: str, job_config, tokenizer, section, dp_rank: int, dp_world_size: int, infinite: bool):
    """TorchTitan's ``ParallelAwareDataloader`` over ``build_dataset``; ``section`` is ``[training]`` or
    ``[validation]`` (its ``seq_len``, ``local_batch_size`` and ``dataloader``)."""
    from torchtitan.components.dataloader import ParallelAwareDataloader  # deferred: after the CPU shims

    cfg = job_config.instruct
    cfg.validate("instruct")
    ds = build_dataset(name, cfg, tokenizer, section.seq_len, dp_rank, dp_world_size, infinite)
    kwargs = {**asdict(section.dataloader), "batch_size": section.local_batch_size}
    return ParallelAwareDataloader(ds, dp_rank=dp_rank, dp_world_size=dp_world_size, **kwargs)


@functools.lru_cache(maxsize=4)
def _texts(split: str) -> tuple[str, ...]:
    template = ChatTemplate()
    return tuple(template.prompt(p.user) + template.response(p.output) for p in stdlib_pairs(split))


def register_datasets() -> None:
    """Make ``instruct`` and ``instruct_heldout`` known to TorchTitan's dataset registry (its name check); the
    masked, packed data replaces TorchTitan's text dataset in our builders (``loaders.build_dataloader``,
    ``timelyfreeze.titan.spec.FixedBatchValidator``)."""
    from datasets import Dataset  # deferred: heavy
    from torchtitan.hf_datasets import DatasetConfig, text_datasets

    for name, split in DATASETS.items():
        text_datasets.DATASETS[name] = DatasetConfig(
            path=split,
            loader=lambda s: Dataset.from_dict({"text": list(_texts(s))}),
            sample_processor=lambda s: s["text"],
        )
