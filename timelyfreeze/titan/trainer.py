"""TorchTitan's Trainer with the freezing runtime plugged in.

Launch: ``torchrun --nproc_per_node=2 -m timelyfreeze.train --job.config_file torchtitan_configs/X.toml``
(the TOML sets ``[job] custom_config_module = "timelyfreeze.config"`` so ``[freeze]`` is known).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch
import torch.distributed as dist
from torchtitan.tools.logging import logger
from torchtitan.train import Trainer

from planner.schedule.orders import v_shaped
from timelyfreeze.config.deprecated import apply_renames
from timelyfreeze.config.freeze import FreezeConfigError, compiles_model, resolve_unit, validate
from timelyfreeze.config.job_checks import (
    check_compile_schedule,
    check_instruct,
    check_job_types,
    check_microbatches,
    check_parallelism,
    check_stop_rule,
)
from timelyfreeze.data import corpus, epoch_data, instruct_data
from timelyfreeze.hooks.stage_hooks import overlap_pairs
from timelyfreeze.job.run_info import PipelinePart, RunInfo, TrainerHandles
from timelyfreeze.models import smollm2
from timelyfreeze.outputs.summary import format_summary
from timelyfreeze.runtime.freeze_runtime import FreezeRuntime
from timelyfreeze.titan import cpu_shims, precision
from timelyfreeze.titan import spec as titan_spec
from timelyfreeze.titan.torch_fixes import (
    parallel_meshes,
    patch_titan_clipping,
    patch_v_schedule_eval,
    release_mesh_process_groups,
)


class TimelyFreezeTrainer(Trainer):
    def __init__(self, job_config):
        patch_titan_clipping()  # a rank without gradients all-reduces a zero on its device (see torch_fixes)
        corpus.register_datasets()
        instruct_data.register_datasets()
        corpus.resolve_assets(job_config)
        smollm2.resolve_assets(job_config)
        corpus.resolve_initial_load(job_config)
        titan_spec.use_freeze_spec(job_config.model.name)
        fz = getattr(job_config, "freeze", None)
        self.freeze_rt: FreezeRuntime | None = None
        phases = None
        freezing = fz is not None and fz.enable
        check_job_types(job_config)
        if getattr(job_config, "instruct", None) is not None:
            check_instruct(job_config.instruct, job_config.validation)
            instruct_data.check_files(job_config.instruct)
        if fz is not None:
            for line in apply_renames(job_config):
                logger.warning(line)
        check_parallelism(
            job_config.parallelism,
            int(os.environ.get("WORLD_SIZE", "1")),
            freezing=freezing,
            method=fz.method if freezing else None,
        )
        check_microbatches(job_config.parallelism, job_config.training.local_batch_size)
        check_compile_schedule(job_config.parallelism, job_config.compile)
        if cpu_shims.no_overlap_callback(job_config.parallelism):
            logger.info(
                "[freeze] CPU: DualPipeV's OVERLAP_F_B actions run forward then backward ([parallelism] "
                "pipeline_parallel_expert_parallel_overlap = false: TorchTitan's callback needs an accelerator)"
            )
        if freezing:
            phases = validate(
                fz, total_steps=job_config.training.steps, lr_warmup_steps=job_config.lr_scheduler.warmup_steps
            )
            self._freeze_unit = resolve_unit(fz, job_config.compile, warmup_end=phases.warmup_end)
            check_stop_rule(job_config.experiment, job_config.validation)
            if job_config.experiment.cpu_pinning:
                cores = cpu_shims.pin_cpu_cores()
                if cores is not None:
                    logger.info(f"[freeze] local rank {os.environ.get('LOCAL_RANK', '0')} pinned to CPU cores {cores}")
        try:
            super().__init__(job_config)
            self._set_up(job_config, phases)
        except BaseException:
            # TorchTitan closes no trainer it could not build: release the meshes it made (see torch_fixes)
            self._release_meshes()
            raise

    def _set_up(self, job_config, phases) -> None:
        cpu_shims.fsdp_sum_reductions(self.model_parts)
        self._check_precision(job_config, phases)
        self._hold_lr_after_schedule()
        self._batch_in_step = 0
        if self.parallel_dims.pp_enabled and not isinstance(self.loss_fn, titan_spec.TokenMeanLoss):
            logger.warning(
                f"[model] name = {job_config.model.name!r} brings its own TrainSpec: under PP its gradients are "
                "TorchTitan 0.2.2's sums over the batch's tokens, not one process's per-token mean "
                "(timelyfreeze.titan.spec.TokenMeanLoss); scale [training] max_norm and the LR for it"
            )
        if self.parallel_dims.pp_enabled and v_shaped(job_config.parallelism.pipeline_parallel_schedule):
            for st in self._pp_stages():
                patch_v_schedule_eval(st)
        if phases is None:
            return
        self.freeze_rt = self._build_freeze_runtime(job_config, phases)
        if titan_spec.has_freeze_builders(self.metrics_processor):
            self.metrics_processor.on_validation.append(self.freeze_rt.record_validation)
            if self.freeze_rt.info.stop_at_val_loss > 0 and getattr(self.validator, "scorer", None) is not None:
                self.metrics_processor.score_at_stop = self._score_at_stop
        elif self.freeze_rt.info.stop_at_val_loss > 0:
            raise FreezeConfigError(
                f"[experiment] stop_at_val_loss with [model] name = {job_config.model.name!r}: its TrainSpec brings "
                "its own metrics processor, so the freezing runtime sees no validation loss"
            )

    def _check_precision(self, job_config, phases) -> None:
        """Warn when pure bf16 parameters meet a learning rate too small to move them; refuse APF where its
        copies would not fit the device (``timelyfreeze.titan.precision``)."""
        params = [p for m in self.model_parts for p in m.parameters() if p.requires_grad]
        warning = precision.bf16_lr_warning({p.dtype for p in params}, job_config.optimizer.lr)
        if warning is not None:
            logger.warning(warning)
        if phases is not None and torch.cuda.is_available():
            device_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
            precision.check_apf_memory(job_config.freeze.method, sum(p.numel() for p in params), device_bytes)

    def _release_meshes(self) -> None:
        """Drop the process-group references of every mesh TorchTitan built for this trainer (see torch_fixes)."""
        pd = getattr(self, "parallel_dims", None)
        if pd is not None:
            release_mesh_process_groups(parallel_meshes(pd))

    def _build_freeze_runtime(self, job_config, phases) -> FreezeRuntime:
        pd = self.parallel_dims
        tcfg = job_config.training
        dp_degree = pd.get_mesh("batch").size() if pd.dp_enabled else 1
        tokens_per_step = tcfg.local_batch_size * tcfg.seq_len * self.gradient_accumulation_steps * dp_degree
        info = RunInfo(
            schedule=job_config.parallelism.pipeline_parallel_schedule,
            num_microbatches=self.pp_schedule._n_microbatches,
            total_steps=tcfg.steps,
            tokens_per_step=tokens_per_step,
            lr_warmup_steps=job_config.lr_scheduler.warmup_steps,
            dump_folder=job_config.job.dump_folder,
            n_layers=getattr(self.model_args, "n_layers", 0),
            use_cuda=torch.cuda.is_available(),
            dp_degree=dp_degree,
            unit=self._freeze_unit,
            compiled=compiles_model(job_config.compile),
            stop_at_val_loss=job_config.experiment.stop_at_val_loss,
        )
        schedulers = self.lr_schedulers.schedulers
        pipeline = PipelinePart(self._pp_stages(), pd.get_mesh("pp").get_group(), pairs=overlap_pairs(self.pp_schedule))
        handles = TrainerHandles(
            get_lr=lambda: schedulers[0].get_last_lr()[0], log=logger.info, tb_log=self.metrics_processor.logger.log
        )
        return FreezeRuntime(job_config.freeze, phases, info, pipeline, handles)

    def _hold_lr_after_schedule(self) -> None:
        """Past ``lr_scheduler.total_steps`` (a run trained longer than its LR schedule, e.g. a time-to-accuracy
        run going on to its target) the LR holds the schedule's end value (``min_lr_factor`` of the peak for a
        decaying schedule); TorchTitan 0.2.2's cosine would rise again."""
        last = self.job_config.lr_scheduler.total_steps
        if last is None or last >= self.job_config.training.steps:
            return
        for sched in self.lr_schedulers.schedulers:
            sched.lr_lambdas = [functools.partial(_held_after, fn, last) for fn in sched.lr_lambdas]

    def should_continue_training(self) -> bool:
        """TorchTitan's rule, and ``[experiment] stop_at_val_loss``: stop at the first validation at or below the
        target once the LR schedule's length is trained (every rank holds the same gathered losses)."""
        if not super().should_continue_training():
            return False
        rt = self.freeze_rt
        if rt is None or rt.info.stop_at_val_loss <= 0:
            return True
        val_curve = rt.state.val_curve
        if target_reached(val_curve, self.step, self._stop_floor(), rt.info.stop_at_val_loss):
            logger.info(
                f"[freeze] validation loss {val_curve[-1][1]:.4f} <= stop_at_val_loss "
                f"{rt.info.stop_at_val_loss!r} at step {self.step}: target reached, stopping"
            )
            return False
        return True

    def _stop_floor(self) -> int:
        """The steps a time-to-accuracy run trains before its stop rule applies: the LR schedule's length."""
        return self.job_config.lr_scheduler.total_steps or self.job_config.training.steps

    def _score_at_stop(self, step: int, loss: float):
        """``FreezeMetricsProcessor.score_at_stop``: the held-out accuracy when the validation of ``step`` (loss
        ``loss`` on this rank; the last stage's counts, gathered) stops the run by ``stop_at_val_loss``, scored
        once by every rank together; None otherwise (the run goes on; every rank decides alike)."""
        rt, floor = self.freeze_rt, self._stop_floor()
        if step < floor:  # the same on every rank: no gather needed before the floor
            return None
        gathered = [[step, rt.gathered_val_loss(loss)]]
        if not target_reached(gathered, step, floor, rt.info.stop_at_val_loss):
            return None
        logger.info(f"[freeze] step {step} reaches stop_at_val_loss: scoring the held-out accuracy where the run ends")
        return self.validator.scorer.score(self.validator, self.model_parts)

    def _pp_stages(self) -> list:
        sched = self.pp_schedule
        return list(sched._stages) if hasattr(sched, "_stages") else [sched._stage]

    # -- the training loop hooks -------------------------------------------------------------
    def train_step(self, data_iterator):
        rt = self.freeze_rt
        if rt is None:
            return super().train_step(data_iterator)
        rt.begin_step(self.step)
        self._batch_in_step = 0
        super().train_step(data_iterator)
        rt.end_step(self.step)

    def post_dataloading_process(self, input_dict, labels):
        """TorchTitan's, less the sample id (``epoch_data.SAMPLE_ID``) unless every local stage's module takes
        it (only with Egeria's activation cache: ``egeria_cache``; multi-stage schedules hand it to them all)."""
        inputs, labels, extra_inputs, extra_kwargs = super().post_dataloading_process(input_dict, labels)
        return inputs, labels, epoch_data.without_unused_sample_id(extra_inputs, self.model_parts), extra_kwargs

    def forward_backward_step(self, *, input_dict, labels, global_valid_tokens):
        rt = self.freeze_rt
        if rt is None:
            return self._token_mean_step(input_dict, labels, global_valid_tokens)
        rt.begin_batch(self._batch_in_step)
        t0 = rt.clock.mark()  # perf_counter on CPU; a CUDA event on CUDA (device time, read at the step's end)
        loss = self._token_mean_step(input_dict, labels, global_valid_tokens)
        # the loss stays a tensor until the step ends: no host synchronisation per batch on CUDA
        rt.add_batch((t0, rt.clock.mark()), loss.detach().sum() if self.pp_has_last_stage else None)
        self._batch_in_step += 1
        if self._batch_in_step == self.gradient_accumulation_steps:
            rt.after_backward(self.step)
        return loss

    def _token_mean_step(self, input_dict, labels, global_valid_tokens):
        """TorchTitan's ``forward_backward_step``; under PP with each microbatch's loss divided by the step's
        global valid-token count before the schedule's backward (``titan_spec.TokenMeanLoss``), so the gradients
        are those of the per-token mean over the whole batch, as in one process. The schedule's losses are then
        already divided: TorchTitan's sum of them over a divisor of one is the step's mean loss it logs."""
        loss_fn = self.loss_fn
        if not (self.parallel_dims.pp_enabled and isinstance(loss_fn, titan_spec.TokenMeanLoss)):
            return super().forward_backward_step(
                input_dict=input_dict, labels=labels, global_valid_tokens=global_valid_tokens
            )
        # the count: a tensor, or a Python number where TorchTitan all-reduced it over data-parallel replicas
        with loss_fn.dividing_by(global_valid_tokens):
            return super().forward_backward_step(input_dict=input_dict, labels=labels, global_valid_tokens=1)

    # -- checkpointing: the freezing state travels with TorchTitan's "train_state" ---------------
    def _freeze_key(self) -> str:
        return f"timelyfreeze_rank{dist.get_rank()}"

    def state_dict(self) -> dict[str, Any]:
        sd = super().state_dict()
        if getattr(self, "freeze_rt", None) is not None:
            sd[self._freeze_key()] = self.freeze_rt.state_dict()
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]):
        super().load_state_dict(state_dict)
        if getattr(self, "freeze_rt", None) is not None and self._freeze_key() in state_dict:
            self.freeze_rt.load_state_dict(state_dict[self._freeze_key()], self.step)
            logger.info(f"[freeze] restored freezing state at step {self.step}")

    def train(self):
        super().train()
        self._trained = True

    def close(self) -> None:
        rt = getattr(self, "freeze_rt", None)
        if rt is not None:
            close_runtime(rt, trained=getattr(self, "_trained", False))
        super().close()
        # before TorchTitan's destroy_process_group(): let it really destroy the groups (see torch_fixes)
        self._release_meshes()


def close_runtime(runtime, *, trained: bool) -> None:
    """Close the freezing runtime at the end of a run: the summary (a collective over every rank) only
    after ``train()`` returned. After an exception, TorchTitan still calls ``close()`` before re-raising,
    and a collective there waits for ranks that are elsewhere (still in the pipeline, or dead) until the
    process group's timeout, holding back the error that ended the run. The trace is flushed either way.
    A refused resume leaves the earlier run's summary alone."""
    try:
        summary = runtime.finish() if trained and not runtime.refused else None
        if summary is not None:
            logger.info(format_summary(summary))
    finally:
        runtime.close()


def _held_after(fn, last: int, step: int) -> float:
    """``fn`` (an LR lambda) with its step clamped to ``last``."""
    return fn(min(step, last))


def target_reached(val_curve: list, step: int, floor: int, target: float) -> bool:
    """The stop rule of ``[experiment] stop_at_val_loss``: this step validated at or below ``target`` and at
    least ``floor`` steps are trained."""
    return bool(val_curve) and step >= floor and val_curve[-1][0] == step and val_curve[-1][1] <= target
