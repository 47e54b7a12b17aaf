"""Egeria's activation cache: a sample that comes back skips the frozen prefix's forward on the first stage.

Once the layers in front of Egeria's boundary are frozen, their output for a given sample no longer changes
(their tensors get no gradient, so the optimizer leaves them alone). ``PrefixCache`` keeps that output, the
activation at the boundary, per microbatch; when the same samples come back in a later epoch the first stage
returns the kept activation instead of running the embedding and the frozen blocks, and runs only the layers
from the boundary on.

- **Where**: only on the first pipeline stage (it holds the embedding, where Egeria starts freezing; the
  sample ids reach it as TorchTitan's ``extra_inputs``, see ``timelyfreeze.data.epoch_data``). The cached prefix is
  the part of the frozen prefix that lies on that stage: with the boundary on a later stage the whole first
  stage is frozen and its forward for a hit is a lookup. Frozen layers of later stages run as before (their
  input comes from another rank; keying them would need the ids sent along the pipeline).
- **Key**: the sample ids of the microbatch's rows, in order (with ``pipeline_parallel_microbatch_size = 1``,
  one sample). A microbatch of other rows is another entry: a row's activation is never reused inside another
  batch shape, so hits are exact by construction.
- **Exactness**: the activation is stored as computed (its own dtype: fp32 in the CPU configs; no cast) on the
  CPU, and a hit returns a copy of it, so the layers after the boundary see the very values the prefix would
  compute: with the cache on and off a run's losses match bit for bit. That needs the prefix truly frozen:
  Egeria freezes the first stage's anchor tensor with its prefix (``FreezeMethod.may_freeze_anchor``).
- **Validity**: entries belong to one (boundary, generation) of Egeria's controller; when the boundary moves
  (deeper, or back to 0 when an LR drop unfreezes everything: a new generation) every entry is dropped.
- **Only frozen calls**: a call in which a tensor of the prefix is trainable runs in full and neither keeps nor
  serves an entry (TorchTitan runs the stage outside the freezing hook to infer shapes after a validation).
- **Bound**: ``cache_mb``; least recently used entries go first; an entry larger than the bound is not kept.
  Everything lives in host memory: no disk spill and no prefetch (a hit is a dictionary look-up and one copy).
- **Resume**: the entries are not checkpointed; a resumed run starts with an empty cache and refills it on its
  misses (the counters are checkpointed, so the summary counts the whole run).
- **Forward time saved**: estimated, per hit, as the mean measured prefix forward time of the misses at the
  same boundary less the hit's own measured look-up time.

The first stage's module gets the cache through a subclass of its own class (the way ``timelyfreeze.hooks.stage_hooks``
extends a pipeline stage): its ``forward`` takes the ``sample_id`` keyword and, for a module with a cache attached
and during training (autograd on), runs TorchTitan's decoder forward (``tok_embeddings``, ``layers``, ``norm``,
``output``) with the prefix replaced by the look-up. Any other call (validation, Egeria's reference copy, which is
built from the same class but has no cache) runs the class's own ``forward``. The other stages of the rank get the
same subclass without a cache: torch's multi-stage schedules (Interleaved1F1B, ZBV, DualPipeV) hand the first
stage's keyword arguments to every stage of the rank.
"""

from __future__ import annotations

import time
import weakref
from collections import OrderedDict
from typing import Any

import torch
from torch import nn

_ATTACHED: weakref.WeakKeyDictionary[nn.Module, PrefixCache] = weakref.WeakKeyDictionary()
_COUNTERS = ("hits", "misses", "unkeyed", "bypassed", "evictions", "invalidations", "saved_s", "peak_bytes")


