"""Tiny pipeline stages for the freezing-method tests, plus the fixed-ratio random control's tests.

A "model" is an embedding (layer 0), ``n_blocks`` residual Linear blocks (layers 1..n_blocks) and a
norm + output head (layer n_blocks + 1), split into stages by block ranges. The first stage's anchor is
the embedding weight.
"""

import math
import threading
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from timelyfreeze.job.errors import FreezeConfigError
from timelyfreeze.job.phases import Phases
from timelyfreeze.job.stage_view import StageView
from timelyfreeze.methods.apf import APFConfig
from timelyfreeze.methods.autofreeze import AutoFreezeConfig
from timelyfreeze.methods.base import MethodContext
from timelyfreeze.methods.common import freezable_names
from timelyfreeze.methods.egeria.method import EgeriaConfig
from timelyfreeze.methods.random_fixed import RandomConfig, RandomFixed
from timelyfreeze.methods.smartpipe import SmartPipeConfig

VOCAB, DIM = 11, 4


class TinyStage(nn.Module):
    def __init__(self, blocks: range, n_blocks: int, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed + blocks.start)
        self.first, self.last = blocks.start == 0, blocks.stop == n_blocks
        self.tok = nn.Embedding(VOCAB, DIM) if self.first else None
        self.layers = nn.ModuleDict({str(k): nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh()) for k in blocks})
        self.norm = nn.LayerNorm(DIM) if self.last else None
        self.out = nn.Linear(DIM, VOCAB) if self.last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok is not None:
            x = self.tok(x)
        for layer in self.layers.values():
            x = x + layer(x)
        if self.out is not None:
            x = self.out(self.norm(x))
        return x


def make_view(mod: TinyStage, stage: int, n_blocks: int) -> StageView:
    params = dict(mod.named_parameters())
    layer_of, layer_modules = {}, {}
    for name in params:
        head = name.split(".")[0]
        if head == "tok":
            layer_of[name] = 0
        elif head == "layers":
            layer_of[name] = int(name.split(".")[1]) + 1
        else:
            layer_of[name] = n_blocks + 1
    if mod.tok is not None:
        layer_modules[0] = mod.tok
    for k, m in mod.layers.items():
        layer_modules[int(k) + 1] = m
    if mod.out is not None:
        layer_modules[n_blocks + 1] = mod.out
    return StageView(
        stage=stage,
        module=mod,
        params=params,
        layer_of=layer_of,
        layer_modules=layer_modules,
        is_first=mod.first,
        is_last=mod.last,
        anchor="tok.weight" if mod.first else None,
    )


def make_stages(n_blocks: int = 4, splits: tuple[int, ...] = ()) -> list[StageView]:
    """Stages over blocks cut at ``splits`` (e.g. (2,) -> blocks 0-1 and 2-3)."""
    cuts = [0, *splits, n_blocks]
    return [make_view(TinyStage(range(a, b), n_blocks), i, n_blocks) for i, (a, b) in enumerate(zip(cuts, cuts[1:]))]


def make_cfg(**sections) -> SimpleNamespace:
    cfg = SimpleNamespace(
        seed=0,
        warmup_steps=0,
        advanced=SimpleNamespace(resample_every=1),
        apf=APFConfig(),
        autofreeze=AutoFreezeConfig(),
        egeria=EgeriaConfig(),
        smartpipe=SmartPipeConfig(),
        random=RandomConfig(),
    )
    for k, v in sections.items():
        setattr(cfg, k, v)
    return cfg


def same_set_for_every_microbatch(m, stages, steps=range(1, 41), n_mb: int = 4) -> bool:
    """Whether the method freezes one set per (step, stage), the same for every microbatch: what the
    removed ``step_level`` flag declared, checked on the method's answers instead."""
    return all(len({m.frozen_tensors(t, v.stage, mb) for mb in range(n_mb)}) == 1 for t in steps for v in stages)


def make_ctx(
    stages: list[StageView],
    all_gather=None,
    lr=lambda: 1.0,
    total_steps: int = 100,
    num_stages: int | None = None,
    **fields,
) -> MethodContext:
    return MethodContext(
        stages=stages,
        num_stages=num_stages or len(stages),
        num_microbatches=2,
        schedule="GPipe",
        total_steps=total_steps,
        all_gather=all_gather or (lambda o: [o]),
        get_lr=lr,
        **fields,
    )


