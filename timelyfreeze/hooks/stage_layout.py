"""Which parameter tensors a pipeline stage holds and where they sit in the whole model.

Builds the ``StageView`` of every stage this rank runs: trainable tensors by name, their global
layer index (embedding 0, transformer block k -> k + 1, final norm and output head last; the names
TorchTitan's llama3/llama4/qwen/deepseek models use; a parameter with any other name ends the run with
one error line naming it, rather than being placed at layer 0 by a guess),
the per-layer modules (for methods that hook activations), and the first stage's *anchor*.

The anchor: a stage whose input needs no gradient (the first) would have nothing left to
backpropagate into if every tensor were frozen, and with most tensors frozen its backward would stop
at an unpredictable depth. Keeping one small tensor of its first block trainable (the smallest
tensor of the first layer that holds more than one tensor, e.g. ``layers.0.attention_norm.weight``,
256 elements of the debug model's ~3 M) makes the backward always reach back through the stage's
blocks, so its time falls linearly with the freeze ratio like every other stage's.

Freezing units (``[freeze] unit``): what a method samples when it freezes a share of the stage. With
``tensor`` every freezable tensor is a unit of its own. With ``block`` a unit is a whole module: each
transformer block (``layers.<k>``, the region TorchTitan compiles), the final norm, the output head. On
the first stage the embedding joins its first block's unit: ``torch.compile`` guards on the
``requires_grad`` of a block's inputs as well as its parameters, and the anchor keeps the first block
partly trainable, so an embedding frozen apart from that block would give the block four variants
(its input and its tensors each trainable or frozen) instead of two.
"""

from __future__ import annotations

import re

import torch

from timelyfreeze.job.errors import FreezeConfigError
from timelyfreeze.job.stage_view import StageView

_BLOCK = re.compile(r"^(?:.*\.)?layers\.(\d+)\.")
_HEAD_PREFIXES = ("norm.", "output.", "final_norm.", "lm_head.")
_EMBED_PREFIXES = ("tok_embeddings.", "embed_tokens.", "embeddings.")
UNITS = ("tensor", "block")
"""Values of ``[freeze] unit`` once resolved (``auto`` becomes one of these: ``timelyfreeze.config.freeze``)."""


def layer_index(name: str, n_layers: int) -> int:
    """Global layer index of a parameter name (see module docstring)."""
    m = _BLOCK.match(name)
    if m:
        return int(m.group(1)) + 1
    if name.startswith(_HEAD_PREFIXES):
        return n_layers + 1
    if name.startswith(_EMBED_PREFIXES):
        return 0
    raise FreezeConfigError(
        f"[model] parameter {name!r}: the freezing runtime cannot place it in the model's layer order (it knows "
        f"TorchTitan's names: {', '.join(p + '*' for p in _EMBED_PREFIXES)} layers.<k>.*, "
        f"{', '.join(p + '*' for p in _HEAD_PREFIXES)})"
    )


def choose_anchor(params: dict[str, torch.nn.Parameter], layer_of: dict[str, int]) -> str | None:
    if not params:
        return None
    by_layer: dict[int, list[str]] = {}
    for n in params:
        by_layer.setdefault(layer_of[n], []).append(n)
    for layer in sorted(by_layer):
        if len(by_layer[layer]) > 1:
            return min(by_layer[layer], key=lambda n: (params[n].numel(), n))
    first = by_layer[min(by_layer)]
    return min(first, key=lambda n: (params[n].numel(), n))


def _module_of(name: str) -> str:
    """The block-level module a parameter belongs to: ``layers.<k>`` (with any prefix before it) for a
    transformer block's tensors, else the name's first component (``tok_embeddings``, ``norm``, ``output``)."""
    m = _BLOCK.match(name)
    return m.group(0)[:-1] if m else name.split(".", 1)[0]


def freeze_units(
    params: dict[str, torch.nn.Parameter], layer_of: dict[str, int], anchor: str | None, unit: str
) -> dict[str, tuple[str, ...]]:
    """The stage's freezing units, front to back: unit name -> its freezable tensors (registration order,
    the anchor left out). See the module docstring."""
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
    names = [n for n in params if n != anchor]
    if unit == "tensor":
        return {n: (n,) for n in names}
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(_module_of(n), []).append(n)
    first_layer = {u: min(layer_of[n] for n in ns) for u, ns in groups.items()}
    order = sorted(groups, key=first_layer.__getitem__)  # stable: registration order within a layer
    embed = [u for u in order if first_layer[u] == 0]
    blocks = [u for u in order if _BLOCK.match(u + ".")]
    if anchor is None or not embed or not blocks:
        return {u: tuple(groups[u]) for u in order}
    # the first stage: the embedding rides with the first block (module docstring)
    units: dict[str, tuple[str, ...]] = {}
    for u in order:
        if u == blocks[0]:
            units["+".join(embed + [u])] = tuple(n for e in embed + [u] for n in groups[e])
        elif u not in embed:
            units[u] = tuple(groups[u])
    return units


def _layer_modules(module: torch.nn.Module, n_layers: int) -> dict[int, torch.nn.Module]:
    mods: dict[int, torch.nn.Module] = {}
    layers = getattr(module, "layers", None)
    if layers is not None:
        items = layers.items() if isinstance(layers, torch.nn.ModuleDict) else enumerate(layers)
        for k, blk in items:
            mods[int(k) + 1] = blk
    for attr in ("tok_embeddings", "embed_tokens"):
        if getattr(module, attr, None) is not None:
            mods[0] = getattr(module, attr)
    for attr in ("output", "lm_head"):
        if getattr(module, attr, None) is not None:
            mods[n_layers + 1] = getattr(module, attr)
    return mods


def build_stage_views(stages, n_layers: int, unit: str = "tensor") -> list[StageView]:
    """``stages``: the ``PipelineStage`` objects of this rank (``stage.submod`` is the model part);
    ``unit``: the freezing unit (``UNITS``)."""
    views = []
    for st in stages:
        module = st.submod
        params = {n: p for n, p in module.named_parameters() if p.requires_grad}
        layer_of = {n: layer_index(n, n_layers) for n in params}
        anchor = choose_anchor(params, layer_of) if st.is_first else None
        views.append(
            StageView(
                stage=st.stage_index,
                module=module,
                params=params,
                layer_of=layer_of,
                layer_modules=_layer_modules(module, n_layers),
                is_first=st.is_first,
                is_last=st.is_last,
                anchor=anchor,
                units=freeze_units(params, layer_of, anchor, unit),
            )
        )
    return views
