"""The held-out accuracy (``timelyfreeze.data.choice_task``) scored by the trainer's own model, pipeline included.

``ChoiceScorer`` holds the question rows, cut into batches of ``[validation] local_batch_size`` rows of
``[validation] seq_len`` tokens (the shapes validation already runs; the last batch is filled with rows that
have no labels). Without pipeline parallelism it runs the model and reads the logits. Under pipeline
parallelism the logits exist only on the last stage, inside the schedule, where the loss function sees them:
for the scoring the schedule's loss function is swapped for ``row_loglik`` (it returns a vector of the
microbatch's per-row sums instead of a scalar loss; ``eval`` hands the microbatches' results back in order),
so the rank of the last stage holds every row's score and reduces them to an ``Accuracy``; the other ranks
return None. Every data-parallel replica scores all questions (the same numbers).
"""

from __future__ import annotations

import contextlib

import torch

from timelyfreeze.data import choice_task
from timelyfreeze.data.instruct_data import pad_id_of, pairs_for, template_of


class ChoiceScorer:
    def __init__(self, cfg, tokenizer, seq_len: int, batch_size: int):
        """``cfg``: the ``[instruct]`` section (``questions`` > 0)."""
        pairs, _ = pairs_for("heldout", cfg)
        questions = choice_task.build_questions(
            pairs, cfg.questions, cfg.choices, cfg.seed, same_source=cfg.distractors == "same_source"
        )
        pad = pad_id_of(tokenizer)
        inputs, labels, self.questions = choice_task.option_rows(questions, template_of(cfg), tokenizer, seq_len, pad)
        rows = inputs.shape[0]
        fill = -rows % batch_size
        if fill:
            inputs = torch.cat([inputs, torch.full((fill, seq_len), pad, dtype=inputs.dtype)])
            labels = torch.cat([labels, torch.full((fill, seq_len), choice_task.IGNORE_INDEX, dtype=labels.dtype)])
        self.rows = rows
        self.batches = list(zip(inputs.split(batch_size), labels.split(batch_size)))

    @torch.no_grad()
    def score(self, validator, model_parts) -> choice_task.Accuracy | None:
        """The accuracy on this rank (the last pipeline stage's, or the only one's), else None. ``validator``:
        TorchTitan's ``Validator`` (its schedule, context, and input processing)."""
        for m in model_parts:
            m.eval()
        try:
            scores = [s for batch in self.batches for s in self._batch(validator, model_parts, *batch)]
        finally:
            for m in model_parts:
                m.train()
        if validator.parallel_dims.pp_enabled and not validator.pp_has_last_stage:
            return None
        return choice_task.accuracy([float(s) for s in scores[: self.rows]], self.questions)

    def _batch(self, validator, model_parts, inputs, labels) -> list[float]:
        device = next(model_parts[0].parameters()).device
        inputs, labels, extra_inputs, extra_kwargs = validator.post_dataloading_process(
            {"input": inputs.to(device)}, labels.to(device), model_parts
        )
        if not validator.parallel_dims.pp_enabled:
            with validator.validation_context(), validator.maybe_enable_amp:
                return choice_task.row_loglik(model_parts[0](inputs, **extra_inputs, **extra_kwargs), labels).tolist()
        sched = validator.pp_schedule
        target, losses = (labels, []) if validator.pp_has_last_stage else (None, None)
        with validator.validation_context(), _loss_fn(sched, choice_task.row_loglik):
            if validator.pp_has_first_stage:
                sched.eval(inputs, **extra_inputs, **extra_kwargs, target=target, losses=losses)
            else:
                sched.eval(**extra_kwargs, target=target, losses=losses)
        return torch.cat(losses).tolist() if losses is not None else []


@contextlib.contextmanager
def _loss_fn(schedule, fn):
    """The pipeline schedule with ``fn`` as its loss function for the duration."""
    saved = schedule._loss_fn
    schedule._loss_fn = fn
    try:
        yield
    finally:
        schedule._loss_fn = saved