def set_layer_grads(view: StageView, per_layer: dict[int, torch.Tensor | None]) -> None:
    """Give every parameter of each listed layer the gradient ``value * ones`` (None clears it)."""
    for name, p in view.params.items():
        layer = view.layer_of[name]
        if layer in per_layer:
            v = per_layer[layer]
            p.grad = None if v is None else torch.full_like(p, float(v))


class LockStep:
    """Simulates ``n`` pipeline ranks in one process: ``gather(r)`` is rank r's all_gather (every rank
    gets every rank's object, in rank order, as torch.distributed's all_gather_object), and ``run``
    calls one function per rank in parallel threads, so the gathers meet like real collectives."""

    def __init__(self, n: int):
        self.n = n
        self._barrier = threading.Barrier(n, timeout=10)
        self._slots: list = [None] * n
        self.calls = 0

    def gather(self, rank: int):
        def all_gather(obj):
            self._slots[rank] = obj
            self._barrier.wait()
            out = list(self._slots)
            self._barrier.wait()
            if rank == 0:
                self.calls += 1
            return out

        return all_gather

    def run(self, *fns) -> list:
        results, errors = [None] * len(fns), []

        def go(i, f):
            try:
                results[i] = f()
            except BaseException as e:
                errors.append(e)
                self._barrier.abort()

        threads = [threading.Thread(target=go, args=(i, f)) for i, f in enumerate(fns)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results


# ---------------------------------------------------------------------------------------------------
# random (fixed ratio)


def test_random_ratio_statistics_and_exact_counts():
    stages = make_stages(4, (2,))
    m = RandomFixed(make_cfg(random=RandomConfig(ratio=0.3), warmup_steps=5), make_ctx(stages))
    assert m.name == "random" and not same_set_for_every_microbatch(m, stages)
    for v in stages:
        names = freezable_names(v)
        n = len(names)
        counts, hits = [], {x: 0 for x in names}
        trials = 0
        for step in range(6, 406):
            for mb in range(2):
                s = m.frozen_tensors(step, v.stage, mb)
                assert v.anchor not in s and s <= set(names)
                assert len(s) in (math.floor(0.3 * n), math.ceil(0.3 * n))
                counts.append(len(s))
                for x in s:
                    hits[x] += 1
                trials += 1
        assert abs(sum(counts) / len(counts) - 0.3 * n) < 0.05 * n
        # every tensor is frozen with probability ~ratio (uniform choice)
        for x, h in hits.items():
            assert abs(h / trials - 0.3) < 0.08, (x, h / trials)


def test_random_warmup_reproducible_and_per_microbatch():
    stages = make_stages(4)
    cfg = make_cfg(random=RandomConfig(ratio=0.5), warmup_steps=3)
    a, b = RandomFixed(cfg, make_ctx(stages)), RandomFixed(cfg, make_ctx(stages))
    assert all(a.frozen_tensors(s, 0, mb) == frozenset() for s in (1, 2, 3) for mb in (0, 1))
    assert a.phase(3) == "warmup" and a.phase(4) == "active"
    draws = [a.frozen_tensors(s, 0, mb) for s in range(4, 30) for mb in (0, 1)]
    assert draws == [b.frozen_tensors(s, 0, mb) for s in range(4, 30) for mb in (0, 1)]
    assert len(set(draws)) > 5  # fresh draws per (step, microbatch), not one fixed set


def test_random_ratio_bounds():
    stages = make_stages(2)
    full = RandomFixed(make_cfg(random=RandomConfig(ratio=1.0)), make_ctx(stages))
    assert full.frozen_tensors(1, 0, 0) == frozenset(freezable_names(stages[0]))
    none = RandomFixed(make_cfg(random=RandomConfig(ratio=0.0)), make_ctx(stages))
    assert none.frozen_tensors(1, 0, 0) == frozenset()
    # the rule lives with the config section (the runtime builds methods from validated configs only)
    with pytest.raises(FreezeConfigError, match=r"\[freeze.random\] ratio = 1.5: must lie in \[0, 1\]"):
        RandomConfig(ratio=1.5).validate()


# random, per stage (the matched control)
def test_random_per_stage_follows_timelyfreezes_phases_and_masks():
    """With per-stage shares the control runs TimelyFreeze's phases and draws TimelyFreeze's masks: the same
    frozen set as a TimelyFreeze method whose plan gives every action of stage s the share of stage s."""
    from timelyfreeze.methods.timely import TimelyFreezeMethod

    stages = make_stages(2)
    phases = Phases(warmup_end=2, upper_end=4, lower_end=6, ramp_end=9)
    shares = [0.3, 0.7]
    ctx = make_ctx(stages, num_stages=2, phases=phases)
    control = RandomFixed(make_cfg(random=RandomConfig(ratio_per_stage=shares)), ctx)
    timely = TimelyFreezeMethod(make_cfg(), ctx)
    timely.set_plan({f"{s}B{m}": shares[s] for s in range(2) for m in range(2)})
    assert not control.needs_plan(6) and control.monitor_phases == ()
    for step in range(1, 14):
        assert control.phase(step) == phases.phase(step)
        for v in stages:
            for m in range(2):
                assert control.frozen_tensors(step, v.stage, m) == timely.frozen_tensors(step, v.stage, m)
    assert control.steady_phases({"warmup", "upper", "lower", "progressive", "stable"}) == ("stable",)
    assert control.summary() == {"ratio_per_stage": shares, "matched": None}


def test_random_per_stage_settings_are_checked(tmp_path):
    with pytest.raises(FreezeConfigError, match=r"\[freeze.random\] ratio_per_stage\[1\] = 1.5: must lie in \[0, 1\]"):
        RandomConfig(ratio_per_stage=[0.2, 1.5]).validate()
    with pytest.raises(FreezeConfigError, match=r"matched = .*: give either matched or ratio_per_stage"):
        RandomConfig(ratio_per_stage=[0.2], matched=str(tmp_path)).validate()
    with pytest.raises(FreezeConfigError, match=r"matched = .*: no TimelyFreeze trace there"):
        RandomConfig(matched=str(tmp_path)).validate()
    stages = make_stages(2)
    ctx = make_ctx(stages, num_stages=2, phases=Phases(warmup_end=2, upper_end=4, lower_end=6, ramp_end=9))
    with pytest.raises(FreezeConfigError, match=r"ratio_per_stage: 3 stage shares for a pipeline of 2 stages"):
        RandomFixed(make_cfg(random=RandomConfig(ratio_per_stage=[0.1, 0.2, 0.3])), ctx)


def test_random_matched_reads_the_runs_stable_per_stage_shares():
    """``matched``: each stage's mean realised ratio over its backward actions in the stable phase of the run (a
    committed TimelyFreeze job of the comparison)."""
    from pathlib import Path

    from planner.trace.load import load_trace, phase_stage_ratios

    run = (
        Path(__file__).resolve().parents[1] / "docs/results/comparison/jobs/1F1B__timelyfreeze__r_max=0.8__seed=0/dump"
    )
    trace = load_trace(run / "timelyfreeze" / "trace")
    expected = phase_stage_ratios(trace, "stable")
    stable = [r for r in trace.records if r.phase == "stable" and r.action[1] == "B" and r.action[0] == "1"]
    assert expected[1] == pytest.approx(sum(r.freeze_ratio for r in stable) / len(stable))
    assert len(expected) == 2 and all(0 < x <= 0.8 + 1e-6 for x in expected)  # the plan's budget, r_max 0.8
    RandomConfig(matched=str(run)).validate()
    ctx = make_ctx(make_stages(2), num_stages=2, phases=Phases(warmup_end=2, upper_end=4, lower_end=6, ramp_end=9))
    m = RandomFixed(make_cfg(random=RandomConfig(matched=str(run))), ctx)
    assert m.shares == expected


def test_random_matched_reads_a_packed_trace(tmp_path):
    """The matched run's trace packed into trace.tar.gz (``python -m planner pack``) gives the same shares as
    its folder (the committed trace, packed, unpacked into a folder of its own here)."""
    from pathlib import Path

    from planner.trace.archive import pack_trace, unpack_trace

    src = Path(__file__).resolve().parents[1] / "docs/results/comparison/jobs/1F1B__timelyfreeze__r_max=0.8__seed=0"
    ctx = make_ctx(make_stages(2), num_stages=2, phases=Phases(warmup_end=2, upper_end=4, lower_end=6, ramp_end=9))
    out = tmp_path / "dump" / "timelyfreeze"
    unpack_trace(src / "dump" / "timelyfreeze" / "trace.tar.gz", out / "trace")
    expected = RandomFixed(make_cfg(random=RandomConfig(matched=str(tmp_path / "dump"))), ctx).shares
    assert RandomFixed(make_cfg(random=RandomConfig(matched=str(src / "dump"))), ctx).shares == expected
    pack_trace(out / "trace")
    assert not (out / "trace").exists()
    for matched in (tmp_path / "dump", out):
        RandomConfig(matched=str(matched)).validate()
        assert RandomFixed(make_cfg(random=RandomConfig(matched=str(matched))), ctx).shares == expected
