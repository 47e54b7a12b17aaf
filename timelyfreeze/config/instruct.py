"""The ``[instruct]`` TOML section: instruction fine-tuning data and the held-out accuracy task.

Used by the datasets ``instruct`` (``[training] dataset``) and ``instruct_heldout`` (``[validation] dataset``) of
``timelyfreeze.data.instruct_data``, and by the validator's accuracy (``timelyfreeze.titan.accuracy``). No
``from __future__ import annotations`` here: TorchTitan's ConfigManager merges sections by inspecting real
dataclass types.
"""

from dataclasses import dataclass
from typing import Literal

from timelyfreeze.job.fields import check_section

DEFAULT_TURN = "<|im_start|>{role}\n{content}<|im_end|>\n"
"""ChatML, the chat template of SmolLM2 (and of most instruction-tuned models of its family)."""


@dataclass
class Instruct:
    """``[instruct]``: instruction fine-tuning data (``[training] dataset = "instruct"``, ``[validation] dataset =
    "instruct_heldout"``) and the held-out multiple-choice accuracy."""

    data_path: str = ""
    """Training pairs: a file in the Alpaca format, JSON lines (one object a line) or one JSON array of objects,
    each with ``instruction`` and ``output`` (non-empty) and an optional ``input``, e.g. Alpaca-GPT4. Empty (the
    default): the embedded pairs of the Python standard library's non-held-out modules (a function's signature
    -> its docstring's first line; ``timelyfreeze.data.instruct_pairs``)."""

    heldout_path: str = ""
    """Held-out pairs in the same format (validation loss and the accuracy questions). Empty (the default): the
    embedded pairs of the held-out standard-library modules (the corpus's ``val`` split: disjoint by module from
    the training pairs)."""

    turn: str = DEFAULT_TURN
    """The chat template of one turn, with ``{role}`` (``system``, ``user``, ``assistant``) and ``{content}``;
    the default is ChatML. A sample is the user's turn and the assistant's; the loss counts only the
    assistant's content and the end of its turn (the labels of every other token are TorchTitan's ignore index).
    For Llama 3: ``"<|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>"``."""

    system: str = ""
    """A system turn put before every prompt (empty: none)."""

    questions: int = 0
    """Held-out accuracy: score this many multiple-choice questions built from the held-out pairs (the prompt,
    and as options its own response and ``choices - 1`` responses of other held-out pairs) by log-likelihood as
    lm-eval-harness does, at the steps ``accuracy_freq`` says. Needs ``[validation] enable``. 0 (the default):
    no accuracy."""

    accuracy_freq: int = 0
    """Score the held-out accuracy at every ``accuracy_freq``-th step, a multiple of ``[validation] freq`` (the
    steps that validate); 0 (the default): at every validation. Either way also at the last step and at the step
    where ``[experiment] stop_at_val_loss`` stops the run, never at TorchTitan's extra validation of step 1. A
    scoring costs ``questions x choices`` forwards (minutes on a CPU) where the held-out loss costs seconds: a
    time-to-accuracy run that checks its loss often sets it above ``[training] steps`` to score only where it
    ends."""

    choices: int = 4
    """Options per question (chance level ``1 / choices``)."""

    distractors: Literal["same_source", "any"] = "same_source"
    """Where the wrong options come from: ``same_source`` (other pairs of the same module or file, when it has
    enough; harder) or ``any`` held-out pair."""

    seed: int = 0
    """Seed of the questions' choice and the options' order (fixed: every run scores the same questions)."""

    def validate(self, section: str = "instruct") -> None:
        check_section(
            self,
            section,
            (
                (
                    "turn",
                    lambda v: v.count("{role}") == 1 and v.count("{content}") == 1,
                    "must hold {role} and {content} once each",
                ),
                ("turn", lambda v: v.index("{role}") < v.index("{content}"), "must put {role} before {content}"),
                ("questions", lambda v: v >= 0, "must be an integer >= 0"),
                ("accuracy_freq", lambda v: v >= 0, "must be an integer >= 0"),
                ("choices", lambda v: v >= 2, "must be an integer >= 2"),
            ),
        )
