"""The held-out accuracy task: multiple choice scored by log-likelihood, as lm-eval-harness scores it.

A question is a held-out pair's prompt with ``k`` options: its own response and ``k - 1`` responses of other
held-out pairs (of the same source when it has enough, ``[instruct] distractors``), in an order drawn from a fixed
seed. Each option is scored by the sum of its tokens' log-probabilities given the prompt (the chat template's
prompt; the option is the assistant's content, without the end of the turn); the model's answer is the option
with the highest sum (``acc``), or with the highest sum per character of the option (``acc_norm``, lm-eval's
length normalisation). Chance is ``1 / k``.

``option_rows`` lays the (question, option) pairs out as rows of ``seq_len`` inputs and labels whose only
labels are the option's tokens, ``row_loglik`` turns a model's logits for such rows into their sums, and
``accuracy`` reduces the sums to an ``Accuracy``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from timelyfreeze.data.chat_template import ChatTemplate
from timelyfreeze.data.instruct_data import IGNORE_INDEX
from timelyfreeze.data.instruct_pairs import Pair


@dataclass(frozen=True)
class Question:
    prompt: str
    """The user's message."""
    options: tuple[str, ...]
    answer: int
    """Index of the right option."""


@dataclass(frozen=True)
class Accuracy:
    acc: float
    acc_norm: float
    chance: float
    questions: int
    right: str = ""
    """Per question, in the questions' order: ``"1"`` where ``acc``'s answer is right, else ``"0"`` (paired tests
    between runs scored on the same questions: McNemar)."""
    right_norm: str = ""
    """The same for ``acc_norm``'s answers."""

    def row(self) -> dict:
        """The fields a metrics row and the summary carry."""
        return {
            "val_acc": self.acc,
            "val_acc_norm": self.acc_norm,
            "val_acc_chance": self.chance,
            "val_questions": self.questions,
            "val_acc_right": self.right,
            "val_acc_norm_right": self.right_norm,
        }


def build_questions(pairs: list[Pair], n: int, k: int, seed: int, same_source: bool = True) -> list[Question]:
    """Up to ``n`` questions of ``k`` options from ``pairs`` (module docstring). A pair is a question only when
    ``k - 1`` other responses, all different from its own and from each other, can be drawn; the questions are
    the first ``n`` such pairs in an order drawn from ``seed``."""
    rng = random.Random(seed)
    by_source: dict[str, list[str]] = {}
    for p in pairs:
        by_source.setdefault(p.source, [])
        if p.output not in by_source[p.source]:
            by_source[p.source].append(p.output)
    everything = sorted({p.output for p in pairs})
    order = list(range(len(pairs)))
    rng.shuffle(order)
    out: list[Question] = []
    for i in order:
        if len(out) >= n:
            break
        p = pairs[i]
        pool = [o for o in by_source[p.source] if o != p.output]
        if not same_source or len(pool) < k - 1:
            pool = [o for o in everything if o != p.output]
        if len(pool) < k - 1:
            continue
        options = rng.sample(pool, k - 1) + [p.output]
        rng.shuffle(options)
        out.append(Question(p.user, tuple(options), options.index(p.output)))
    return out


def option_rows(
    questions: list[Question], template: ChatTemplate, tokenizer, seq_len: int, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, list[Question]]:
    """``(inputs (R, seq_len), labels (R, seq_len), the questions kept)``: one row per (question, option), question
    by question; a question with an option that does not fit ``seq_len + 1`` tokens is left out."""
    rows: list[tuple[list[int], int]] = []
    kept: list[Question] = []
    for q in questions:
        head = tokenizer.encode(template.prompt(q.prompt), add_eos=False)
        opts = [head + tokenizer.encode(o, add_bos=False, add_eos=False) for o in q.options]
        if max(map(len, opts)) > seq_len + 1:
            continue
        kept.append(q)
        rows += [(ids, len(head)) for ids in opts]
    inputs = torch.full((len(rows), seq_len), pad_id, dtype=torch.int64)
    labels = torch.full((len(rows), seq_len), IGNORE_INDEX, dtype=torch.int64)
    for r, (ids, n_prompt) in enumerate(rows):
        inputs[r, : len(ids) - 1] = torch.tensor(ids[:-1])
        labels[r, n_prompt - 1 : len(ids) - 1] = torch.tensor(ids[n_prompt:])
    return inputs, labels, kept


def row_loglik(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``(rows,)`` float64: per row, the sum of ``log_softmax(logits)`` at the labels that are not the ignore
    index (``logits``: ``(rows, seq, vocab)``)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    keep = labels != IGNORE_INDEX
    picked = logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (picked * keep).sum(dim=1).double()


def accuracy(scores: list[float], questions: list[Question]) -> Accuracy:
    """``scores``: one log-likelihood per (question, option) row, question by question (``option_rows``)."""
    right: list[bool] = []
    right_norm: list[bool] = []
    at = 0
    for q in questions:
        s = scores[at : at + len(q.options)]
        at += len(q.options)
        norm = [v / max(1, len(o)) for v, o in zip(s, q.options)]
        right.append(max(range(len(s)), key=s.__getitem__) == q.answer)
        right_norm.append(max(range(len(norm)), key=norm.__getitem__) == q.answer)
    if at != len(scores):
        raise ValueError(f"{len(scores)} scores for {at} options")
    n = len(questions)
    k = len(questions[0].options) if questions else 0
    return Accuracy(
        sum(right) / n if n else 0.0,
        sum(right_norm) / n if n else 0.0,
        1.0 / k if k else 0.0,
        n,
        "".join("01"[r] for r in right),
        "".join("01"[r] for r in right_norm),
    )
