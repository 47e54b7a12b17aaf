"""The TorchTitan job around ``[freeze]``: the layouts and the settings of other sections that the freezing
runtime refuses before TorchTitan builds anything, each with one error line naming the field
(``FreezeConfigError``). The ``[freeze]`` section's own rules are ``timelyfreeze.config.freeze.validate``'s."""

import dataclasses

from planner.errors import PlannerError
from planner.schedule.orders import check_microbatch_count, min_microbatches
from timelyfreeze.config.freeze import Experiment, compiles_model
from timelyfreeze.config.instruct import Instruct
from timelyfreeze.job.errors import FreezeConfigError
from timelyfreeze.job.fields import check_types
from timelyfreeze.methods.registry import METHODS as _REGISTRY


def check_job_types(job_config) -> None:
    """The declared type of every field of every section of the job, TorchTitan's as well as ``[freeze]``,
    before anything reads them: a TOML ``[training] local_batch_size = "8"`` is one error line naming the
    field, not a TypeError in the middle of setting up (the command line is typed by TorchTitan's parser;
    a TOML file is not)."""
    for f in dataclasses.fields(job_config):
        section = getattr(job_config, f.name)
        if dataclasses.is_dataclass(section):
            check_types(section, f.name)


def check_parallelism(parallelism, world_size: int, *, freezing: bool = True, method: str | None = None) -> None:
    """Refuse, before TorchTitan builds anything, the layouts that cannot work.

    Always: DDP (``data_parallel_replicate_degree > 1`` without sharding) combined with pipeline
    parallelism, which TorchTitan 0.2.2 raises deep inside model setup ("DDP has not supported > 1D
    parallelism"); HSDP (replicate x shard) is the layout that composes with PP. With freezing on, also:
    no pipeline; context parallelism (not supported yet); and, with data-parallel replicas of the pipeline
    (FSDP2/HSDP sharding or tensor parallelism), a method whose decisions come from per-rank gradient
    statistics (``MethodSpec.data_parallel`` false): its replicas could freeze different tensors."""
    pp = parallelism.pipeline_parallel_degree
    rep = parallelism.data_parallel_replicate_degree
    tp, cp = parallelism.tensor_parallel_degree, parallelism.context_parallel_degree
    shard = parallelism.data_parallel_shard_degree
    if shard == -1:
        shard = world_size // max(1, pp * tp * cp * rep)
    if pp > 1 and rep > 1 and shard <= 1:
        raise FreezeConfigError(
            f"[parallelism] data_parallel_replicate_degree = {rep} with pipeline parallelism: TorchTitan 0.2.2 "
            'cannot combine DDP with PP ("DDP has not supported > 1D parallelism"); use HSDP instead '
            "(data_parallel_shard_degree > 1, optionally with data_parallel_replicate_degree)"
        )
    if not freezing:
        return
    if pp < 2:
        raise FreezeConfigError(
            "[freeze] enable = true needs pipeline parallelism: "
            f"[parallelism] pipeline_parallel_degree = {pp}, set it >= 2"
        )
    if cp > 1:
        raise FreezeConfigError(
            f"[parallelism] context_parallel_degree = {cp}: TimelyFreeze does not support context parallelism yet"
        )
    replicas = rep * max(shard, 1) * tp
    spec = _REGISTRY.get(method) if method is not None else None  # (an unknown name: validate() says so)
    if replicas > 1 and spec is not None and not spec.data_parallel:
        ok = ", ".join(n for n, spec in _REGISTRY.items() if spec.data_parallel)
        raise FreezeConfigError(
            f"[freeze] method = {method!r} does not support data-parallel replicas of the pipeline yet "
            f"(FSDP/HSDP/TP: {replicas} replicas here): its freezing decisions come from per-rank gradient "
            f"statistics, which would differ between replicas; use one of: {ok}"
        )


