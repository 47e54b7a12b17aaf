"""TorchTitan's own extension points the trainer uses: a ``TrainSpec`` with a validator and a metrics processor
of ours, in place of patching TorchTitan's instances.

* ``FixedBatchValidator``: every validation reads the same first batches of the held-out split. TorchTitan
  0.2.2's text dataset keeps its position between iterations, so each validation would otherwise score the
  *next* slice of the validation set, and losses from different steps (and the curves of different runs)
  would not be comparable. It rewinds the dataset with the dataset's own checkpoint API.
  With ``[validation] dataset = "instruct_heldout"`` it reads the masked instruction data
  (``timelyfreeze.data.instruct_data``: the loss of the response tokens), and with ``[instruct] questions > 0``
  it also scores the held-out multiple-choice accuracy (``timelyfreeze.titan.accuracy``) before the loss.
* ``FreezeMetricsProcessor``: TorchTitan's metrics processor that also hands each validation loss, with the
  accuracy when there is one, to its ``on_validation`` listeners (the freezing runtime's validation curve, the
  stop rule).
* ``loaders.build_dataloader``: TorchTitan's text dataloader, or for a ``pystdlib_<split>_fixed<N>`` dataset
  the fixed multi-epoch set whose samples carry a stable id (``timelyfreeze.data.epoch_data``).
* ``TokenMeanLoss``: the model's own loss, which the trainer can make divide by the step's token count
  (``dividing_by``) while a pipeline schedule runs its backward, so that PP optimises the per-token mean of
  the whole batch as one process does; without it TorchTitan 0.2.2's PP gradients are sums over tokens.

``use_freeze_spec(model_name)`` registers, under the model's own name (TorchTitan's user-defined specs take
precedence over its built-in ones), the model's ``TrainSpec`` with these builders where the model uses
TorchTitan's defaults; a model that brings its own builders keeps them (``has_freeze_builders`` says so). The
loss is the model's own builder's in every case, wrapped in ``TokenMeanLoss``. The spec's flavors also hold this
package's own for the model (``timelyfreeze.models``: llama3's ``smollm2_135m``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
from typing import Callable, Iterator

import torch
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.components.validate import Validator
from torchtitan.components.validate import build_validator as titan_build_validator
from torchtitan.hf_datasets.text_datasets import build_text_dataloader
from torchtitan.protocols.train_spec import get_train_spec, register_train_spec
from torchtitan.tools.logging import logger

from timelyfreeze.data import epoch_data, instruct_data, loaders
from timelyfreeze.data.choice_task import Accuracy
from timelyfreeze.models import smollm2
from timelyfreeze.titan.accuracy import ChoiceScorer


class FixedBatchValidator(Validator):
    """TorchTitan's ``Validator``; every ``validate`` starts from the validation dataset's first batch (and
    scores the held-out accuracy first, when ``[instruct] questions > 0``)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        vcfg, instruct = self.job_config.validation, getattr(self.job_config, "instruct", None)
        if instruct_data.is_instruct(vcfg.dataset):
            self.validation_dataloader = instruct_data.build_dataloader(
                vcfg.dataset,
                self.job_config,
                self.tokenizer,
                vcfg,
                kwargs["dp_rank"],
                kwargs["dp_world_size"],
                infinite=vcfg.steps != -1,
            )
        self.scorer = None
        if instruct is not None and instruct.questions > 0:
            instruct.validate("instruct")
            self.scorer = ChoiceScorer(instruct, self.tokenizer, vcfg.seq_len, vcfg.local_batch_size)
            logger.info(
                f"[instruct] held-out accuracy: {len(self.scorer.questions)} questions of {instruct.choices} "
                f"options (chance {1 / instruct.choices:.3f})"
            )
        dataset = self.validation_dataloader.dataset
        stateful = callable(getattr(dataset, "state_dict", None)) and callable(
            getattr(dataset, "load_state_dict", None)
        )
        self._start = copy.deepcopy(dataset.state_dict()) if stateful else None

    def post_dataloading_process(self, input_dict, labels, model_parts):
        """TorchTitan's, less the sample id of a fixed dataset (as the trainer's: ``epoch_data``)."""
        inputs, labels, extra_inputs, extra_kwargs = super().post_dataloading_process(input_dict, labels, model_parts)
        return inputs, labels, epoch_data.without_unused_sample_id(extra_inputs, model_parts), extra_kwargs

    def should_validate(self, step: int) -> bool:
        """TorchTitan's rule; with the held-out accuracy, also the last step (the accuracy at the end)."""
        return super().should_validate(step) or (self.scorer is not None and step == self.job_config.training.steps)

    def scores_accuracy(self, step: int) -> bool:
        """Whether a validation at ``step`` scores the held-out accuracy before its loss: at every ``[instruct]
        accuracy_freq``-th step (0: every ``[validation] freq``-th) and at the last, never at TorchTitan's extra
        validation of step 1 (a scoring costs questions x choices forwards: minutes, where the held-out loss
        costs seconds). The step where a time-to-accuracy run stops scores it after its loss (the trainer's
        ``FreezeMetricsProcessor.score_at_stop``)."""
        if self.scorer is None:
            return False
        every = self.job_config.instruct.accuracy_freq or self.job_config.validation.freq
        return step % every == 0 or step == self.job_config.training.steps

    def validate(self, model_parts, step, *args, **kwargs):
        if self.scores_accuracy(step) and isinstance(self.metrics_processor, FreezeMetricsProcessor):
            self.metrics_processor.pending_accuracy = self.scorer.score(self, model_parts)
            self.metrics_processor.scored = True
        if self._start is not None:
            self.validation_dataloader.dataset.load_state_dict(copy.deepcopy(self._start))
        return super().validate(model_parts, step, *args, **kwargs)


