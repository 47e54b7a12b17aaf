"""A small fixed training set seen for several epochs, every sample with a stable id (Egeria's activation cache).

Dataset names ``pystdlib_<split>_fixed<N>[_seed<k>]`` (``[training] dataset``, e.g. ``pystdlib_finetune_fixed192``): the
first ``N`` sequences of ``seq_len + 1`` tokens of the embedded corpus split (``timelyfreeze.data.corpus``), packed the
way TorchTitan's text dataset packs them (every file in the split's order, with BOS and EOS, cut into consecutive
sequences). Sequence ``i`` is sample ``i``. Every epoch yields the same sequences, each as
``({"input": x[:-1], "sample_id": i}, x[1:])``: in index order, or with ``_seed<k>`` in a fresh order every
epoch (a permutation drawn from ``(k, epoch)``). With ``W`` data-parallel ranks, rank ``r`` takes the ids
``i = r (mod W)``.

Why not TorchTitan's text dataset re-looped: it carries the token buffer over the end of an epoch, so the
sequences of the second epoch are shifted against the first and no sample ever comes back.

The id travels as TorchTitan's ``extra_inputs``: every key of the input dict but ``"input"`` goes to the first
pipeline stage's forward only, split into microbatches along the batch dimension like the tokens. The trainer
drops the key unless that module takes it (``TimelyFreezeTrainer.post_dataloading_process``).

The dataset is ``Stateful``: its position (epoch, next index) is in TorchTitan's dataloader checkpoint, so a
resumed run yields the same ids as an uninterrupted one.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset

from timelyfreeze.data import corpus

SAMPLE_ID = "sample_id"
"""The input-dict key of the sample id (a 0-d int64 tensor per sample, ``(batch,)`` per batch)."""
_NAME = re.compile(rf"^{corpus.ASSETS_MARKER}_([a-z_]+?)_fixed(\d+)(?:_seed(\d+))?$")


def takes_sample_id(module: torch.nn.Module) -> bool:
    """True where ``module``'s forward takes the ``sample_id`` keyword (a stage with Egeria's activation cache)."""
    return bool(getattr(type(module), "takes_sample_id", False))


def without_unused_sample_id(extra_inputs: dict, model_parts) -> dict:
    """``extra_inputs`` less the sample id unless every local stage's module takes it (Egeria's cache)."""
    if SAMPLE_ID in extra_inputs and not all(map(takes_sample_id, model_parts)):
        return {k: v for k, v in extra_inputs.items() if k != SAMPLE_ID}
    return extra_inputs


def parse_fixed(name: str) -> tuple[str, int, int | None] | None:
    """``(split, N, seed or None)`` of a dataset name ``pystdlib_<split>_fixed<N>[_seed<k>]``, else None."""
    m = _NAME.match(name.lower())
    if m is None or m.group(1) not in corpus.SPLITS or int(m.group(2)) < 1:
        return None
    return m.group(1), int(m.group(2)), None if m.group(3) is None else int(m.group(3))


def fixed_sequences(texts, encode, num: int, seq_len: int) -> torch.Tensor:
    """The first ``num`` sequences of ``seq_len + 1`` tokens packed from ``texts`` (``encode(text)`` -> token
    ids, BOS/EOS included), as a ``(num, seq_len + 1)`` int64 tensor. Stops reading texts once enough tokens."""
    want = num * (seq_len + 1)
    tokens: list[int] = []
    for text in texts:
        tokens.extend(encode(text))
        if len(tokens) >= want:
            break
    if len(tokens) < want:
        raise ValueError(
            f"the split has {len(tokens)} tokens, fewer than {num} sequences of {seq_len + 1} ({want} tokens)"
        )
    return torch.tensor(tokens[:want], dtype=torch.int64).view(num, seq_len + 1)


class FixedSequenceDataset(IterableDataset, Stateful):
    """The fixed sequences (module docstring), repeated for ever (or once: ``infinite=False``). With ``labels``
    (``(num, seq_len)``, e.g. instruction data whose prompt tokens carry the ignore index) sample ``i``'s labels
    are ``labels[i]`` instead of ``sequences[i, 1:]``."""

    def __init__(
        self,
        sequences: torch.Tensor,
        dp_rank: int = 0,
        dp_world_size: int = 1,
        infinite: bool = True,
        seed: int | None = None,
        labels: torch.Tensor | None = None,
    ):
        self.sequences = sequences
        self.labels = labels
        self.seed = seed
        self.ids = list(range(dp_rank, sequences.shape[0], dp_world_size))
        if not self.ids:
            raise ValueError(f"{sequences.shape[0]} sequences leave none to data-parallel rank {dp_rank}")
        self.infinite = infinite
        self.epoch = 0
        self.index = 0
        """Position of the next sample in ``ids`` (the checkpointed state, with ``epoch``)."""

    def order(self, epoch: int) -> list[int]:
        """The ids in the order epoch ``epoch`` yields them."""
        if self.seed is None:
            return self.ids
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return [self.ids[j] for j in torch.randperm(len(self.ids), generator=g).tolist()]

    def __iter__(self):
        while True:
            order = self.order(self.epoch)
            while self.index < len(order):
                i = order[self.index]
                self.index += 1
                x = self.sequences[i]
                y = x[1:] if self.labels is None else self.labels[i]
                yield {"input": x[:-1].clone(), SAMPLE_ID: torch.tensor(i, dtype=torch.int64)}, y.clone()
            if not self.infinite:
                return
            self.epoch += 1
            self.index = 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epoch = int(state_dict["epoch"])
        self.index = int(state_dict["index"])

    @property
    def samples_per_epoch(self) -> int:
        return len(self.ids)


def build_fixed_dataset(name: str, tokenizer, seq_len: int, dp_rank: int = 0, dp_world_size: int = 1):
    """The ``FixedSequenceDataset`` of a ``pystdlib_<split>_fixed<N>`` name (``ValueError`` for another name)."""
    parsed = parse_fixed(name)
    if parsed is None:
        raise ValueError(f"{name!r} is not a pystdlib_<split>_fixed<N> dataset")
    split, num, seed = parsed
    seqs = fixed_sequences(
        corpus.read_texts(split), lambda t: tokenizer.encode(t, add_bos=True, add_eos=True), num, seq_len
    )
    return FixedSequenceDataset(seqs, dp_rank, dp_world_size, seed=seed)
