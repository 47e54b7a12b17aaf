"""Freezing under PP x data / tensor parallelism with real ranks, gradients checked against one process:
``torchrun --nproc_per_node=N tests/parallel_exact_job.py OUT CASE [CASE ...]``, ``CASE`` =
``LAYOUT:SCHEDULE:AC`` (``ac`` or ``noac``); every case of one launch needs the same ``N``.

Layouts (two pipeline ranks each):

- ``fsdp`` (4 ranks): PP 2 x FSDP2 2, two data-parallel replicas.
- ``hsdp`` (8 ranks): PP 2 x replicate 2 x shard 2 (FSDP2 on a 2-D mesh), four replicas.
- ``tp`` (4 ranks): PP 2 x TP 2 (each block's ``w1`` column-wise, ``w2`` row-wise, as TorchTitan's llama
  plan does for its feed-forward), one replica.

FSDP2 is applied per block and per stage, as TorchTitan does, gradient divide factor 1.0 and the CPU shim's
plain-SUM reductions. Each data-parallel replica trains on its own microbatches; every replica freezes by
the runtime's freezing hook with the same masks (a random subset per stage and microbatch, drawn from a
seed, plus one tensor frozen in *every* microbatch). After one schedule step every rank checks its stages'
gradients (gathered from shards) against a single-process reference: per-microbatch autograd on an
unsplit, unsharded copy of the model, summed over the microbatches that did not freeze the tensor, in the
order the stage ran its backward, then over the replicas in the order the reductions add them.

- ``fsdp``, ``hsdp``: exact (``torch.equal``). The reduce-scatter adds two numbers; HSDP then all-reduces two
  such sums across the replicate dimension, ``(g00 + g01) + (g10 + g11)``, which the reference adds in the
  same grouping; float addition of two terms does not depend on their order.
- ``tp``: within ``TP_RTOL`` / ``TP_ATOL``. A row-wise ``w2`` adds two partial matrix products (each rank
  has half of the inner dimension), and so does the input gradient of the column-wise ``w1``; the reference
  computes each as one product, whose dot products BLAS blocks differently. Rounding differs by a few ulps
  and passes on to every gradient upstream; a frozen tensor must still have no gradient at all.

Rank 0 writes ``OUT`` (JSON: per case its problems and counts); any problem exits 1.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from timelyfreeze.titan import cpu_shims

cpu_shims.apply_if_needed()

from test_freezing_exact import N_MB, SEQ, BackwardOrder, RandomPerAction, V, build_parts, loss_fn  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.pipelining import PipelineStage  # noqa: E402
from torch.distributed.pipelining.schedules import get_schedule_class  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module  # noqa: E402

from timelyfreeze.hooks import stage_hooks  # noqa: E402
from timelyfreeze.hooks.freezing import FreezingHook  # noqa: E402
from timelyfreeze.hooks.stage_layout import build_stage_views  # noqa: E402

PP = 2
TP_RTOL, TP_ATOL = 1e-4, 1e-6
LAYOUTS = {
    # mesh shape, dimension names, (replica groups: the reduction's grouping of replica indices)
    "fsdp": ((PP, 2), ("pp", "dp"), [[0, 1]]),
    "hsdp": ((PP, 2, 2), ("pp", "rep", "shard"), [[0, 1], [2, 3]]),
    "tp": ((PP, 2), ("pp", "tp"), [[0]]),
}


class WithAlwaysFrozen(RandomPerAction):
    """A random half of each stage's tensors per microbatch, plus its last tensor in every microbatch."""

    def __init__(self, views, ratio):
        super().__init__(views, ratio)
        self.always = {v.stage: self.names[v.stage][-1] for v in views}

    def frozen_tensors(self, step, stage, microbatch, accum=0):
        s = super().frozen_tensors(step, stage, microbatch, accum) | {self.always[stage]}
        self.chosen[(stage, microbatch)] = s
        return s


def data(replica: int):
    g = torch.Generator().manual_seed(1000 + replica)
    return torch.randint(0, V, (N_MB, SEQ), generator=g), torch.randint(0, V, (N_MB, SEQ), generator=g)


def replica_index(layout: str, mesh) -> int:
    if layout == "fsdp":
        return mesh["dp"].get_local_rank()
    if layout == "hsdp":
        return 2 * mesh["rep"].get_local_rank() + mesh["shard"].get_local_rank()
    return 0