class PrefixCache:
    """LRU of boundary activations, keyed by the microbatch's sample ids, for one (boundary, generation)."""

    def __init__(self, limit_mb: float):
        self.limit = int(limit_mb * 2**20)
        self.entries: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()
        self.bytes = 0
        self.boundary = 0
        """Global layers ``< boundary`` are skipped on a hit; 0: the cache is not in use this step."""
        self.generation = 0
        self.hits = self.misses = self.unkeyed = self.evictions = self.invalidations = 0
        self.saved_s = 0.0
        self._miss_s: dict[int, tuple[float, int]] = {}
        """Per boundary: summed measured prefix forward seconds of the misses, and their number."""
        self.stage_layers = 0
        """Global layers the first stage holds (the deepest boundary whose prefix lies all on it)."""
        self.peak_bytes = 0
        self.bypassed = 0
        """Calls with a trainable tensor in the prefix (TorchTitan's forward-shape inference after a validation
        runs the stage outside the freezing hook): run in full, nothing kept or served."""

    def set_boundary(self, boundary: int, generation: int) -> None:
        """Use the cache for ``boundary`` (0: not at all) of the controller's ``generation``; drops every entry
        of another boundary or generation."""
        if boundary > 0 and (boundary, generation) == (self.boundary, self.generation):
            return
        if self.entries:
            self.invalidations += 1
        self.entries.clear()
        self.bytes = 0
        self._miss_s.clear()
        self.boundary, self.generation = boundary, generation

    def get(self, key: tuple[int, ...]) -> torch.Tensor | None:
        t = self.entries.get(key)
        if t is not None:
            self.entries.move_to_end(key)
        return t

    def put(self, key: tuple[int, ...], t: torch.Tensor) -> None:
        size = t.numel() * t.element_size()
        if size > self.limit:
            return
        old = self.entries.pop(key, None)
        if old is not None:
            self.bytes -= old.numel() * old.element_size()
        while self.entries and self.bytes + size > self.limit:
            _, ev = self.entries.popitem(last=False)
            self.bytes -= ev.numel() * ev.element_size()
            self.evictions += 1
        self.entries[key] = t
        self.bytes += size
        self.peak_bytes = max(self.peak_bytes, self.bytes)

    def record_miss(self, seconds: float) -> None:
        s, n = self._miss_s.get(self.boundary, (0.0, 0))
        self._miss_s[self.boundary] = (s + seconds, n + 1)
        self.misses += 1

    def record_hit(self, seconds: float) -> None:
        s, n = self._miss_s.get(self.boundary, (0.0, 0))
        if n:
            self.saved_s += max(0.0, s / n - seconds)
        self.hits += 1

    @property
    def mb(self) -> float:
        return self.bytes / 2**20

    def counters(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in _COUNTERS}

    def load_counters(self, state: dict[str, Any]) -> None:
        for k in _COUNTERS:
            setattr(self, k, type(getattr(self, k))(state.get(k, 0)))


def decoder_layout(module: nn.Module) -> str | None:
    """Why ``module`` cannot take the cache (None when it can): it must be TorchTitan's decoder as a pipeline
    stage, with ``tok_embeddings`` (the first stage), ``layers`` (a ``ModuleDict`` keyed by block number),
    ``freqs_cis``, ``norm`` and ``output``."""
    for attr in ("tok_embeddings", "layers", "norm", "output", "freqs_cis"):
        if not hasattr(module, attr):
            return f"the first stage's module ({type(module).__name__}) has no {attr!r}"
    if module.tok_embeddings is None:
        return "the first stage's module has no embedding"
    if not isinstance(module.layers, nn.ModuleDict) or not all(k.isdigit() for k in module.layers):
        return "the first stage's blocks are not a ModuleDict keyed by block number"
    return None


def accept_sample_id(module: nn.Module) -> None:
    """Let ``module``'s forward take (and, without a cache, ignore) the ``sample_id`` keyword."""
    cls = type(module)
    if not getattr(cls, "takes_sample_id", False):
        module.__class__ = _cached_class(cls)


def attach(module: nn.Module, cache: PrefixCache) -> None:
    """Give ``module`` (see ``decoder_layout``) the cached forward, served by ``cache``."""
    accept_sample_id(module)
    _ATTACHED[module] = cache


def detach(module: nn.Module) -> None:
    """Undo ``attach``: the module's own class and forward again."""
    _ATTACHED.pop(module, None)
    base = getattr(type(module), "_cache_base_class", None)
    if base is not None:
        module.__class__ = base


_CLASSES: dict[type, type] = {}


def _cached_class(cls: type) -> type:
    if cls not in _CLASSES:
        _CLASSES[cls] = type(
            f"PrefixCached{cls.__name__}",
            (cls,),
            {"forward": _forward, "takes_sample_id": True, "_cache_base_class": cls, "__module__": cls.__module__},
        )
    return _CLASSES[cls]


