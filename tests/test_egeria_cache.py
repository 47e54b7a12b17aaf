"""Egeria's activation cache (methods/egeria_cache.py) and the fixed multi-epoch dataset that keys it
(epoch_data.py): ids across epochs and resume, the LRU bound and invalidation, a cached first stage of
TorchTitan's llama3 decoder giving bit-identical outputs and gradients, and Egeria's side (anchor, boundary,
report)."""

import copy

import pytest
import torch
from test_methods_common import make_cfg, make_ctx, make_stages
from torchtitan.models.llama3.model.args import TransformerModelArgs
from torchtitan.models.llama3.model.model import Transformer

from timelyfreeze.data import epoch_data
from timelyfreeze.job.stage_view import StageView
from timelyfreeze.methods.egeria import cache as egeria_cache
from timelyfreeze.methods.egeria.cache import PrefixCache
from timelyfreeze.methods.egeria.method import Egeria, EgeriaConfig


def test_parse_fixed_names():
    assert epoch_data.parse_fixed("pystdlib_finetune_fixed192") == ("finetune", 192, None)
    assert epoch_data.parse_fixed("pystdlib_val_fixed8_seed3") == ("val", 8, 3)
    assert epoch_data.parse_fixed("pystdlib_finetune") is None
    assert epoch_data.parse_fixed("pystdlib_nosuch_fixed8") is None
    assert epoch_data.parse_fixed("pystdlib_finetune_fixed0") is None


def test_fixed_sequences_pack_like_titan_and_refuse_too_few_tokens():
    seqs = epoch_data.fixed_sequences(["ab", "cde", "f"], lambda t: [0, *map(ord, t), 1], num=2, seq_len=3)
    assert seqs.tolist() == [[0, 97, 98, 1], [0, 99, 100, 101]]
    with pytest.raises(ValueError, match="fewer than"):
        epoch_data.fixed_sequences(["ab"], lambda t: list(map(ord, t)), num=2, seq_len=3)


def _ids(it, n):
    return [int(next(it)[0][epoch_data.SAMPLE_ID]) for _ in range(n)]


def test_ids_recur_every_epoch_resume_and_split_over_data_parallel_ranks():
    seqs = torch.arange(5 * 4).view(5, 4)
    ds = epoch_data.FixedSequenceDataset(seqs)
    it = iter(ds)
    first, label = next(it)
    assert first["input"].tolist() == [0, 1, 2] and label.tolist() == [1, 2, 3]
    assert [int(first[epoch_data.SAMPLE_ID])] + _ids(it, 11) == [0, 1, 2, 3, 4] * 2 + [0, 1]
    state = ds.state_dict()
    assert state == {"epoch": 2, "index": 2}
    again = epoch_data.FixedSequenceDataset(seqs)
    again.load_state_dict(state)
    assert _ids(iter(again), 4) == _ids(it, 4) == [2, 3, 4, 0]
    assert _ids(iter(epoch_data.FixedSequenceDataset(seqs, dp_rank=1, dp_world_size=2)), 4) == [1, 3, 1, 3]
    once = epoch_data.FixedSequenceDataset(seqs, infinite=False)
    assert len(list(once)) == 5


def test_seeded_order_is_a_fresh_permutation_every_epoch_and_resumes():
    seqs = torch.arange(8 * 3).view(8, 3)
    ds = epoch_data.FixedSequenceDataset(seqs, seed=1)
    it = iter(ds)
    e0, e1 = _ids(it, 8), _ids(it, 8)
    assert sorted(e0) == sorted(e1) == list(range(8)) and e0 != e1 and e0 != list(range(8))
    assert e0 == _ids(iter(epoch_data.FixedSequenceDataset(seqs, seed=1)), 8)
    _ids(it, 3)  # part of an epoch, then resume
    again = epoch_data.FixedSequenceDataset(seqs, seed=1)
    again.load_state_dict(ds.state_dict())
    assert _ids(iter(again), 5) == _ids(it, 5)


