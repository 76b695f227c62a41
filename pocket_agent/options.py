"""The options every entry point accepts: how tokens are chosen, and how far a call may go.

``extract``, ``extract_many``, ``extract_stream``, ``generate``, ``Agent``, ``decide`` and
the server all take ``sampling=Sampling(...)`` and ``limits=Limits(...)``; ``None`` means
the defaults below. Both objects are frozen and validated when built, so a bad value fails
where it is written, not deep inside a generation::

    from pocket_agent import Limits, Sampling, extract

    extract(text, Invoice, sampling=Sampling(temperature=0.7, seed=1), limits=Limits(max_tokens=256))
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from .errors import InvalidInputError

DEFAULT_MAX_TOKENS = 512
DEFAULT_MAX_STRING_CHARS = 256
DEFAULT_MAX_ARRAY_ITEMS = 16
DEFAULT_REPEAT_LIMIT = 8
DEFAULT_MAX_STEPS = 8
DEFAULT_MAX_RESULT_CHARS = 2000


def _positive_int(name: str, value: Any, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        extra = " or None" if optional else ""
        raise InvalidInputError(f"{name} must be a positive integer{extra}, got {value!r}.")


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen. ``temperature=0`` (the default) is greedy.

    Args:
        temperature: softmax temperature; 0 picks the most likely allowed token.
        top_p: nucleus sampling: keep the smallest set of tokens whose probability
            adds up to ``top_p`` (1.0 keeps all).
        top_k: keep only the ``top_k`` most likely tokens (0 keeps all).
        seed: seed of the sampler's random generator (``None``: a fresh one each call).
        speculate: evaluate each sampled token together with a draft of the tokens likely
            to follow: the tokens the grammar forces next, and under greedy sampling the
            context's continuation of the output (copy speculation: extracted values are
            mostly copied from the document). Draft tokens are kept only where they are
            the token that would have been chosen anyway; the rest is rolled back. Off by
            default: on this project's 2-core CPU llama.cpp evaluates a batch of n tokens
            in nearly n times a single token's time, so it did not save time per SROIE
            receipt, and since a batch rounds slightly differently from a single token,
            near-tied choices (mostly digits of totals) came out differently on 7 of 40
            receipts (bench/speculate.md). Worth trying where a batch is cheap.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    speculate: bool = False

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InvalidInputError(f"{name} must be a finite number, got {value!r}.")
        if self.temperature < 0:
            raise InvalidInputError(f"temperature must be >= 0, got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise InvalidInputError(f"top_p must be in (0, 1], got {self.top_p}.")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidInputError(f"top_k must be an integer >= 0, got {self.top_k!r}.")
        if not isinstance(self.speculate, bool):
            raise InvalidInputError(f"speculate must be True or False, got {self.speculate!r}.")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise InvalidInputError(f"seed must be a non-negative integer or None, got {self.seed!r}.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def replace(self, **changes: Any) -> Sampling:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Limits:
    """How far one call may go. Each entry point reads the fields that apply to it.

    Args:
        max_tokens: output tokens of one generation (one extraction attempt, one agent
            turn, one reply). Running out inside a constrained output raises
            :class:`~pocket_agent.errors.OutputBudgetExceeded` with the partial text;
            free text ends with ``finish_reason="length"``.
        max_string_chars: constrained outputs close a free JSON string (no enum,
            pattern, format or smaller maxLength) after this many characters, so a small
            model looping inside a string still finishes with a valid value. ``None``
            lifts the cap.
        max_array_items: the same bound for the items of JSON arrays (tool arguments).
        repeat_limit: loop guard. When the output ends in a loop (one token this many
            times in a row, or a cycle of up to 16 tokens repeated 3 times), the token that
            would continue it is banned (in constrained output until the grammar next
            forces tokens; in free text for that step). ``None`` turns the guard off.
        max_steps: most model turns in one :meth:`Agent.run <pocket_agent.Agent.run>`.
        max_result_chars: budget for each tool result shown to the model.
        tool_timeout: seconds a tool may run (``None``: no limit).
    """

    max_tokens: int = DEFAULT_MAX_TOKENS
    max_string_chars: int | None = DEFAULT_MAX_STRING_CHARS
    max_array_items: int | None = DEFAULT_MAX_ARRAY_ITEMS
    repeat_limit: int | None = DEFAULT_REPEAT_LIMIT
    max_steps: int = DEFAULT_MAX_STEPS
    max_result_chars: int = DEFAULT_MAX_RESULT_CHARS
    tool_timeout: float | None = None

    def __post_init__(self) -> None:
        _positive_int("max_tokens", self.max_tokens)
        _positive_int("max_string_chars", self.max_string_chars, optional=True)
        _positive_int("max_array_items", self.max_array_items, optional=True)
        _positive_int("max_steps", self.max_steps)
        _positive_int("max_result_chars", self.max_result_chars)
        if self.repeat_limit is not None:
            _positive_int("repeat_limit", self.repeat_limit)
            if self.repeat_limit < 2:
                raise InvalidInputError(f"repeat_limit must be at least 2 or None, got {self.repeat_limit}.")
        t = self.tool_timeout
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0 or math.isinf(t)):
            raise InvalidInputError(f"tool_timeout must be a positive number of seconds or None, got {t!r}.")

    def replace(self, **changes: Any) -> Limits:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def resolve_sampling(sampling: Sampling | None) -> Sampling:
    """``sampling`` checked, or the default (greedy)."""
    if sampling is None:
        return Sampling()
    if not isinstance(sampling, Sampling):
        raise InvalidInputError(f"sampling must be a pocket_agent.Sampling, got {type(sampling).__name__}.")
    return sampling


def resolve_limits(limits: Limits | None, *, max_tokens: int | None = None) -> Limits:
    """``limits`` checked, or the defaults; ``max_tokens`` (a shortcut every entry point
    keeps, since it is the limit set most often) overrides ``limits.max_tokens``."""
    if limits is None:
        limits = Limits()
    elif not isinstance(limits, Limits):
        raise InvalidInputError(f"limits must be a pocket_agent.Limits, got {type(limits).__name__}.")
    if max_tokens is not None:
        limits = limits.replace(max_tokens=max_tokens)
    return limits


__all__ = ["Limits", "Sampling", "resolve_limits", "resolve_sampling"]
