"""Freezing leaves frozen tensors out of a microbatch's graph and every other gradient bit-identical.

Real ``torch.distributed.pipelining`` stages and schedules in one process (gloo, world size 1; the
multi-stage schedules put both stages on that rank), the runtime's own stage hooks and freezing
hook, and a method that freezes a different random subset per (stage, microbatch). The reference
gradient of every parameter is built microbatch by microbatch with plain autograd on the unsplit
model, summed in the order the stage ran its backward actions, skipping the microbatches that froze
the tensor. Equality is exact (``torch.equal``), for full backward (B), split backward (I then W)
and with activation checkpointing recomputing the forward inside the backward.
"""

from __future__ import annotations

import contextlib
import threading
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    checkpoint_wrapper,
)
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import get_schedule_class

from tests.single_rank import process_group  # noqa: F401 (module-scoped, autouse)
from timelyfreeze.hooks import stage_hooks
from timelyfreeze.hooks.freezing import FreezingHook
from timelyfreeze.hooks.profiler import ActionProfiler
from timelyfreeze.hooks.stage_layout import build_stage_views
from timelyfreeze.methods.base import FreezeMethod
from timelyfreeze.methods.selection import action_generator, uniform_subset

V, D, SEQ, N_MB = 64, 32, 8, 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.w1 = nn.Linear(D, 2 * D)
        self.w2 = nn.Linear(2 * D, D, bias=False)

    def forward(self, x):
        return x + self.w2(torch.nn.functional.gelu(self.w1(self.norm(x))))


class Part(nn.Module):
    """A pipeline stage laid out like TorchTitan's llama parts (tok_embeddings / layers / norm / output)."""

    def __init__(self, first: bool, last: bool, layer_ids: list[int], ac: bool):
        super().__init__()
        self.tok_embeddings = nn.Embedding(V, D) if first else None
        self.layers = nn.ModuleDict()
        for i in layer_ids:
            blk = Block()
            self.layers[str(i)] = checkpoint_wrapper(blk, checkpoint_impl=CheckpointImpl.NO_REENTRANT) if ac else blk
        self.norm = nn.LayerNorm(D) if last else None
        self.output = nn.Linear(D, V, bias=False) if last else None

    def forward(self, x):
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        for blk in self.layers.values():
            h = blk(h)
        if self.output is not None:
            h = self.output(self.norm(h))
        return h


def loss_fn(logits, target):
    return nn.functional.cross_entropy(logits.reshape(-1, V), target.reshape(-1))


class RandomPerAction(FreezeMethod):
    name = "test_random"

    def __init__(self, views, ratio):
        self.names = {v.stage: [n for n in v.params if n != v.anchor] for v in views}
        self.ratio = ratio
        self.chosen: dict[tuple[int, int], frozenset[str]] = {}

    def frozen_tensors(self, step, stage, microbatch, accum=0):
        s = uniform_subset(self.names[stage], self.ratio, action_generator(7, step, stage, microbatch))
        self.chosen[(stage, microbatch)] = s
        return s


class BackwardOrder:
    """Listener recording the order in which each stage ran the backward action that fills .grad."""

    def __init__(self):
        self.order: dict[int, list[int]] = {}
        self.first_stage_w: set[int] = set()

    def before_action(self, stage, kind, mb):
        pass

    def after_action(self, stage, kind, mb):
        if kind in ("B", "W"):
            self.order.setdefault(stage, []).append(mb)


def build_parts(n_stages: int, ac: bool, seed: int = 0):
    torch.manual_seed(seed)
    per = 2
    return [Part(s == 0, s == n_stages - 1, list(range(s * per, (s + 1) * per)), ac) for s in range(n_stages)]


MULTI_STAGE = ("Interleaved1F1B", "ZBVZeroBubble", "DualPipeV")


def run_pipeline(schedule: str, ratio: float, ac: bool, overlap: bool = False, profiler: list | None = None):
    """One pipeline step. ``overlap``: DualPipeV's OVERLAP_F_B actions run by TorchTitan's overlap callback
    (forward and backward in two threads), as TorchTitan registers it on GPU hosts, with the accelerator
    stream calls it makes stubbed out for CPU. ``profiler``: a list that receives the run's
    ``ActionProfiler`` (pairs named from the schedule, as the runtime does)."""
    multi = schedule in MULTI_STAGE
    n_stages = 2 if multi else 1
    parts = build_parts(n_stages, ac)
    stages = [PipelineStage(p, i, n_stages, torch.device("cpu"), group=dist.group.WORLD) for i, p in enumerate(parts)]
    cls = get_schedule_class(schedule)
    sched = cls(stages if multi else stages[0], n_microbatches=N_MB, loss_fn=loss_fn, scale_grads=False)
    views = build_stage_views(stages, n_layers=2 * n_stages)
    method = RandomPerAction(views, ratio)
    pairs = stage_hooks.overlap_pairs(sched)
    hook = FreezingHook(views, method, lambda: 1, pairs=pairs, num_microbatches=N_MB)
    order = BackwardOrder()
    prof = ActionProfiler(0, use_cuda=False, pairs=pairs)
    if profiler is not None:
        profiler.append(prof)
    for st in stages:
        stage_hooks.install(st, [hook, order, prof])
    torch.manual_seed(123)
    x = torch.randint(0, V, (N_MB, SEQ))
    y = torch.randint(0, V, (N_MB, SEQ))
    with contextlib.ExitStack() as stack:
        if overlap:
            stack.enter_context(torchtitan_overlap_callback(sched))
        sched.step(x, target=y)
    return parts, views, method, order, hook, x, y