def test_titans_dataloader_checkpoint_carries_the_position():
    from torchtitan.components.dataloader import ParallelAwareDataloader

    seqs = torch.arange(6 * 3).view(6, 3)

    def loader():
        return ParallelAwareDataloader(
            epoch_data.FixedSequenceDataset(seqs, seed=2), dp_rank=0, dp_world_size=1, batch_size=2
        )

    a = loader()
    it = iter(a)
    for _ in range(4):  # an epoch and a third
        next(it)
    state = a.state_dict()
    b = loader()
    b.load_state_dict(state)
    want = [next(it)[0][epoch_data.SAMPLE_ID].tolist() for _ in range(3)]
    ib = iter(b)
    assert [next(ib)[0][epoch_data.SAMPLE_ID].tolist() for _ in range(3)] == want


def test_lru_bound_eviction_and_invalidation():
    c = PrefixCache(limit_mb=3 * 4 / 2**20)  # room for three 1-float entries
    c.set_boundary(2, 0)
    for i in range(4):
        c.put((i,), torch.zeros(1))
    assert list(c.entries) == [(1,), (2,), (3,)] and c.evictions == 1 and c.bytes == 12
    assert c.get((1,)) is not None  # now most recent
    c.put((4,), torch.zeros(1))
    assert list(c.entries) == [(3,), (1,), (4,)]
    c.put((9,), torch.zeros(4))  # larger than the bound: not kept
    assert (9,) not in c.entries
    c.set_boundary(2, 0)  # same boundary: kept
    assert len(c.entries) == 3
    c.set_boundary(3, 0)  # deeper: dropped
    assert not c.entries and c.bytes == 0 and c.invalidations == 1
    c.put((1,), torch.zeros(1))
    c.set_boundary(3, 1)  # an unfreeze and refreeze (new generation): dropped
    assert not c.entries and c.invalidations == 2


def _first_stage(n_layers=3, keep=2, seed=0):
    torch.manual_seed(seed)
    args = TransformerModelArgs(dim=32, n_layers=n_layers, n_heads=4, vocab_size=64, max_seq_len=16, multiple_of=16)
    m = Transformer(args)
    with torch.no_grad():
        m.init_weights()
    for k in list(m.layers):
        if int(k) >= keep:
            del m.layers[k]
    m.norm = None
    m.output = None
    return m


def _view(m) -> StageView:
    params = dict(m.named_parameters())
    layer_of = {n: 0 if n.startswith("tok_") else int(n.split(".")[1]) + 1 for n in params}
    return StageView(0, m, params, layer_of, {}, is_first=True, is_last=False)


def _run(m, cache, boundary, steps=3):
    """Train the stage with the layers < boundary frozen on two alternating samples; losses and final grads."""
    view = _view(m)
    for n, p in view.params.items():
        p.requires_grad_(view.layer_of[n] >= boundary)
    trainable = [p for p in m.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-2)
    data = {7: torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(1)), 9: torch.arange(16)[None]}
    out = []
    for _ in range(steps):
        for sid, tokens in data.items():
            opt.zero_grad()
            if cache is not None:
                cache.set_boundary(boundary, 0)
                h = m(tokens, sample_id=torch.tensor([sid]))
            else:
                h = m(tokens)
            loss = (h.float() ** 2).mean()
            loss.backward()
            opt.step()
            out.append((loss.detach().clone(), [p.grad.clone() if p.grad is not None else None for p in trainable]))
    return out


