"""Freezing whole compiled blocks gives an unfrozen compiled run's gradients, and skips the frozen weights' work.

The pipeline of ``test_freezing_exact`` (real ``torch.distributed.pipelining`` stages and schedules in one
process) with every block ``torch.compile``'d as TorchTitan does (``fullgraph=True``, inductor). Two runs of
one step on the same weights and batch: one with a method that freezes a random half of each stage's block
units per (stage, microbatch), one with nothing frozen (the same hooks, an empty set). Recorded per
(stage, microbatch): each parameter's gradient as autograd hands it to ``.grad`` (a tensor hook), the
gradient of each block's input (every activation gradient the pipeline computes, the one a stage sends
back included), and the matrix products of the backward actions.

Asserted:

- **Gradients against the unfrozen run.** A parameter trainable in a microbatch gets exactly (``torch.equal``)
  the unfrozen run's gradient for that microbatch; a frozen one gets none. Each ``.grad`` is the unfrozen
  run's per-microbatch gradients summed over the microbatches that did not freeze it, in the order the
  stage ran its backward actions (``None`` when every microbatch froze it). Every activation gradient the
  frozen run computes equals the unfrozen run's; the only ones it does not compute are those of the first
  block's input in a microbatch that froze the first unit (the embedding rides with that block, so its
  output needs no gradient). Exact, not within a tolerance: the unfrozen graphs and the frozen ones differ
  only in the weight-gradient products the frozen ones leave out, and every value compared here is computed
  by the same inductor kernels on the same inputs in one process (same thread count). If a future inductor
  fused differently in the two graphs, the last place of a sum could move; the failure message gives the
  largest difference.
- **Weight-gradient work skipped.** The backward actions of the frozen run run exactly as many matrix
  products fewer (``aten.mm``/``addmm``/``bmm``, counted by a ``TorchDispatchMode``) as the frozen units hold
  ``nn.Linear`` weights, summed over (stage, microbatch): one product per frozen weight (its
  ``input^T @ grad_output``); every input-gradient product still runs (the anchor keeps every block's input
  needing a gradient). Bias and norm gradients are sums, not products, and the embedding's is a scatter.
  Compiled blocks: Dynamo neither compiles nor runs a compiled frame under a Python dispatch mode, so the
  mode is entered around backward actions only; there the compiled backward graphs run with no Dynamo frame,
  and inductor calls their products as ``aten.mm.out`` through the dispatcher, where the mode sees them.
  Eager blocks (``test_eager_freezing_skips_the_frozen_weight_products``): the forward's products are counted
  as well and must not change.

Activation checkpointing on and off; 1F1B, GPipe, Interleaved1F1B (two stages on the rank).
"""

from __future__ import annotations

import collections

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import get_schedule_class
from torch.utils._python_dispatch import TorchDispatchMode

from tests.single_rank import process_group  # noqa: F401 (module-scoped, autouse)
from tests.test_freezing_exact import MULTI_STAGE, N_MB, SEQ, BackwardOrder, V, build_parts, loss_fn
from timelyfreeze.hooks import stage_hooks
from timelyfreeze.hooks.freezing import FreezingHook
from timelyfreeze.hooks.stage_layout import build_stage_views
from timelyfreeze.methods.base import FreezeMethod
from timelyfreeze.methods.common import Units
from timelyfreeze.methods.selection import action_generator, balanced_subset

MATMULS = {"mm", "addmm", "bmm"}
"""The aten overload packets counted as matrix products (``.default`` and ``.out`` alike)."""


def compiled_parts(n_stages: int, ac: bool, compile: bool = True):
    parts = build_parts(n_stages, ac)  # seeded: every call builds the same weights
    if compile:
        for part in parts:
            for k, blk in list(part.layers.items()):
                part.layers[k] = torch.compile(blk, fullgraph=True)
    return parts