def _forward(self, tokens, attention_masks=None, positions=None, sample_id=None):
    cache = _ATTACHED.get(self)
    base = type(self)._cache_base_class
    if cache is None or not torch.is_grad_enabled():
        return base.forward(self, tokens, attention_masks=attention_masks, positions=positions)
    if sample_id is None or cache.boundary <= 0:
        cache.unkeyed += sample_id is None
        return base.forward(self, tokens, attention_masks=attention_masks, positions=positions)
    kw = {"attention_masks": attention_masks, "positions": positions}
    blocks = [(int(k) + 1, blk) for k, blk in self.layers.items()]
    prefix = [self.tok_embeddings, *(blk for layer, blk in blocks if layer < cache.boundary)]
    if any(p.requires_grad for m in prefix for p in m.parameters()):  # not frozen in this call: no cache
        cache.bypassed += 1
        return base.forward(self, tokens, attention_masks=attention_masks, positions=positions)
    key = tuple(int(i) for i in sample_id.reshape(-1).tolist())
    t0 = time.perf_counter()
    kept = cache.get(key)
    if kept is not None:
        h = kept.to(tokens.device, copy=True)
        cache.record_hit(time.perf_counter() - t0)
    else:
        h = self.tok_embeddings(tokens)
        for layer, blk in blocks:
            if layer < cache.boundary:
                h = blk(h, self.freqs_cis, **kw)
        cache.record_miss(time.perf_counter() - t0)  # the prefix's forward, without keeping its output
        cache.put(key, h.detach().to("cpu", copy=True))
    for layer, blk in blocks:
        if layer >= cache.boundary:
            h = blk(h, self.freqs_cis, **kw)
    h = self.norm(h) if self.norm is not None else h
    return self.output(h) if self.output is not None else h


# -- Egeria's side: install on this rank's first stage, report -------------------------------------------
def install(stages, enabled: bool, limit_mb: float) -> tuple[PrefixCache | None, str | None]:
    """The cache of this rank's first stage (``StageView``s), attached to its module, or None and why not."""
    if not enabled:
        return None, "off ([freeze.egeria] cache = false)"
    first = [v for v in stages if v.is_first]
    if not first:
        return None, "the first stage is on another rank"
    why = decoder_layout(first[0].module)
    if why is not None:
        return None, why
    cache = PrefixCache(limit_mb)
    cache.stage_layers = max(first[0].layer_of.values(), default=-1) + 1
    attach(first[0].module, cache)
    for v in stages:  # multi-stage schedules hand the first stage's keyword arguments to every local stage
        if not v.is_first:
            accept_sample_id(v.module)
    return cache, None


def uninstall(stages) -> None:
    for v in stages:
        detach(v.module)


def summary(cache: PrefixCache | None, off: str | None) -> dict[str, Any]:
    """The cache's part of Egeria's ``method_summary`` (``forward_ms_saved``: estimated, module docstring)."""
    if cache is None:
        return {"cache": False, "cache_off": off}
    return {
        "cache": True,
        "cache_hits": cache.hits,
        "cache_misses": cache.misses,
        "cache_mb": round(cache.mb, 3),
        "cache_peak_mb": round(cache.peak_bytes / 2**20, 3),
        "cache_entries": len(cache.entries),
        "cache_evictions": cache.evictions,
        "cache_invalidations": cache.invalidations,
        "cache_unkeyed": cache.unkeyed,
        "cache_bypassed": cache.bypassed,
        "forward_ms_saved": round(cache.saved_s * 1e3, 3),
    }


STEP_METRIC_NAMES = ("cache_hits", "cache_misses", "forward_ms_saved", "cache_mb")
"""What :func:`step_metrics` returns with a cache (``FreezeMethod.step_metric_names``)."""


def step_metrics(cache: PrefixCache | None, seen: dict[str, float]) -> dict[str, float]:
    """This step's hits, misses and saved forward ms (since the last call; ``seen`` keeps the totals) and the
    cache's size now; empty without a cache."""
    if cache is None:
        return {}
    now = {"cache_hits": cache.hits, "cache_misses": cache.misses, "forward_ms_saved": cache.saved_s * 1e3}
    out = {k: v - seen.get(k, 0) for k, v in now.items()}
    seen.update(now)
    out["cache_mb"] = round(cache.mb, 3)
    return out
