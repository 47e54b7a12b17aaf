"""Freezing units and torch.compile, without launching a job: ``[freeze] unit`` resolution and its refusals,
the block units of a stage, sampling whole units, and the mesh release that replaced the object scan."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest
import torch

from tests.single_rank import process_group  # noqa: F401 (module-scoped, autouse)
from timelyfreeze.config.freeze import Freeze, FreezeConfigError, resolve_unit, validate
from timelyfreeze.config.job_checks import COMPILE_REFUSED_SCHEDULES, check_compile_schedule
from timelyfreeze.hooks.stage_layout import choose_anchor, freeze_units, layer_index
from timelyfreeze.job.stage_view import StageView
from timelyfreeze.methods.common import Units
from timelyfreeze.methods.registry import METHODS
from timelyfreeze.methods.selection import action_generator, balanced_subset

COMPILED = SimpleNamespace(enable=True, components=["model", "loss"])
EAGER = SimpleNamespace(enable=False, components=["model", "loss"])


def unit_of(compile_cfg, warmup_end: int = 3, **kw) -> str:
    return resolve_unit(Freeze(**kw), compile_cfg, warmup_end=warmup_end)


def test_auto_is_block_under_compile_and_tensor_without():
    assert unit_of(compile_cfg=COMPILED) == "block"
    assert unit_of(compile_cfg=EAGER) == "tensor"
    assert unit_of(compile_cfg=EAGER, unit="block") == "block"
    # compile that leaves the model alone (only the loss) compiles no block
    assert unit_of(compile_cfg=SimpleNamespace(enable=True, components=["loss"])) == "tensor"


def test_tensor_units_under_compile_are_refused_naming_both_fields():
    with pytest.raises(FreezeConfigError, match=r"\[freeze\] unit = 'tensor' with \[compile\] enable = true"):
        unit_of(compile_cfg=COMPILED, unit="tensor")
    with pytest.raises(FreezeConfigError, match=r"\[freeze\] unit = 'layer': choose one of auto, tensor, block"):
        validate(Freeze(unit="layer"), total_steps=40, lr_warmup_steps=10)


@pytest.mark.parametrize("method", [m for m, spec in METHODS.items() if not spec.block_units])
def test_per_tensor_methods_cannot_freeze_blocks(method):
    assert unit_of(compile_cfg=EAGER, method=method) == "tensor"
    with pytest.raises(FreezeConfigError, match=rf"method = '{method}' decides per tensor.*required under \[compile\]"):
        unit_of(compile_cfg=COMPILED, method=method)


def test_compile_needs_a_warmup_that_compiles_both_variants():
    with pytest.raises(FreezeConfigError, match=r"warmup_steps = 1 with \[compile\] enable = true"):
        unit_of(compile_cfg=COMPILED, warmup_end=1)
    assert unit_of(compile_cfg=COMPILED, warmup_end=2) == "block"
    assert unit_of(compile_cfg=COMPILED, warmup_end=0, method="random") == "block"  # no monitoring window


@pytest.mark.parametrize("schedule", COMPILE_REFUSED_SCHEDULES)
def test_split_backward_schedules_are_refused_under_compile_in_one_line(schedule):
    par = SimpleNamespace(pipeline_parallel_schedule=schedule, pipeline_parallel_degree=2)
    check_compile_schedule(par, EAGER)
    with pytest.raises(FreezeConfigError, match=rf"schedule = '{schedule}' with \[compile\] enable = true: torch 2.13"):
        check_compile_schedule(par, COMPILED)
    check_compile_schedule(SimpleNamespace(pipeline_parallel_schedule="1F1B", pipeline_parallel_degree=2), COMPILED)


def _llama_like(first: bool, last: bool, blocks: list[int], compiled: bool) -> dict[str, torch.nn.Parameter]:
    mid = "._orig_mod" if compiled else ""
    names = ["tok_embeddings.weight"] if first else []
    for k in blocks:
        names += [
            f"layers.{k}{mid}.attention_norm.weight",
            f"layers.{k}{mid}.attention.wq.weight",
            f"layers.{k}{mid}.feed_forward.w1.weight",
        ]
    names += ["norm.weight", "output.weight"] if last else []
    size = {"tok_embeddings": 64, "attention_norm": 4, "wq": 16, "w1": 32, "norm": 4, "output": 64}
    return {n: torch.nn.Parameter(torch.zeros(next(v for k, v in size.items() if f"{k}." in n + "."))) for n in names}


@pytest.mark.parametrize("compiled", [False, True])
def test_block_units_follow_the_modules_and_the_first_block_takes_the_embedding(compiled):
    params = _llama_like(True, False, [0, 1, 2], compiled)
    layer_of = {n: layer_index(n, 6) for n in params}
    anchor = choose_anchor(params, layer_of)
    assert anchor.endswith("layers.0" + ("._orig_mod" if compiled else "") + ".attention_norm.weight")
    units = freeze_units(params, layer_of, anchor, "block")
    assert list(units) == ["tok_embeddings+layers.0", "layers.1", "layers.2"]
    assert units["tok_embeddings+layers.0"][0] == "tok_embeddings.weight"
    assert anchor not in {t for ts in units.values() for t in ts}
    assert sorted(t for ts in units.values() for t in ts) == sorted(set(params) - {anchor})
    last = _llama_like(False, True, [3, 4, 5], compiled)
    units = freeze_units(last, {n: layer_index(n, 6) for n in last}, None, "block")
    assert list(units) == ["layers.3", "layers.4", "layers.5", "norm", "output"]
    tensors = freeze_units(last, {n: layer_index(n, 6) for n in last}, None, "tensor")
    assert tensors == {n: (n,) for n in last}


def test_sampling_whole_units_meets_the_ratio_in_expectation():
    """TimelyFreeze's draw over block units: every element is frozen with probability r (the unit's), so the
    mean realised element share over many draws is r; every draw is a union of whole units."""
    params = _llama_like(False, True, list(range(8)), False)
    view = StageView(
        stage=1,
        module=torch.nn.Module(),
        params=params,
        layer_of={n: layer_index(n, 8) for n in params},
        layer_modules={},
        is_first=False,
        is_last=True,
        units=freeze_units(params, {n: layer_index(n, 8) for n in params}, None, "block"),
    )
    units = Units(view)
    total = sum(p.numel() for p in params.values())
    for r in (0.25, 0.5, 0.8):
        shares = []
        for step in range(2000):
            chosen = balanced_subset(units.names, units.numels, r, action_generator(0, step, 1, 0))
            frozen = units.tensors(chosen)
            assert all(set(units.members[u]) <= frozen for u in chosen)
            shares.append(sum(params[t].numel() for t in frozen) / total)
        mean = sum(shares) / len(shares)
        sd = (sum((x - mean) ** 2 for x in shares) / len(shares)) ** 0.5
        # the mean is exactly r in expectation; 6 standard errors leave a 1e-9 chance of a false failure
        assert abs(mean - r) <= 6 * sd / len(shares) ** 0.5 + 1e-12


def test_tensor_units_draw_what_the_per_tensor_draw_drew():
    """With ``unit = "tensor"`` the methods' draws are the ones they made before units existed."""
    params = _llama_like(False, True, [0, 1], False)
    view = StageView(
        stage=1,
        module=torch.nn.Module(),
        params=params,
        layer_of={n: 1 for n in params},
        layer_modules={},
        is_first=False,
        is_last=True,
    )
    units = Units(view)
    names = list(params)
    numels = [p.numel() for p in params.values()]
    for step in range(50):
        g1, g2 = action_generator(3, step, 1, 2), action_generator(3, step, 1, 2)
        assert units.tensors(balanced_subset(units.names, units.numels, 0.4, g1)) == balanced_subset(
            names, numels, 0.4, g2
        )


def test_mesh_release_reaches_every_mesh_torchtitan_built():
    """``parallel_meshes`` + ``release_mesh_process_groups`` clear the process-group registry of every live
    ``DeviceMesh`` (what the old ``gc.get_objects()`` scan reached), without scanning foreign objects."""
    from torch.distributed.device_mesh import DeviceMesh
    from torchtitan.distributed import ParallelDims

    from timelyfreeze.titan.torch_fixes import parallel_meshes, release_mesh_process_groups

    before = {id(o) for o in gc.get_objects() if type(o) is DeviceMesh}
    pd = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)
    pd.build_mesh()
    assert release_mesh_process_groups(parallel_meshes(pd)) > 0
    live = [o for o in gc.get_objects() if type(o) is DeviceMesh and id(o) not in before]
    assert live and all(not m._pg_registry for m in live)