@contextlib.contextmanager
def torchtitan_overlap_callback(sched):
    """TorchTitan 0.2.2's ``overlap_callback`` registered for OVERLAP_F_B, runnable on CPU: its two accelerator
    stream calls (``torch.accelerator.current_stream``, ``device_module.set_stream``) become no-ops. An
    exception in its backward thread, which the callback itself would drop, fails the test."""
    from torch.distributed.pipelining.schedules import OVERLAP_F_B
    from torchtitan.distributed import dual_pipe_v

    thread_errors: list = []
    sched.register_custom_function(OVERLAP_F_B, dual_pipe_v.overlap_callback)
    with (
        mock.patch("torch.accelerator.current_stream", return_value=None),
        mock.patch.object(dual_pipe_v, "device_module", SimpleNamespace(set_stream=lambda stream: None)),
        mock.patch.object(threading, "excepthook", thread_errors.append),
    ):
        yield
    assert not thread_errors, f"the overlap callback's backward thread failed: {thread_errors[0].exc_value!r}"


def reference_grads(parts, views, method, order, x, y):
    """Per-microbatch autograd on the whole (unsplit) model, accumulated like the pipeline did."""
    ref = build_parts(len(parts), ac=False)
    for r, p in zip(ref, parts):
        r.load_state_dict({k.replace("_checkpoint_wrapped_module.", ""): v for k, v in p.state_dict().items()})
    per_mb = []
    for m in range(N_MB):
        h = x[m : m + 1]
        for r in ref:
            h = r(h)
        loss = loss_fn(h, y[m : m + 1])
        params = [p for r in ref for p in r.parameters()]
        per_mb.append(torch.autograd.grad(loss, params))
    out = {}
    flat_names = [(s, n) for s, r in enumerate(ref) for n, _ in r.named_parameters()]
    for s, view in enumerate(views):
        for n in view.params:
            clean = n.replace("_checkpoint_wrapped_module.", "")
            idx = flat_names.index((s, clean))
            g = None
            for m in order.order[view.stage]:
                if n in method.chosen.get((view.stage, m), frozenset()) and n != view.anchor:
                    continue
                g = per_mb[m][idx].clone() if g is None else g + per_mb[m][idx]
            out[(s, n)] = g
    return out


CASES = [
    ("GPipe", False),
    ("1F1B", False),
    ("Interleaved1F1B", False),
    ("ZBVZeroBubble", False),  # split backward: I then W
    ("DualPipeV", False),  # B, I then W, and OVERLAP_F_B pairs (forward of one stage + B of the other)
    ("1F1B", True),  # activation checkpointing: forward recomputed inside B
    ("GPipe", True),
    ("ZBVZeroBubble", True),  # ... and inside W, which must see the forward's flags (every tensor on there fails)
    ("DualPipeV", True),
]


@pytest.mark.parametrize("schedule,ac", CASES)
def test_frozen_get_nothing_and_others_are_bit_identical(schedule, ac):
    check_exact(schedule, ac)


def test_dualpipev_exact_under_torchtitan_overlap_callback():
    """DualPipeV as TorchTitan runs it on GPU hosts: each pair's backward in a second thread, concurrently
    with its forward; the freezing hook's per-stage switches still give bit-identical gradients."""
    check_exact("DualPipeV", ac=False, overlap=True)
    check_exact("DualPipeV", ac=True, overlap=True)


