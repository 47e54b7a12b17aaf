"""TorchTitan's Trainer with the freezing runtime plugged in.

Launch: ``torchrun --nproc_per_node=2 -m timelyfreeze.train --job.config_file torchtitan_configs/X.toml``
(the TOML sets ``[job] custom_config_module = "timelyfreeze.config"`` so ``[freeze]`` is known).
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torchtitan.tools.logging import logger
from torchtitan.train import Trainer

from timelyfreeze import corpus
from timelyfreeze.config import FreezeConfigError, validate
from timelyfreeze.runtime import FreezeRuntime
from timelyfreeze.torch_fixes import patch_v_schedule_eval


class TimelyFreezeTrainer(Trainer):
    def __init__(self, job_config):
        corpus.register_datasets()
        corpus.resolve_assets(job_config)
        fz = getattr(job_config, "freeze", None)
        self.freeze_rt: FreezeRuntime | None = None
        phases = None
        if fz is not None and fz.enable:
            phases = validate(
                fz, total_steps=job_config.training.steps, lr_warmup_steps=job_config.lr_scheduler.warmup_steps
            )
            if job_config.parallelism.pipeline_parallel_degree < 2:
                raise FreezeConfigError(
                    "[freeze] enable = true needs pipeline parallelism: set [parallelism] pipeline_parallel_degree >= 2"
                )
        super().__init__(job_config)
        self._batch_in_step = 0
        if self.parallel_dims.pp_enabled:
            for st in self._pp_stages():
                patch_v_schedule_eval(st)
        if phases is None:
            return
        pd = self.parallel_dims
        if pd.dp_shard_enabled or pd.tp_enabled or pd.cp_enabled:
            raise FreezeConfigError(
                "[freeze] does not support data_parallel_shard_degree > 1 (FSDP), tensor or context "
                "parallelism yet: FSDP keeps gradients on unsharded parameters the freezing hook does not "
                "see. Use pipeline parallelism (optionally with data_parallel_replicate_degree)."
            )
        stages = self._pp_stages()
        n_mb = self.pp_schedule._n_microbatches
        tcfg = job_config.training
        tokens_per_step = tcfg.local_batch_size * tcfg.seq_len * self.gradient_accumulation_steps
        if pd.dp_enabled:
            tokens_per_step *= pd.get_mesh("batch").size()
        self.freeze_rt = FreezeRuntime(
            fz,
            phases,
            stages=stages,
            n_layers=getattr(self.model_args, "n_layers", 0),
            schedule=job_config.parallelism.pipeline_parallel_schedule,
            num_microbatches=n_mb,
            pp_group=pd.get_mesh("pp").get_group(),
            dump_folder=job_config.job.dump_folder,
            total_steps=tcfg.steps,
            tokens_per_step=tokens_per_step,
            get_lr=lambda: self.lr_schedulers.schedulers[0].get_last_lr()[0],
            lr_warmup_steps=job_config.lr_scheduler.warmup_steps,
            use_cuda=torch.cuda.is_available(),
            log=logger.info,
            tb_log=self.metrics_processor.logger.log,
        )
        self._wrap_validation_logging()

    def _pp_stages(self) -> list:
        sched = self.pp_schedule
        return list(sched._stages) if hasattr(sched, "_stages") else [sched._stage]

    def _wrap_validation_logging(self) -> None:
        mp = self.metrics_processor
        orig = mp.log_validation
        rt = self.freeze_rt

        def log_validation(loss, step, *args, **kwargs):
            rt.record_validation(step, float(loss))
            return orig(loss, step, *args, **kwargs)

        mp.log_validation = log_validation

    # -- the training loop hooks -------------------------------------------------------------
    def train_step(self, data_iterator):
        rt = self.freeze_rt
        if rt is None:
            return super().train_step(data_iterator)
        rt.begin_step(self.step)
        self._batch_in_step = 0
        super().train_step(data_iterator)
        rt.end_step(self.step)

    def forward_backward_step(self, *, input_dict, labels, global_valid_tokens):
        rt = self.freeze_rt
        if rt is None:
            return super().forward_backward_step(
                input_dict=input_dict, labels=labels, global_valid_tokens=global_valid_tokens
            )
        t0 = time.perf_counter()
        loss = super().forward_backward_step(
            input_dict=input_dict, labels=labels, global_valid_tokens=global_valid_tokens
        )
        rt.add_batch(time.perf_counter() - t0, float(loss.detach().sum()) if self.pp_has_last_stage else None)
        self._batch_in_step += 1
        if self._batch_in_step == self.gradient_accumulation_steps:
            rt.after_backward(self.step)
        return loss

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
            self.freeze_rt.load_state_dict(state_dict[self._freeze_key()])
            logger.info(f"[freeze] restored freezing state at step {self.step}")

    def close(self) -> None:
        rt = getattr(self, "freeze_rt", None)
        if rt is not None:
            try:
                summary = rt.finish()
                if summary is not None:
                    logger.info(format_summary(summary))
            finally:
                rt.close()
        super().close()


def format_summary(s: dict) -> str:
    """The end-of-run summary printed by pipeline rank 0."""

    def f(x, unit="", nd=1):
        return "n/a" if x is None else f"{x:,.{nd}f}{unit}"

    lines = [f"[freeze] ===== summary: {s['method']} on {s['schedule']} (PP={s['pp_degree']}, "
             f"{s['num_stages']} stages, {s['num_microbatches']} microbatches, {s['steps']} steps) ====="]
    lines.append("  phases: " + ", ".join(f"{p} {a}-{b}" for p, (a, b) in s["phases"].items()))
    mb = s["mean_batch_ms"]
    pred = s.get("predicted_batch_ms") or {}
    if pred:
        lines.append(
            f"  batch time, predicted: no-freeze {f(pred.get('no_freeze'), ' ms')}, all-frozen "
            f"{f(pred.get('all_frozen'), ' ms')}, planned {f(pred.get('planned'), ' ms')}"
        )
    lines.append("  batch time, measured:  " + ", ".join(f"{p} {f(v, ' ms')}" for p, v in mb.items()))
    if pred and mb.get("upper") and mb.get("stable"):
        lines.append(
            f"  speedup over upper bound: measured {mb['upper'] / mb['stable']:.3f}x, "
            f"predicted {pred['no_freeze'] / pred['planned']:.3f}x"
        )
    tps = s["tokens_per_s"]
    lines.append(f"  throughput: {f(tps['all'], ' tok/s')} overall, {f(tps['stable'], ' tok/s')} steady")
    lines.append(f"  average freeze ratio (by elements, whole run): {s['avg_freeze_ratio']:.3f}")
    lc = s["loss_curve"]
    if lc:
        lines.append(f"  loss: {lc[0][1]:.3f} (step {lc[0][0]}) -> {lc[-1][1]:.3f} (step {lc[-1][0]})"
                     + (f", validation {s['val_loss']:.3f}" if s.get("val_loss") is not None else ""))
    for k, v in s.get("paths", {}).items():
        if v:
            lines.append(f"  {k}: {v}")
    return "\n".join(lines)