@pytest.mark.parametrize("boundary", [2, 3])  # inside the stage / the whole stage (then no backward at all)
def test_cached_first_stage_is_bit_exact_and_skips_the_prefix(boundary):
    plain = _first_stage()
    cached = copy.deepcopy(plain)
    cache = PrefixCache(64)
    egeria_cache.attach(cached, cache)
    assert epoch_data.takes_sample_id(cached) and not epoch_data.takes_sample_id(plain)
    if boundary == 3:  # the whole stage frozen: a hit is a look-up, and the output needs no gradient
        for p in [*plain.parameters(), *cached.parameters()]:
            p.requires_grad_(False)
        t = torch.arange(16)[None]
        assert torch.equal(cached(t, sample_id=torch.tensor([5])), plain(t))  # idle: boundary 0
        assert cache.hits == cache.misses == 0
        cache.set_boundary(boundary, 0)
        a, b = (cached(t, sample_id=torch.tensor([5])) for _ in range(2))
        assert torch.equal(a, plain(t)) and torch.equal(b, a) and not b.requires_grad
        assert (cache.hits, cache.misses) == (1, 1)
        return
    want = _run(plain, None, boundary)
    got = _run(cached, cache, boundary)
    for (lw, gw), (lg, gg) in zip(want, got):
        assert torch.equal(lw, lg)
        assert all(torch.equal(a, b) for a, b in zip(gw, gg))
    assert (cache.hits, cache.misses) == (4, 2)
    assert cache.saved_s >= 0.0 and cache.mb > 0
    with torch.no_grad():  # validation: the class's own forward, no look-up
        cached(torch.arange(16)[None], sample_id=torch.tensor([9]))
    assert cache.hits == 4
    egeria_cache.detach(cached)
    assert type(cached) is Transformer


def test_a_call_with_a_trainable_prefix_runs_in_full_and_neither_keeps_nor_serves():
    m = _first_stage()
    cache = PrefixCache(64)
    egeria_cache.attach(m, cache)
    cache.set_boundary(2, 0)  # but nothing frozen (as in TorchTitan's shape inference): the prefix needs grad
    out = m(torch.arange(16)[None], sample_id=torch.tensor([1]))
    assert out.requires_grad and cache.bypassed == 1 and not cache.entries and cache.misses == 0


def test_egeria_freezes_the_anchor_with_its_prefix_and_sets_the_cache_boundary():
    stages = make_stages(4, splits=(2,))  # stage 0: embedding (layer 0, the anchor), blocks 0-1 (layers 1-2)
    m = Egeria(make_cfg(egeria=EgeriaConfig(eval_every=1)), make_ctx(stages[:1], num_stages=2))
    assert m.cache is None and "no 'tok_embeddings'" in m.cache_off  # the tiny stage is not TorchTitan's decoder
    assert m.summary()["cache"] is False
    m.ctrl.cur = 2
    assert "tok.weight" in m.frozen_tensors(5, 0, 0)
    m.cache = PrefixCache(8)
    m.cache.stage_layers = 3
    m.begin_step(5)
    assert m.cache.boundary == 2
    m.ctrl.cur = 5  # the boundary on the next stage: the whole first stage is cached
    m.begin_step(6)
    assert m.cache.boundary == 3
    m.cache.hits, m.cache.misses = 3, 1
    assert m.step_metrics() == {"cache_hits": 3, "cache_misses": 1, "forward_ms_saved": 0.0, "cache_mb": 0.0}
    assert m.step_metrics()["cache_hits"] == 0
    s = m.summary()
    assert s["cache_hits"] == 3 and s["cache_misses"] == 1 and "forward_ms_saved" in s
    state = m.state_dict()
    m2 = Egeria(make_cfg(egeria=EgeriaConfig(eval_every=1)), make_ctx(stages[:1], num_stages=2))
    m2.cache = PrefixCache(8)
    m2.load_state_dict(state)
    assert m2.cache.hits == 3 and not m2.cache.entries  # counters kept, entries rebuilt
    m.close()
    m2.close()


def test_cache_off_by_config_and_off_where_the_first_stage_is_elsewhere():
    stages = make_stages(4, splits=(2,))
    off = Egeria(make_cfg(egeria=EgeriaConfig(cache=False)), make_ctx(stages[:1], num_stages=2))
    assert off.cache is None and "cache = false" in off.cache_off
    other = Egeria(make_cfg(egeria=EgeriaConfig()), make_ctx(stages[1:], num_stages=2))
    assert other.cache is None and "another rank" in other.cache_off
    assert other.step_metrics() == {}
    off.close()
    other.close()