def parallelize(part, layout: str, mesh) -> None:
    """Shard one stage's module as TorchTitan does for ``layout``."""
    if layout == "tp":
        for blk in part.layers.values():
            inner = getattr(blk, "_checkpoint_wrapped_module", blk)
            parallelize_module(inner, mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        return
    dp = mesh["dp"] if layout == "fsdp" else mesh["rep", "shard"]
    for blk in part.layers.values():
        fully_shard(blk, mesh=dp, reshard_after_forward=False)
    fully_shard(part, mesh=dp, reshard_after_forward=False)
    for m in part.modules():  # as TorchTitan's disable_fsdp_gradient_division
        if hasattr(m, "set_gradient_divide_factor"):
            m.set_gradient_divide_factor(1.0)


def per_microbatch_grads(reference, replicas) -> dict:
    """``(replica, microbatch)`` -> the unsplit model's gradients of that microbatch alone."""
    params = [p for r in reference for p in r.parameters()]
    per_mb = {}
    for d in replicas:
        xd, yd = data(d)
        for m in range(N_MB):
            h = xd[m : m + 1]
            for r in reference:
                h = r(h)
            per_mb[(d, m)] = torch.autograd.grad(loss_fn(h, yd[m : m + 1]), params)
    return per_mb


def expected_grads(reference, per_mb: dict, layout: str, masks: dict, orders: dict, view) -> dict:
    """The single-process gradient of each of ``view``'s tensors (None: frozen in every microbatch)."""
    flat = [(s, n) for s, r in enumerate(reference) for n, _ in r.named_parameters()]
    s, out = view.stage, {}
    for n in view.params:
        idx = flat.index((s, n.replace("_checkpoint_wrapped_module.", "")))
        total = None
        for group in LAYOUTS[layout][2]:
            group_sum = None
            for d in group:
                g = None
                for m in orders[d][s]:
                    if n in masks[d][f"{s}/{m}"] and n != view.anchor:
                        continue
                    g = per_mb[(d, m)][idx].clone() if g is None else g + per_mb[(d, m)][idx]
                if g is not None:
                    group_sum = g if group_sum is None else group_sum + g
            if group_sum is not None:
                total = group_sum if total is None else total + group_sum
        out[n] = total
    return out


def build_stages(layout: str, schedule: str, ac: bool, mesh):
    pp_rank = mesh["pp"].get_local_rank()
    multi = schedule in ("Interleaved1F1B", "ZBVZeroBubble")
    n_stages = 2 * PP if multi else PP
    if schedule == "ZBVZeroBubble":
        local = [pp_rank, n_stages - 1 - pp_rank]
    elif multi:
        local = [pp_rank, pp_rank + PP]
    else:
        local = [pp_rank]
    parts = build_parts(n_stages, ac)  # same seed: same initial weights on every rank
    reference = build_parts(n_stages, ac=False)
    for r, p in zip(reference, parts):
        r.load_state_dict({k.replace("_checkpoint_wrapped_module.", ""): v for k, v in p.state_dict().items()})
    stages = []
    for s in local:
        parallelize(parts[s], layout, mesh)
        stages.append(PipelineStage(parts[s], s, n_stages, torch.device("cpu"), group=mesh["pp"].get_group()))
    switched = cpu_shims.fsdp_sum_reductions([parts[s] for s in local])
    sched = get_schedule_class(schedule)(
        stages if multi else stages[0], n_microbatches=N_MB, loss_fn=loss_fn, scale_grads=False
    )
    return stages, sched, reference, n_stages, switched


def run_case(case: str) -> dict:
    """One schedule step of ``case`` and its check on this rank."""
    layout, schedule, ac = case.split(":")
    shape, names, _ = LAYOUTS[layout]
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    stages, sched, reference, n_stages, switched = build_stages(layout, schedule, ac == "ac", mesh)
    views = build_stage_views(stages, n_layers=2 * n_stages)
    method = WithAlwaysFrozen(views, 0.5)
    order = BackwardOrder()
    for st in stages:
        stage_hooks.install(st, [FreezingHook(views, method, lambda: 1, num_microbatches=N_MB), order])
    replica = replica_index(layout, mesh)
    x, y = data(replica)
    sched.step(x, target=y)
    # every replica's backward order and masks, to build the reference for all of them
    gathered = [None] * dist.get_world_size()
    masks_of = {f"{s}/{m}": sorted(v) for (s, m), v in method.chosen.items()}
    dist.all_gather_object(gathered, (replica, order.order, masks_of))
    masks: dict[int, dict] = {}
    orders: dict[int, dict] = {}
    for d, od, ch in gathered:
        masks.setdefault(d, {}).update(ch)
        orders.setdefault(d, {}).update(od)
    problems = [] if all(masks[d] == masks[0] for d in masks) else ["the replicas drew different masks"]
    checked = frozen_everywhere = dtensors = 0
    max_diff = 0.0
    per_mb = per_microbatch_grads(reference, sorted(masks))
    for view in views:
        expected = expected_grads(reference, per_mb, layout, masks, orders, view)
        for n, p in view.params.items():
            checked += 1
            dtensors += isinstance(p, DTensor)
            got = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            want, where = expected[n], f"{case} stage {view.stage} {n}"
            if want is None:
                frozen_everywhere += 1
                if got is not None:
                    problems.append(f"{where}: frozen in every microbatch but has a gradient")
            elif got is None:
                problems.append(f"{where}: lost its gradient")
            else:
                max_diff = max(max_diff, (got - want).abs().max().item())
                same = torch.allclose(got, want, TP_RTOL, TP_ATOL) if layout == "tp" else torch.equal(got, want)
                if not same:
                    problems.append(f"{where}: differs by {(got - want).abs().max().item():.3e}")
    return {
        "problems": problems,
        "checked": checked,
        "frozen_everywhere": frozen_everywhere,
        "fsdp_modules_switched_to_sum": switched,
        "dtensor_params": dtensors,
        "max_abs_diff": max_diff,
    }


def main() -> None:
    out_path, cases = sys.argv[1], sys.argv[2:]
    dist.init_process_group("gloo")
    mine = {case: run_case(case) for case in cases}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    result = {}
    for case in cases:
        per_rank = [r[case] for r in everyone]
        result[case] = {k: sum(r[k] for r in per_rank) for k in per_rank[0] if k not in ("problems", "max_abs_diff")}
        result[case]["problems"] = [p for r in per_rank for p in r["problems"]]
        result[case]["max_abs_diff"] = max(r["max_abs_diff"] for r in per_rank)
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(1 if any(r["problems"] for r in result.values()) else 0)


if __name__ == "__main__":
    main()
