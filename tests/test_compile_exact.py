"""Freezing whole blocks under ``torch.compile`` leaves every other gradient bit-identical.

The pipeline of ``test_freezing_exact`` (real ``torch.distributed.pipelining`` stages and schedules in one
process) with every block ``torch.compile``'d as TorchTitan does (``fullgraph=True``, inductor), and a method
that freezes a random half of each stage's block units per (stage, microbatch). The reference is the same
compiled model run microbatch by microbatch with plain autograd, each microbatch with the same units frozen
from its forward on; gradients are summed in the order the stage ran its backward actions. Equality is exact
(``torch.equal``): a microbatch's frozen and trainable blocks run the very graphs the reference runs. Frozen
units get no gradient. Activation checkpointing on and off.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import get_schedule_class

from tests.single_rank import process_group  # noqa: F401 (module-scoped, autouse)
from tests.test_freezing_exact import MULTI_STAGE, N_MB, SEQ, BackwardOrder, V, build_parts, loss_fn
from timelyfreeze.hooks import stage_hooks
from timelyfreeze.hooks.freezing import FreezingHook
from timelyfreeze.hooks.selection import action_generator, balanced_subset
from timelyfreeze.hooks.stage_layout import build_stage_views
from timelyfreeze.methods.base import FreezeMethod
from timelyfreeze.methods.common import Units


def compiled_parts(n_stages: int, ac: bool):
    parts = build_parts(n_stages, ac)
    for part in parts:
        for k, blk in list(part.layers.items()):
            part.layers[k] = torch.compile(blk, fullgraph=True)
    return parts


class RandomUnits(FreezeMethod):
    name = "test_random_units"

    def __init__(self, views, ratio):
        self.units = {v.stage: Units(v) for v in views}
        self.ratio = ratio
        self.chosen: dict[tuple[int, int], frozenset[str]] = {}

    def frozen_tensors(self, step, stage, microbatch, accum=0):
        u = self.units[stage]
        s = u.tensors(balanced_subset(u.names, u.numels, self.ratio, action_generator(5, step, stage, microbatch)))
        self.chosen[(stage, microbatch)] = s
        return s


def run(schedule: str, ac: bool):
    multi = schedule in MULTI_STAGE
    n_stages = 2 if multi else 1
    parts = compiled_parts(n_stages, ac)
    stages = [PipelineStage(p, i, n_stages, torch.device("cpu"), group=dist.group.WORLD) for i, p in enumerate(parts)]
    sched = get_schedule_class(schedule)(
        stages if multi else stages[0], n_microbatches=N_MB, loss_fn=loss_fn, scale_grads=False
    )
    views = build_stage_views(stages, n_layers=2 * n_stages, unit="block")
    method = RandomUnits(views, 0.5)
    hook = FreezingHook(views, method, lambda: 1)
    order = BackwardOrder()
    for st in stages:
        stage_hooks.install(st, [hook, order])
    torch.manual_seed(123)
    x = torch.randint(0, V, (N_MB, SEQ))
    y = torch.randint(0, V, (N_MB, SEQ))
    sched.step(x, target=y)
    return parts, views, method, order, x, y


def reference(parts, views, method, order, x, y, ac: bool):
    ref = compiled_parts(len(parts), ac)
    for r, p in zip(ref, parts):
        r.load_state_dict(p.state_dict())
    named = [(s, n, p) for s, r in enumerate(ref) for n, p in r.named_parameters()]
    per_mb = []
    for m in range(N_MB):
        frozen = {(v.stage, n) for v in views for n in method.chosen[(v.stage, m)]}
        for s, n, p in named:
            p.requires_grad_((views[s].stage, n) not in frozen)
        h = x[m : m + 1]
        for r in ref:
            h = r(h)
        live = [(s, n, p) for s, n, p in named if p.requires_grad]
        grads = torch.autograd.grad(loss_fn(h, y[m : m + 1]), [p for _, _, p in live])
        per_mb.append({(s, n): g for (s, n, _), g in zip(live, grads)})
    out = {}
    for s, view in enumerate(views):
        for n in view.params:
            g = None
            for m in order.order[view.stage]:
                part = per_mb[m].get((s, n))
                if part is not None:
                    g = part.clone() if g is None else g + part
            out[(s, n)] = g
    return out


@pytest.mark.parametrize("schedule,ac", [("1F1B", False), ("1F1B", True), ("GPipe", False), ("Interleaved1F1B", False)])
def test_compiled_block_freezing_is_exact(schedule, ac):
    torch._dynamo.reset()  # graphs of earlier tests do not count against this one's cache
    parts, views, method, order, x, y = run(schedule, ac)
    ref = reference(parts, views, method, order, x, y, ac)
    frozen_somewhere = 0
    for s, view in enumerate(views):
        for n, p in view.params.items():
            frozen_in = [m for m in range(N_MB) if n in method.chosen[(view.stage, m)]]
            frozen_somewhere += bool(frozen_in)
            expected = ref[(s, n)]
            if expected is None:
                assert p.grad is None, f"{n} frozen in every microbatch but got a gradient"
            else:
                assert torch.equal(p.grad, expected), (
                    f"{schedule} ac={ac}: {n} (frozen in {frozen_in}) off by {(p.grad - expected).abs().max():.3e}"
                )
        # whole units: every unit's tensors are frozen together, or not at all
        for m in range(N_MB):
            chosen = method.chosen[(view.stage, m)]
            for members in view.units.values():
                assert set(members) <= chosen or not (set(members) & chosen)
    assert frozen_somewhere > 0
    assert all(p.requires_grad for v in views for p in v.params.values())
