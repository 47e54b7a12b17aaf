"""Which training data loader a ``[training] dataset`` name gets: TorchTitan's ``TrainSpec.build_dataloader_fn``
of this project. The instruction data (``instruct``: ``timelyfreeze.data.instruct_data``), a fixed set of
sequences seen for several epochs (``pystdlib_<split>_fixed<N>``: ``timelyfreeze.data.epoch_data``), else
TorchTitan's own text data."""

from __future__ import annotations

from dataclasses import asdict

from timelyfreeze.data import epoch_data, instruct_data


def build_dataloader(dp_world_size: int, dp_rank: int, tokenizer, job_config, infinite: bool = True):
    """``TrainSpec.build_dataloader_fn``: the fixed sequences for a ``pystdlib_<split>_fixed<N>`` name, the
    instruction data for ``instruct`` (``timelyfreeze.data.instruct_data``), else TorchTitan's
    ``build_text_dataloader``."""
    # deferred: TorchTitan is imported after the CPU shims (timelyfreeze.train)
    from torchtitan.components.dataloader import ParallelAwareDataloader
    from torchtitan.hf_datasets.text_datasets import build_text_dataloader

    tcfg = job_config.training
    if instruct_data.is_instruct(tcfg.dataset):
        return instruct_data.build_dataloader(
            tcfg.dataset, job_config, tokenizer, tcfg, dp_rank, dp_world_size, infinite=infinite
        )
    if epoch_data.parse_fixed(tcfg.dataset) is None:
        return build_text_dataloader(dp_world_size, dp_rank, tokenizer, job_config, infinite=infinite)
    ds = epoch_data.build_fixed_dataset(tcfg.dataset, tokenizer, tcfg.seq_len, dp_rank, dp_world_size)
    ds.infinite = infinite
    kwargs = {**asdict(tcfg.dataloader), "batch_size": tcfg.local_batch_size}
    return ParallelAwareDataloader(ds, dp_rank=dp_rank, dp_world_size=dp_world_size, **kwargs)
