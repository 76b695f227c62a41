"""A scripted model for fast tests: a byte-level vocabulary and planned replies.

:class:`ScriptedModel` is a real :class:`~pocket_agent.runtime.Model` (the same checks, KV-cache
bookkeeping, chat template and grammar support as the native backends) whose "forward pass" is
a Python function: at every assistant turn it looks up the reply it was told to give and puts
all the probability on that reply's next byte. Grammars still mask its logits, so constrained
output stays valid even where the planned reply does not fit. Use it to test app code (agent
loops, retries, stop strings) in milliseconds, without model weights::

    from pocket_agent import Agent
    from pocket_agent.runtime import ScriptedModel

    model = ScriptedModel(['<tool_call>\\n{"name": "add", "arguments": {"a": 1, "b": 2}}\\n</tool_call>', "3"])
    Agent([add], model=model).run("What is 1 + 2?").final   # "3"
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ..errors import InvalidInputError
from .base import Capabilities, EvalOutput, Model, ModelInfo, Vocabulary
from .chat_template import ChatTemplate, chatml_template

SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
_HIGH = 20.0
# Where a grammar masks the planned byte, the model falls back to closing what is open, so
# an off-plan constrained output still ends soon.
_FALLBACK = {ord("}"): 3.0, ord("]"): 2.0, ord('"'): 1.0}

Responder = Callable[[str], str]
"""Gets the prompt text up to the assistant's turn, returns the reply to give."""


class ScriptedModel(Model):
    """A model that gives planned replies, over a vocabulary of the 256 bytes plus ChatML's
    special tokens.

    Args:
        replies: the replies to give, one per new prompt in order (the same prompt asked
            again gets the same reply; past the end, the last reply repeats), or a function
            from the prompt text to the reply.
        n_ctx: context window in tokens.
    """

    backend = "scripted"

    def __init__(self, replies: Sequence[str] | Responder, *, n_ctx: int = 16384) -> None:
        super().__init__()
        if callable(replies):
            self._responder: Responder = replies
        else:
            planned = list(replies)
            if not planned or not all(isinstance(r, str) for r in planned):
                raise InvalidInputError("replies must be a non-empty list of strings or a function.")
            self._responder = self._in_order(planned)
        self.prompts: list[str] = []
        """Every distinct prompt the model was asked to answer, in order."""
        token_bytes = tuple(bytes([b]) for b in range(256)) + tuple(s.encode() for s in SPECIALS)
        self._start, self._end, self._eot = 256, 257, 258
        self.vocab = Vocabulary(
            token_bytes=token_bytes, special_ids=frozenset({256, 257, 258}), eos_ids=(257, 258), bos_id=None
        )
        self.capabilities = Capabilities(multi_sequence=False, hidden_states=False, lora=False, probabilities=False)
        self.info = ModelInfo(
            backend=self.backend,
            path=Path("<scripted>"),
            name="scripted",
            architecture="scripted",
            n_vocab=len(token_bytes),
            n_ctx=n_ctx,
            n_ctx_train=n_ctx,
            n_embd=0,
            file_size=0,
            chat_template_source="builtin:chatml",
        )
        self._template = chatml_template()
        self._turn_marker = self.tokenize("<|im_start|>assistant\n", special=True)

    def _in_order(self, planned: list[str]) -> Responder:
        answers: dict[str, str] = {}

        def respond(prompt: str) -> str:
            if prompt not in answers:
                answers[prompt] = planned[min(len(answers), len(planned) - 1)]
            return answers[prompt]

        return respond

    @property
    def chat_template(self) -> ChatTemplate:
        return self._template

    def tokenize(self, text: str | bytes, *, special: bool = False) -> list[int]:
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        if not special:
            return list(data)
        ids: list[int] = []
        i = 0
        while i < len(data):
            for k, s in enumerate(SPECIALS):
                raw = s.encode()
                if data.startswith(raw, i):
                    ids.append(256 + k)
                    i += len(raw)
                    break
            else:
                ids.append(data[i])
                i += 1
        return ids

    # -- the planned forward pass ----------------------------------------------------------

    def _next_token(self, tokens: Sequence[int]) -> int:
        """The planned token after ``tokens``: the next byte of this turn's reply, then the end."""
        marker = self._turn_marker
        n = len(marker)
        start = -1
        for i in range(len(tokens) - n, -1, -1):
            if list(tokens[i : i + n]) == marker:
                start = i + n
                break
        if start < 0:
            return self._eot
        prompt = self.decode(tokens[:start])
        if prompt not in self.prompts:
            self.prompts.append(prompt)
        reply = self._responder(prompt).encode("utf-8")
        produced = len(tokens) - start
        return reply[produced] if produced < len(reply) else self._end

    def _eval(self, tokens: list[int], positions: list[int], hidden: bool) -> EvalOutput:
        history = self._cached + tokens
        base = len(self._cached)
        rows = np.zeros((len(positions), self.vocab.size), dtype=np.float32)
        for byte, score in _FALLBACK.items():
            rows[:, byte] = score
        for r, p in enumerate(positions):
            rows[r, self._next_token(history[: base + p + 1])] = _HIGH
        return EvalOutput(logits=rows, positions=list(positions))

    def _rollback(self, n: int) -> None:
        return None

    def _reset(self) -> None:
        return None

    def _close(self) -> None:
        return None


__all__ = ["Responder", "ScriptedModel"]
