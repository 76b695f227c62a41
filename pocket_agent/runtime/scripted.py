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

Given ``scores=`` instead, the forward pass is your function of the prompt and of the bytes the
turn holds so far, returning the next token's logits: a function model (like pydantic-ai's
``FunctionModel``) for grammar, routing and protocol tests. Its logits are its distribution, so
scored routing and argument grounding run on it as on a real model. A model that always writes
the lowest-id token the grammar allows::

    model = ScriptedModel(scores=lambda prompt, produced: -np.arange(N_VOCAB, dtype=np.float32))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

from ..errors import InvalidInputError
from .base import Capabilities, EvalOutput, Model, ModelInfo, Vocabulary
from .chat_template import ChatTemplate, chatml_template

SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
N_VOCAB = 256 + len(SPECIALS)
"""The vocabulary's size: token ``b`` (0-255) is the byte ``b``, then ``SPECIALS`` in order."""
_HIGH = 20.0
# Where a grammar masks the planned byte, the model falls back to closing what is open, so
# an off-plan constrained output still ends soon.
_FALLBACK = {ord("}"): 3.0, ord("]"): 2.0, ord('"'): 1.0}

Responder = Callable[[str], str]
"""Gets the prompt text up to the assistant's turn, returns the reply to give."""

Scorer = Callable[[str, bytes], ArrayLike]
"""Gets the prompt text up to the assistant's turn and the bytes the turn holds so far, returns
the next token's logits: :data:`N_VOCAB` floats (``-inf`` bans a token). A grammar masks them
and the sampler draws from the rest, so greedy decoding takes the highest-scored token the
grammar allows."""


class ScriptedModel(Model):
    """A model that gives planned replies, or the logits of a function, over a vocabulary of
    the 256 bytes plus ChatML's special tokens.

    Args:
        replies: the replies to give, one per new prompt in order (the same prompt asked
            again gets the same reply; past the end, the last reply repeats), or a function
            from the prompt text to the reply.
        scores: instead of ``replies``, a function from the prompt text and the bytes the
            turn holds so far to the next token's logits (:data:`Scorer`). The model then
            reports real probabilities (``capabilities.probabilities``).
        n_ctx: context window in tokens.
    """

    backend = "scripted"

    def __init__(
        self, replies: Sequence[str] | Responder | None = None, *, scores: Scorer | None = None, n_ctx: int = 16384
    ) -> None:
        super().__init__()
        if (replies is None) == (scores is None):
            raise InvalidInputError("give a ScriptedModel replies or scores: one of the two.")
        self._scorer = scores
        self._responder: Responder | None = None
        if scores is not None and not callable(scores):
            raise InvalidInputError("scores must be a function of the prompt and the bytes produced so far.")
        if callable(replies):
            self._responder = replies
        elif replies is not None:
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
        self.capabilities = Capabilities(
            multi_sequence=False, hidden_states=False, lora=False, probabilities=scores is not None
        )
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

    def _turn(self, tokens: Sequence[int]) -> tuple[str, int] | None:
        """The prompt up to the last assistant turn in ``tokens`` and where that turn starts."""
        marker = self._turn_marker
        n = len(marker)
        for i in range(len(tokens) - n, -1, -1):
            if list(tokens[i : i + n]) == marker:
                prompt = self.decode(tokens[: i + n])
                if prompt not in self.prompts:
                    self.prompts.append(prompt)
                return prompt, i + n
        return None

    def _next_token(self, tokens: Sequence[int]) -> int:
        """The planned token after ``tokens``: the next byte of this turn's reply, then the end."""
        turn = self._turn(tokens)
        if turn is None or self._responder is None:
            return self._eot
        prompt, start = turn
        reply = self._responder(prompt).encode("utf-8")
        produced = len(tokens) - start
        return reply[produced] if produced < len(reply) else self._end

    def _scored(self, tokens: Sequence[int], scorer: Scorer) -> np.ndarray:
        """The scorer's logits after ``tokens`` (outside an assistant turn: the end of text)."""
        turn = self._turn(tokens)
        if turn is None:
            row = np.zeros(N_VOCAB, dtype=np.float32)
            row[self._eot] = _HIGH
            return row
        prompt, start = turn
        row = np.asarray(scorer(prompt, self.detokenize(tokens[start:])), dtype=np.float32)
        if row.shape != (N_VOCAB,):
            raise InvalidInputError(f"scores must return {N_VOCAB} logits (one per token), got shape {row.shape}.")
        if np.isnan(row).any() or np.isposinf(row).any():
            raise InvalidInputError("scores must return finite logits or -inf, not NaN or +inf.")
        return row

    def _eval(self, tokens: list[int], positions: list[int], hidden: bool) -> EvalOutput:
        history = self._cached + tokens
        base = len(self._cached)
        rows = np.zeros((len(positions), self.vocab.size), dtype=np.float32)
        if self._scorer is not None:
            for r, p in enumerate(positions):
                rows[r] = self._scored(history[: base + p + 1], self._scorer)
            return EvalOutput(logits=rows, positions=list(positions))
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


__all__ = ["N_VOCAB", "Responder", "Scorer", "ScriptedModel"]
