"""Freezing under PP x FSDP2 with real ranks: ``torchrun --nproc_per_node=4 tests/fsdp_exact_job.py OUT SCHEDULE AC``.

Four gloo ranks: two pipeline ranks x two FSDP2 shards (``fully_shard`` per block and per stage, as
TorchTitan does, gradient divide factor 1.0 and the CPU shim's plain-SUM reduce-scatter). Each
data-parallel replica trains on its own microbatches; both replicas freeze by the runtime's freezing
hook with the same masks (a random subset per stage and microbatch, drawn from a seed, plus one tensor
frozen in *every* microbatch). After one schedule step every rank checks its stages' gradients
(gathered from the shards) against a single-process reference: per-microbatch autograd on an unsplit,
unsharded copy of the model, summed over the microbatches that did not freeze the tensor, in the order
the stage ran its backward, then over the two replicas. Two replicas make the comparison exact: the
reduce-scatter adds two numbers and float addition of two terms does not depend on their order. Rank 0
writes ``OUT`` (JSON) with the outcome; any mismatch exits 1.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from timelyfreeze import cpu_shims

cpu_shims.apply_if_needed()

from test_freezing_exact import N_MB, SEQ, BackwardOrder, RandomPerAction, V, build_parts, loss_fn  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.pipelining import PipelineStage  # noqa: E402
from torch.distributed.pipelining.schedules import get_schedule_class  # noqa: E402

from timelyfreeze import stage_hooks  # noqa: E402
from timelyfreeze.freezing import FreezingHook  # noqa: E402
from timelyfreeze.stage_layout import build_stage_views  # noqa: E402

PP, DP = 2, 2


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


def main() -> None:
    out_path, schedule, ac = sys.argv[1], sys.argv[2], sys.argv[3] == "ac"
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (PP, DP), mesh_dim_names=("pp", "dp"))
    pp_rank, dp_rank = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
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
        part = parts[s]
        for blk in part.layers.values():
            fully_shard(blk, mesh=mesh["dp"], reshard_after_forward=False)
        fully_shard(part, mesh=mesh["dp"], reshard_after_forward=False)
        for m in part.modules():  # as TorchTitan's disable_fsdp_gradient_division
            if hasattr(m, "set_gradient_divide_factor"):
                m.set_gradient_divide_factor(1.0)
        stages.append(PipelineStage(part, s, n_stages, torch.device("cpu"), group=mesh["pp"].get_group()))
    switched = cpu_shims.fsdp_sum_reductions([parts[s] for s in local])
    cls = get_schedule_class(schedule)
    sched = cls(stages if multi else stages[0], n_microbatches=N_MB, loss_fn=loss_fn, scale_grads=False)
    views = build_stage_views(stages, n_layers=2 * n_stages)
    method = (
        WithAlwaysFrozen(views, 0.5) if os.environ.get("EXACT_JOB_FREEZE", "1") == "1" else RandomPerAction(views, 0.0)
    )
    hook = FreezingHook(views, method, lambda: 1)
    order = BackwardOrder()
    for st in stages:
        stage_hooks.install(st, [hook, order])
    x, y = data(dp_rank)
    sched.step(x, target=y)

    # every replica's backward order and masks, to build the reference for both
    orders = [None] * dist.get_world_size()
    dist.all_gather_object(
        orders, (pp_rank, dp_rank, order.order, {f"{s}/{m}": sorted(v) for (s, m), v in method.chosen.items()})
    )
    problems, checked, frozen_everywhere = [], 0, 0
    masks_by_replica: dict[int, dict] = {}
    order_by_replica: dict[int, dict] = {}
    for pr, dr, od, ch in orders:
        masks_by_replica.setdefault(dr, {}).update(ch)
        order_by_replica.setdefault(dr, {}).update(od)
    if masks_by_replica[0] != masks_by_replica[1]:
        problems.append("the replicas drew different masks")
    per_mb = {}
    flat = [(s, n) for s, r in enumerate(reference) for n, _ in r.named_parameters()]
    params = [p for r in reference for p in r.parameters()]
    for d in range(DP):
        xd, yd = data(d)
        for m in range(N_MB):
            h = xd[m : m + 1]
            for r in reference:
                h = r(h)
            per_mb[(d, m)] = torch.autograd.grad(loss_fn(h, yd[m : m + 1]), params)
    for view in views:
        s = view.stage
        for n, p in view.params.items():
            idx = flat.index((s, n.replace("_checkpoint_wrapped_module.", "")))
            expected = None
            for d in range(DP):
                g = None
                for m in order_by_replica[d][s]:
                    if n in masks_by_replica[d][f"{s}/{m}"] and n != view.anchor:
                        continue
                    g = per_mb[(d, m)][idx].clone() if g is None else g + per_mb[(d, m)][idx]
                if g is not None:
                    expected = g if expected is None else expected + g
            got = None if p.grad is None else p.grad.full_tensor()
            checked += 1
            if expected is None:
                frozen_everywhere += 1
                if got is not None:
                    problems.append(f"stage {s} {n}: frozen in every microbatch but has a gradient")
            elif got is None:
                problems.append(f"stage {s} {n}: lost its gradient")
            elif not torch.equal(got, expected):
                problems.append(
                    f"stage {s} {n}: differs by {(got - expected).abs().max().item():.3e} "
                    f"(norms {got.norm().item():.4f} vs {expected.norm().item():.4f})"
                )
    all_problems = [None] * dist.get_world_size()
    dist.all_gather_object(all_problems, (problems, checked, frozen_everywhere, switched))
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(
                {
                    "problems": [p for ps, *_ in all_problems for p in ps],
                    "checked": sum(c for _, c, _, _ in all_problems),
                    "frozen_everywhere": sum(z for _, _, z, _ in all_problems),
                    "fsdp_modules_switched_to_sum": sum(w for *_, w in all_problems),
                },
                f,
            )
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(1 if any(ps for ps, *_ in all_problems) else 0)


if __name__ == "__main__":
    main()