@pytest.mark.parametrize("overlap", [False, True], ids=["torch-loop", "overlap-callback"])
def test_dualpipev_pairs_are_one_action_each(overlap):
    """The runtime's listeners see a pair as one action: the profiler records it once, under torch's name
    for it, in the order torch executes (``planner.schedule.orders``), and the hook records the ratio its
    backward part applied under that name."""
    from planner.schedule.actions import parse_action
    from planner.schedule.orders import rank_orders

    got: list[ActionProfiler] = []
    parts, views, method, order, hook, x, y = run_pipeline(
        "DualPipeV", ratio=0.5, ac=False, overlap=overlap, profiler=got
    )
    (prof,) = got
    expected = rank_orders("DualPipeV", 1, N_MB)[0]
    assert prof.order == expected
    assert sum("OVERLAP_F_B" in a for a in expected) >= 4
    records = prof.collect()
    assert [a for a, _, _ in records] == expected and all(ms > 0 for _, ms, _ in records)
    applied = hook.end_step()
    freezable = [a for a in expected if parse_action(a).kind in ("B", "W", "OVERLAP_F_B")]
    assert sorted(applied) == sorted(freezable)
    totals = {v.stage: sum(p.numel() for p in v.params.values()) for v in views}
    for a in freezable:
        act = parse_action(a)
        chosen = method.chosen[(act.stage, act.microbatch)]
        frozen = sum(views[act.stage].params[n].numel() for n in chosen if n != views[act.stage].anchor)
        assert applied[a] == [(frozen / totals[act.stage], len(chosen - {views[act.stage].anchor}))], a


def check_exact(schedule: str, ac: bool, overlap: bool = False):
    parts, views, method, order, hook, x, y = run_pipeline(schedule, ratio=0.5, ac=ac, overlap=overlap)
    ref = reference_grads(parts, views, method, order, x, y)
    n_frozen_somewhere = 0
    for s, view in enumerate(views):
        assert sorted(order.order[view.stage]) == list(range(N_MB))
        for n, p in view.params.items():
            frozen_in = [m for m in range(N_MB) if n in method.chosen[(view.stage, m)] and n != view.anchor]
            n_frozen_somewhere += bool(frozen_in)
            expected = ref[(s, n)]
            if expected is None:
                assert p.grad is None, f"{schedule}: {n} frozen in every microbatch but got a gradient"
            else:
                assert p.grad is not None, f"{schedule}: {n} lost its gradient"
                assert torch.equal(p.grad, expected), (
                    f"{schedule} ac={ac}: {n} (frozen in microbatches {frozen_in}) differs from the reference "
                    f"by {(p.grad - expected).abs().max().item():.3e}"
                )
    assert n_frozen_somewhere > 0  # the test really froze something
    # every tensor is on again after each stage's last backward of the batch
    assert all(p.requires_grad for v in views for p in v.params.values())


def test_unfrozen_pipeline_matches_reference_exactly():
    """The reference construction itself: with nothing frozen the pipeline equals it bit for bit."""
    parts, views, method, order, hook, x, y = run_pipeline("1F1B", ratio=0.0, ac=False)
    ref = reference_grads(parts, views, method, order, x, y)
    for s, view in enumerate(views):
        for n, p in view.params.items():
            assert torch.equal(p.grad, ref[(s, n)])


def test_graph_of_a_frozen_microbatch_does_not_reach_frozen_tensors():
    """The forward of a microbatch records no edge to the tensors it froze, so no dW work exists for them."""
    (part,) = build_parts(1, ac=False)
    stage = PipelineStage(part, 0, 1, torch.device("cpu"), group=dist.group.WORLD)
    (view,) = build_stage_views([stage], n_layers=2)
    frozen = frozenset(n for n in view.params if ".w1." in n or "tok_embeddings" in n)

    class Fixed(FreezeMethod):
        name = "fixed"

        def __init__(self):
            pass

        def frozen_tensors(self, step, stage, mb, accum=0):
            return frozen

    hook = FreezingHook([view], Fixed(), lambda: 1, num_microbatches=1)
    hook.before_action(0, "F", 0)
    out = part(torch.randint(0, V, (1, SEQ)))
    hook.after_action(0, "F", 0)
    reached = set()
    seen = set()
    todo = [out.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if hasattr(fn, "variable"):
            reached.add(id(fn.variable))
        todo.extend(f for f, _ in fn.next_functions)
    ids = {id(p): n for n, p in view.params.items()}
    reached_names = {ids[i] for i in reached if i in ids}
    assert reached_names.isdisjoint(frozen)
    assert reached_names == set(view.params) - frozen
    assert 0 < hook._masks[(0, 0)][1] < 1  # (frozen tensors, applied ratio, their bits)


def test_anchor_is_never_frozen_and_lower_bound_runs_on_first_stage():
    """Everything frozen on a first stage still leaves its anchor, so its backward has work to do."""
    parts, views, method, order, hook, x, y = run_pipeline("1F1B", ratio=1.0, ac=False)
    (view,) = views
    assert view.anchor is not None and "layers.0." in view.anchor
    for n, p in view.params.items():
        if n == view.anchor:
            assert p.grad is not None
        else:
            assert p.grad is None