def check_microbatches(parallelism, local_batch_size: int) -> None:
    """Refuse, before TorchTitan builds the schedule, a batch that does not split into whole microbatches, or
    into a count torch's schedule constructor would refuse on every rank (``planner.schedule.orders`` has the rules:
    at least one per stage for 1F1B and DualPipeV, a multiple of the rounds for the interleaved ones)."""
    pp = parallelism.pipeline_parallel_degree
    if pp < 2:
        return
    mbs = parallelism.pipeline_parallel_microbatch_size
    if mbs < 1 or local_batch_size % mbs:
        raise FreezeConfigError(
            f"[parallelism] pipeline_parallel_microbatch_size = {mbs} does not divide [training] "
            f"local_batch_size = {local_batch_size} into whole microbatches"
        )
    name = parallelism.pipeline_parallel_schedule
    try:
        need = min_microbatches(name, pp)  # torch's constructor raises on every rank below it
    except PlannerError:
        return  # a schedule the planner does not know: TorchTitan's own checks apply
    n = local_batch_size // mbs
    gives = (
        f"[training] local_batch_size = {local_batch_size} / [parallelism] pipeline_parallel_microbatch_size = "
        f"{mbs} gives {n} microbatches"
    )
    if n < need:
        raise FreezeConfigError(
            f"{gives}; {name} needs at least one per stage ({need} "
            f"stages): raise local_batch_size to {need * mbs} or more"
        )
    try:
        check_microbatch_count(name, pp, n)
    except PlannerError as e:
        raise FreezeConfigError(f"{gives}; {e}") from None


COMPILE_REFUSED_SCHEDULES: tuple[str, ...] = ("ZBVZeroBubble", "InterleavedZeroBubble", "DualPipeV")
"""Schedules torch 2.13 refuses for ``torch.compile``'d stage modules (its split I/W backward:
``torch.distributed.pipelining.schedules._check_torch_compile_compatibility``), whether or not anything freezes."""


def check_compile_schedule(parallelism, compile_cfg) -> None:
    """Refuse, before TorchTitan builds the pipeline, a schedule that torch refuses under ``torch.compile``."""
    name = parallelism.pipeline_parallel_schedule
    if parallelism.pipeline_parallel_degree > 1 and compiles_model(compile_cfg) and name in COMPILE_REFUSED_SCHEDULES:
        raise FreezeConfigError(
            f"[parallelism] pipeline_parallel_schedule = {name!r} with [compile] enable = true: torch 2.13 does not "
            "run its split-backward (I/W) schedules on torch.compile'd stage modules; use GPipe, 1F1B, "
            "Interleaved1F1B or LoopedBFS, or set [compile] enable = false"
        )


def check_stop_rule(cfg: Experiment, validation) -> None:
    """``[experiment]``'s own rules, then: ``stop_at_val_loss`` decides on validation losses, so validation must
    run."""
    cfg.validate("experiment")
    if cfg.stop_at_val_loss > 0 and not getattr(validation, "enable", False):
        raise FreezeConfigError(
            f"[experiment] stop_at_val_loss = {cfg.stop_at_val_loss:g} needs validation: set [validation] enable = true"
        )


def check_instruct(cfg: Instruct, validation) -> None:
    """``[instruct]``'s own rules, then: the held-out accuracy is scored at validations, so validation must run,
    and ``accuracy_freq`` must name validation steps."""
    cfg.validate("instruct")
    if cfg.questions > 0 and not getattr(validation, "enable", False):
        raise FreezeConfigError(
            f"[instruct] questions = {cfg.questions} needs validation: set [validation] enable = true"
        )
    freq = getattr(validation, "freq", 1)
    if cfg.questions > 0 and cfg.accuracy_freq % freq:
        raise FreezeConfigError(
            f"[instruct] accuracy_freq = {cfg.accuracy_freq} must be a multiple of [validation] freq = {freq} "
            "(the accuracy is scored at validations)"
        )
