"""The minimal patches TorchTitan 0.2.2 + torch 2.13 need on a host without CUDA.

Applied only when CUDA is absent (``apply_if_needed``); on CUDA hosts nothing is touched.
Must run before ``torchtitan`` is imported: TorchTitan decides its device type at import time.

1. ``torch._utils._get_available_device_type`` -> ``"cpu"``: TorchTitan falls back to ``"cuda"``
   when no accelerator is found, so device, device module (``torch.cpu``) and backend (gloo, from
   ``Backend.default_device_backend_map``) come out right only with this.
2. ``torch.cpu`` lacks the CUDA memory/properties API that TorchTitan's DeviceMemoryMonitor calls
   (``get_device_name``, ``get_device_properties``, ``reset_peak_memory_stats``, ``empty_cache``,
   ``memory_stats``), and ``current_device()`` returns a string where ``barrier(device_ids=[...])``
   needs an int.
3. ``fsdp_sum_reductions`` (called by the trainer once the model is built): TorchTitan sets FSDP2's
   gradient divide factor to 1.0 (it scales by the global token count itself), and FSDP2 then
   reduce-scatters with ``ReduceOp.PREMUL_SUM(1.0)``, which gloo refuses ("Cannot use
   ReduceOp.PREMUL_SUM with Gloo"). FSDP2's own switch ``set_force_sum_reduction_for_comms(True)``
   makes it a plain SUM followed by a division by the same factor (1.0): the same numbers.
4. ``pin_cpu_cores`` (called by the trainer before TorchTitan starts its process groups, ``[freeze]
   cpu_pinning``): the local ranks of a host otherwise float over all its cores, so two ranks can share
   one core while another idles and every action's time depends on the scheduler; with at least as
   many cores as local ranks, each rank (every thread of it, and every thread it starts later) gets its
   own equal, contiguous share of the cores this process may use.
5. ``no_overlap_callback`` (called by the trainer before TorchTitan builds the schedule): TorchTitan 0.2.2
   registers its expert-parallel overlap callback for every DualPipeV schedule when ``[parallelism]
   pipeline_parallel_expert_parallel_overlap`` is true (its default; the registration does not look at
   expert parallelism). The callback asks for the accelerator's stream,
   ``torch.accelerator.current_stream("cpu")``, which raises "Accelerator expected" at the first
   ``OVERLAP_F_B`` action (and ``torch.cpu`` has no ``set_stream``, which its backward thread calls next).
   On a CPU host the trainer turns that setting off, so torch runs each pair itself: the forward, then
   the backward, in one thread. What the callback adds is coordination with expert-parallel
   communication (MoE models on GPUs), nothing a CPU run uses.
"""

from __future__ import annotations

import os
import types

_APPLIED = False


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def apply_if_needed() -> bool:
    """Patch torch for a CPU-only host. Returns True if the shims are (now) in effect."""
    global _APPLIED
    if _APPLIED:
        return True
    if cuda_available():
        return False
    import torch
    import torch._utils

    torch._utils._get_available_device_type = lambda: "cpu"
    cpu = torch.cpu
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cpu.get_device_name = lambda *a, **k: "cpu"
    cpu.get_device_properties = lambda *a, **k: types.SimpleNamespace(name="cpu", total_memory=total)
    cpu.reset_peak_memory_stats = lambda *a, **k: None
    cpu.empty_cache = lambda *a, **k: None
    cpu.memory_stats = lambda *a, **k: {}
    cpu.current_device = lambda: 0
    # Nothing may be downloaded at run time.
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _APPLIED = True
    return True


def pin_cpu_cores() -> list[int] | None:
    """On a CPU host (shims applied), pin this local rank to its share of the allowed cores: local rank
    ``i`` of ``n`` gets cores ``[i * k, (i + 1) * k)`` of the sorted allowed set, ``k = cores // n``.
    Returns the cores, or None where nothing changed (CUDA host, fewer cores than local ranks, no
    ``sched_setaffinity``, one local rank)."""
    if not _APPLIED or not hasattr(os, "sched_setaffinity"):
        return None
    n = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    i = int(os.environ.get("LOCAL_RANK", "0"))
    cores = sorted(os.sched_getaffinity(0))
    if n < 2 or len(cores) < n or not 0 <= i < n:
        return None
    k = len(cores) // n
    mine = cores[i * k : (i + 1) * k]
    # sched_setaffinity(0) sets the calling thread only: every thread of the process, then later ones inherit
    for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ["0"]:
        try:
            os.sched_setaffinity(int(tid), mine)
        except OSError:  # a thread that ended meanwhile
            pass
    return mine


def fsdp_sum_reductions(model_parts) -> int:
    """On a CPU host (shims applied), make every FSDP2 module of ``model_parts`` reduce with plain SUM
    (see 3. above). Returns how many modules were switched; 0 on CUDA hosts, where nothing changes."""
    if not _APPLIED:
        return 0
    from torch.distributed.fsdp import FSDPModule

    n = 0
    for part in model_parts:
        for m in part.modules():
            if isinstance(m, FSDPModule):
                m.set_force_sum_reduction_for_comms(True)
                n += 1
    return n


def no_overlap_callback(parallelism) -> bool:
    """On a CPU host (shims applied), turn off ``pipeline_parallel_expert_parallel_overlap`` for a DualPipeV
    schedule (see 5. above). Returns True where it was on and is now off; False on CUDA hosts, where
    nothing changes, and for other schedules."""
    if not _APPLIED or parallelism.pipeline_parallel_schedule != "DualPipeV":
        return False
    if not parallelism.pipeline_parallel_expert_parallel_overlap:
        return False
    parallelism.pipeline_parallel_expert_parallel_overlap = False
    return True