class RandomUnits(FreezeMethod):
    """A random share ``ratio`` of each stage's units per (stage, microbatch); ratio 0 freezes nothing."""

    name = "test_random_units"

    def __init__(self, views, ratio):
        self.units = {v.stage: Units(v) for v in views}
        self.ratio = ratio
        self.chosen: dict[tuple[int, int], frozenset[str]] = {}

    def frozen_tensors(self, step, stage, microbatch, accum=0):
        u = self.units[stage]
        picked = balanced_subset(u.names, u.numels, self.ratio, action_generator(5, step, stage, microbatch))
        s = u.tensors(picked) if self.ratio > 0 else frozenset()
        self.chosen[(stage, microbatch)] = s
        return s


class MatmulCount(TorchDispatchMode):
    """Matrix products per action kind (``F``, ``B``), counted while the mode is entered (by ``Recorder``)."""

    def __init__(self):
        super().__init__()
        self.kind: str | None = None
        self.count: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in MATMULS:
            self.count[self.kind] += 1
        return func(*args, **(kwargs or {}))


class Recorder:
    """Stage listener: which (stage, microbatch) runs now, for the tensor hooks; enters the counting mode
    around the actions of ``kinds``. Dynamo refuses to compile, or to run a compiled frame, under a Python
    dispatch mode, so with compiled blocks the mode is entered for backward actions only: the backward of a
    compiled block runs AOTAutograd's compiled backward, with no Dynamo frame in it, and the products of a
    compiled graph's backward are seen there (as ``aten.mm.out``, inductor's extern kernel call)."""

    def __init__(self, kinds: tuple[str, ...]):
        self.mode = MatmulCount()
        self.kinds = kinds
        self.now: tuple[int, int] | None = None

    def before_action(self, stage, kind, mb):
        self.now = (stage, mb)
        if kind in self.kinds:
            self.mode.kind = kind
            self.mode.__enter__()

    def after_action(self, stage, kind, mb):
        self.now = None
        if kind in self.kinds:
            self.mode.__exit__(None, None, None)
            self.mode.kind = None


def run(schedule: str, ac: bool, ratio: float, compile: bool = True):
    """One pipeline step; returns what the module docstring says is recorded."""
    multi = schedule in MULTI_STAGE
    n_stages = 2 if multi else 1
    parts = compiled_parts(n_stages, ac, compile)
    stages = [PipelineStage(p, i, n_stages, torch.device("cpu"), group=dist.group.WORLD) for i, p in enumerate(parts)]
    sched = get_schedule_class(schedule)(
        stages if multi else stages[0], n_microbatches=N_MB, loss_fn=loss_fn, scale_grads=False
    )
    views = build_stage_views(stages, n_layers=2 * n_stages, unit="block")
    method = RandomUnits(views, ratio)
    rec = Recorder(("B",) if compile else ("F", "B"))
    order = BackwardOrder()
    for st in stages:
        stage_hooks.install(st, [FreezingHook(views, method, lambda: 1, num_microbatches=N_MB), order, rec])
    param_grads: dict[tuple[int, str, int], torch.Tensor] = {}
    for view in views:
        for n, p in view.params.items():

            def keep(g, key=(view.stage, n)):
                param_grads[(*key, rec.now[1])] = g.detach().clone()

            p.register_hook(keep)
    act_grads: dict[tuple[int, str, int], torch.Tensor] = {}
    for view, part in zip(views, parts):
        for k, blk in part.layers.items():

            def watch(module, args, key=(view.stage, k)):
                (h,) = args
                if h.requires_grad and rec.now is not None:  # not the stage's shape inference, outside any action
                    mb = rec.now[1]
                    h.register_hook(lambda g: act_grads.__setitem__((*key, mb), g.detach().clone()))

            blk.register_forward_pre_hook(watch)
    torch.manual_seed(123)
    x = torch.randint(0, V, (N_MB, SEQ))
    y = torch.randint(0, V, (N_MB, SEQ))
    sched.step(x, target=y)
    grads = {(v.stage, n): p.grad for v in views for n, p in v.params.items()}
    assert all(p.requires_grad for v in views for p in v.params.values())  # every switch restored
    return views, parts, method, order, param_grads, act_grads, grads, rec.mode.count