class FreezeMetricsProcessor(MetricsProcessor):
    """TorchTitan's ``MetricsProcessor``; ``log_validation`` first calls every ``on_validation(step, loss,
    accuracy)`` (``accuracy``: the validator's ``pending_accuracy``, an ``Accuracy`` on the rank that scored it,
    else None).

    ``scored``: whether the validation being logged scored the accuracy (the validator sets it; only the last
    stage's rank holds the result). When it did not, ``score_at_stop(step, loss)``, where set, may score it
    now: the trainer's, which scores once on every rank together when this validation's loss stops a
    time-to-accuracy run (``[experiment] stop_at_val_loss``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.on_validation: list[Callable[[int, float, Accuracy | None], None]] = []
        self.pending_accuracy: Accuracy | None = None
        self.scored = False
        self.score_at_stop: Callable[[int, float], Accuracy | None] | None = None

    def log_validation(self, loss, step, *args, **kwargs):
        acc, scored = self.pending_accuracy, self.scored
        self.pending_accuracy, self.scored = None, False
        if not scored and self.score_at_stop is not None:
            acc = self.score_at_stop(step, float(loss))
        if acc is not None:
            logger.info(
                f"validate step: {step:2}  accuracy: {acc.acc:.4f}  acc_norm: {acc.acc_norm:.4f}  "
                f"(chance {acc.chance:.3f}, {acc.questions} questions)"
            )
            if self.logger is not None:
                self.logger.log(
                    {"validation_metrics/accuracy": acc.acc, "validation_metrics/acc_norm": acc.acc_norm}, step
                )
        for listener in self.on_validation:
            listener(step, float(loss), acc)
        return super().log_validation(loss, step, *args, **kwargs)


class TokenMeanLoss:
    """The model's loss (TorchTitan 0.2.2's contract: the SUM over a microbatch's valid tokens), divided by
    ``divisor`` while one is set (``dividing_by``).

    TorchTitan's one-process path divides the summed loss by the step's global valid-token count *before*
    backward, so it optimises the per-token mean of the whole batch. Its PP path hands the loss function to the
    pipeline schedule (``scale_grads=False``), which runs backward on each microbatch's sum; the division comes
    only afterwards, for the logged loss (pytorch/torchtitan#2972). PP gradients were therefore the token count
    (8 x 256 = 2,048 in the CPU configs) times one process's, and ``max_norm = 1`` clipped every step. The
    trainer runs the schedule's training step inside ``dividing_by(global_valid_tokens)``; validation and the
    one-process path call it with no divisor set and get the sum they expect."""

    def __init__(self, inner: Callable[..., torch.Tensor]):
        self.inner = inner
        self.divisor: torch.Tensor | float | None = None

    def __call__(self, pred: torch.Tensor, labels: torch.Tensor, **kwargs) -> torch.Tensor:
        loss = self.inner(pred, labels, **kwargs)
        return loss if self.divisor is None else loss / self.divisor

    @contextlib.contextmanager
    def dividing_by(self, divisor: torch.Tensor | float) -> Iterator[None]:
        self.divisor = divisor
        try:
            yield
        finally:
            self.divisor = None


def build_loss_fn(job_config, *, inner: Callable, **kwargs) -> TokenMeanLoss:
    """``TrainSpec.build_loss_fn``: the model's own builder's loss (``inner``), as a ``TokenMeanLoss``."""
    return TokenMeanLoss(inner(job_config, **kwargs))


def build_validator(**kwargs) -> FixedBatchValidator:
    """``TrainSpec.build_validator_fn``: TorchTitan's ``build_validator``, with ``FixedBatchValidator``."""
    if kwargs.get("metrics_processor") is None:
        raise ValueError("the validator needs the metrics processor")
    return FixedBatchValidator(**kwargs)


def build_metrics_processor(job_config, parallel_dims, model_args=None, tag: str | None = None) -> MetricsProcessor:
    """``TrainSpec.build_metrics_processor_fn``: TorchTitan's ``build_metrics_processor``, with ours."""
    return FreezeMetricsProcessor(job_config, parallel_dims, tag)


def use_freeze_spec(model_name: str) -> None:
    """Register the model's ``TrainSpec`` with our builders where it uses TorchTitan's defaults (idempotent). A
    spec the user registered under the name stays as it is (``has_freeze_builders`` then says False)."""
    spec = get_train_spec(model_name)
    if spec.build_metrics_processor_fn is build_metrics_processor or spec.build_validator_fn is build_validator:
        return
    ours = dataclasses.replace(
        spec,
        model_args={**spec.model_args, **smollm2.flavors(model_name)},
        build_validator_fn=build_validator
        if spec.build_validator_fn is titan_build_validator
        else spec.build_validator_fn,
        build_metrics_processor_fn=build_metrics_processor
        if spec.build_metrics_processor_fn is None
        else spec.build_metrics_processor_fn,
        build_dataloader_fn=loaders.build_dataloader
        if spec.build_dataloader_fn is build_text_dataloader
        else spec.build_dataloader_fn,
        build_loss_fn=functools.partial(build_loss_fn, inner=spec.build_loss_fn),
    )
    try:
        register_train_spec(model_name, ours)
    except ValueError:  # the user registered a spec of their own under this name: theirs stays
        pass


def has_freeze_builders(metrics_processor) -> bool:
    """True where the trainer's metrics processor is ours (the model's spec used TorchTitan's default)."""
    return isinstance(metrics_processor, FreezeMetricsProcessor)
