"""A chat template: how a prompt/response pair becomes the text the model reads, and which part is the response.

One turn's format holds ``{role}`` and ``{content}`` (``[instruct] turn``; ChatML by default). A sample is an
optional system turn, the user's turn, and the assistant's turn; the *prompt* is everything up to the assistant's
content, the *response* the content and the rest of its turn (ChatML: the answer, ``<|im_end|>`` and a newline).
The loss and the accuracy score count the response's tokens only.

Prompt and response are encoded separately and concatenated (as lm-eval-harness splits context and
continuation), so the boundary between them is a token boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

from timelyfreeze.config.instruct import DEFAULT_TURN


@dataclass(frozen=True)
class ChatTemplate:
    turn: str = DEFAULT_TURN
    system: str = ""

    def _split(self, role: str) -> tuple[str, str]:
        head, tail = self.turn.replace("{role}", role).split("{content}")
        return head, tail

    def prompt(self, user: str) -> str:
        """The text before the assistant's content."""
        sys_head, sys_tail = self._split("system")
        user_head, user_tail = self._split("user")
        system = f"{sys_head}{self.system}{sys_tail}" if self.system else ""
        return f"{system}{user_head}{user}{user_tail}{self._split('assistant')[0]}"

    def response(self, output: str) -> str:
        """The assistant's content and the end of its turn."""
        return output + self._split("assistant")[1]


def encode_sample(tokenizer, prompt: str, response: str) -> tuple[list[int], int]:
    """``(token ids, number of prompt tokens)``: the prompt with the tokenizer's own BOS rule, the response
    with neither BOS nor EOS (the template ends the turn)."""
    head = tokenizer.encode(prompt, add_eos=False)
    return head + tokenizer.encode(response, add_bos=False, add_eos=False), len(head)