def linear_weights(part: nn.Module, names) -> int:
    """How many of ``names`` are the weight of an ``nn.Linear`` in ``part``."""
    return sum(
        1 for n in names if n.endswith(".weight") and isinstance(part.get_submodule(n.rsplit(".", 1)[0]), nn.Linear)
    )


def frozen_linear_weights(views, parts, method) -> int:
    """The ``nn.Linear`` weights the method froze, summed over (stage, microbatch): the products it skips."""
    return sum(linear_weights(p, method.chosen[(v.stage, m)]) for v, p in zip(views, parts) for m in range(N_MB))


CASES = [("1F1B", False), ("1F1B", True), ("GPipe", False), ("Interleaved1F1B", False)]


@pytest.mark.parametrize("schedule,ac", CASES)
def test_compiled_freezing_equals_an_unfrozen_compiled_run(schedule, ac):
    torch._dynamo.reset()  # graphs of earlier tests do not count against this one's cache
    views, parts, method, order, pg, ag, grads, mm = run(schedule, ac, 0.5)
    _, _, _, _, pg0, ag0, grads0, mm0 = run(schedule, ac, 0.0)
    tag = f"{schedule} ac={ac}"
    frozen_somewhere = trainable_somewhere = 0
    for view in views:
        s = view.stage
        for n in view.params:
            expected = None
            for m in order.order[s]:
                frozen = n in method.chosen[(s, m)]
                frozen_somewhere += frozen
                trainable_somewhere += not frozen
                if frozen:
                    assert (s, n, m) not in pg, f"{tag}: {n} frozen in microbatch {m} but got a gradient"
                    continue
                g, g0 = pg[(s, n, m)], pg0[(s, n, m)]
                assert torch.equal(g, g0), f"{tag}: {n}, microbatch {m}: off by {(g - g0).abs().max():.3e}"
                expected = g0.clone() if expected is None else expected + g0
            if expected is None:
                assert grads[(s, n)] is None, f"{tag}: {n} frozen in every microbatch but has a .grad"
            else:
                assert torch.equal(grads[(s, n)], expected), f"{tag}: {n}'s .grad is not the unfrozen sum"
        # whole units: every unit's tensors are frozen together, or not at all
        for m in range(N_MB):
            chosen = method.chosen[(s, m)]
            for members in view.units.values():
                assert set(members) <= chosen or not (set(members) & chosen)
    assert frozen_somewhere > 0 and trainable_somewhere > 0
    # the unfrozen run: every parameter, every block input, every microbatch
    assert all(g is not None for g in grads0.values())
    assert set(ag0) == {(v.stage, k, m) for v, p in zip(views, parts) for k in p.layers for m in range(N_MB)}
    first_unit = next(iter(views[0].units.values()))
    missing = {(0, next(iter(parts[0].layers)), m) for m in range(N_MB) if set(first_unit) <= method.chosen[(0, m)]}
    assert set(ag) == set(ag0) - missing, tag
    for key, g in ag.items():
        assert torch.equal(g, ag0[key]), f"{tag}: input gradient of {key}: off by {(g - ag0[key]).abs().max():.3e}"
    # the frozen weights' products did not run, and every other product of the backward did
    skipped = frozen_linear_weights(views, parts, method)
    assert skipped > 0
    assert mm0["B"] - mm["B"] == skipped, (tag, mm, mm0, skipped)


@pytest.mark.parametrize("schedule,ac", [("1F1B", False), ("1F1B", True)])
def test_eager_freezing_skips_the_frozen_weight_products(schedule, ac):
    """The same count on eager blocks, where every product is an aten call of its own."""
    views, parts, method, _, _, _, _, mm = run(schedule, ac, 0.5, compile=False)
    *_, mm0 = run(schedule, ac, 0.0, compile=False)
    skipped = frozen_linear_weights(views, parts, method)
    assert skipped > 0
    assert mm["F"] == mm0["F"]
    assert mm0["B"] - mm["B"] == skipped, (mm, mm0, skipped)
