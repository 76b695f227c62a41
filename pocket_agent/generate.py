"""The generation loop: the one place in pocket_agent that samples tokens.

Extraction, tool calls and free text all come through :func:`run_generation`. With a
constraint it masks the logits to what the grammar allows, feeds tokens the grammar forces
(keys, punctuation, enum remainders) to the model as one batch instead of one decode each,
and stops as soon as the grammar is complete.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import NDArray

from .errors import GenerationError, InvalidInputError, OutputBudgetExceeded
from .runtime import Model, resolve_model

if TYPE_CHECKING:
    from .grammars import CompiledGrammar

FinishReason = Literal["grammar", "eos", "stop", "length"]
DEFAULT_MAX_TOKENS = 512


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. ``temperature=0`` is greedy (the default)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise InvalidInputError(f"temperature must be >= 0, got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise InvalidInputError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < 0:
            raise InvalidInputError(f"top_k must be >= 0, got {self.top_k}.")


@dataclass
class GenerationStats:
    """Where the time went in one generation."""

    prompt_tokens: int = 0
    prompt_tokens_evaluated: int = 0
    completion_tokens: int = 0
    forced_tokens: int = 0
    decode_calls: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    mask_s: list[float] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def forced_share(self) -> float:
        return self.forced_tokens / self.completion_tokens if self.completion_tokens else 0.0


@dataclass
class GenerationResult:
    """Text and tokens a generation produced, why it stopped, and its statistics."""

    text: str
    tokens: list[int]
    finish_reason: FinishReason
    stats: GenerationStats


@dataclass(frozen=True)
class TokenEvent:
    """One step of a streamed generation: the new tokens and the text they completed."""

    tokens: list[int]
    text: str
    forced: bool


class _Sampler:
    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: NDArray[np.float32]) -> int:
        p = self.params
        if p.temperature == 0:
            return int(np.argmax(logits))
        scaled = logits.astype(np.float64) / p.temperature
        finite = np.flatnonzero(np.isfinite(scaled))
        vals = scaled[finite]
        if p.top_k and p.top_k < len(finite):
            keep = np.argpartition(-vals, p.top_k - 1)[: p.top_k]
            finite, vals = finite[keep], vals[keep]
        probs = np.exp(vals - vals.max())
        probs /= probs.sum()
        if p.top_p < 1.0:
            order = np.argsort(-probs)
            cum = np.cumsum(probs[order])
            cut = int(np.searchsorted(cum, p.top_p)) + 1
            chosen = order[:cut]
            finite, probs = finite[chosen], probs[chosen] / probs[chosen].sum()
        return int(finite[self.rng.choice(len(finite), p=probs)])


def stream_tokens(
    model: Model,
    prompt_tokens: Sequence[int],
    *,
    grammar: CompiledGrammar | None = None,
    max_tokens: int | None = None,
    sampling: SamplingParams | None = None,
    stop: Sequence[str] | None = None,
    stats: GenerationStats | None = None,
    repeat_limit: int | None = None,
) -> Generator[TokenEvent, None, FinishReason]:
    """Generate after ``prompt_tokens``, yielding each step as it happens.

    With ``grammar`` every sampled token is allowed by the grammar; tokens the grammar
    forces are evaluated as one batch and yielded with ``forced=True``. The generator's
    return value (``StopIteration.value``) is the finish reason. Running out of
    ``max_tokens`` before a grammar is complete raises :class:`OutputBudgetExceeded`.
    ``repeat_limit`` (constrained runs only): when the output ends in a loop (one token
    ``repeat_limit`` times in a row, or a cycle of up to 16 tokens repeated 3 times), the
    token that would continue the loop is banned until the grammar next forces tokens (the
    next key), so a small model stuck emitting ``0000`` or ``_11_11_11`` inside a value
    moves on to what the grammar allows next.
    """
    limit = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    if not isinstance(limit, int) or limit < 1:
        raise InvalidInputError(f"max_tokens must be a positive integer, got {max_tokens!r}.")
    sampler = _Sampler(sampling or SamplingParams())
    st = stats if stats is not None else GenerationStats()
    eos = set(model.vocab.eos_ids)
    matcher = grammar.matcher() if grammar is not None else None
    decoder = model.stream_decoder()
    produced: list[int] = []
    text_parts: list[str] = []
    stop_list = [s for s in (stop or []) if s]
    banned: set[int] = set()

    prompt = list(prompt_tokens)
    st.prompt_tokens = len(prompt)
    before = model.stats.tokens_evaluated
    t0 = time.perf_counter()
    logits = model.prefill(prompt).logits[-1]
    st.prefill_s += time.perf_counter() - t0
    st.prompt_tokens_evaluated = model.stats.tokens_evaluated - before

    def partial() -> str:
        return "".join(text_parts) + decoder.flush()

    def over_budget() -> OutputBudgetExceeded:
        return OutputBudgetExceeded(
            f"max_tokens={limit} ran out before the output was complete; raise max_tokens or simplify the "
            f"schema. The partial output is on .partial.",
            partial=partial(),
            tokens=len(produced),
        )

    while True:
        if matcher is not None:
            if matcher.is_stopped():
                return "grammar"
            forced = matcher.forced_tokens()
            if forced:
                banned.clear()
                if len(produced) + len(forced) > limit:
                    raise over_budget()
                matcher.consume_many(forced)
                produced.extend(forced)
                st.completion_tokens += len(forced)
                st.forced_tokens += len(forced)
                piece = "".join(decoder.feed(t) for t in forced)
                text_parts.append(piece)
                yield TokenEvent(tokens=list(forced), text=piece, forced=True)
                if matcher.is_stopped():
                    return "grammar"
                t0 = time.perf_counter()
                logits = model.eval(forced).logits[-1]
                st.decode_s += time.perf_counter() - t0
                st.decode_calls += 1
                continue
            t0 = time.perf_counter()
            mask = matcher.compute_mask()
            logits = grammar_apply_mask(logits, mask)
            st.mask_s.append(time.perf_counter() - t0)
            if not np.isfinite(logits).any():
                raise GenerationError(f"The grammar allows no token here: {matcher.error() or 'dead end'}.")
            if repeat_limit:
                loop_next = _looping_token(produced, repeat_limit)
                if loop_next is not None:
                    banned.add(loop_next)
            if banned:
                keep = logits.copy()
                logits[list(banned)] = -np.inf
                if not np.isfinite(logits).any():  # never ban the grammar into a dead end
                    logits = keep
        if len(produced) >= limit:
            if matcher is not None:
                raise over_budget()
            return "length"
        tok = sampler(logits)
        if tok in eos:
            if matcher is not None:
                if not matcher.is_accepting():
                    raise GenerationError("The model ended the output before the grammar was complete.")
                return "grammar"
            return "eos"
        if matcher is not None:
            matcher.consume(tok)
        produced.append(tok)
        st.completion_tokens += 1
        piece = decoder.feed(tok)
        text_parts.append(piece)
        yield TokenEvent(tokens=[tok], text=piece, forced=False)
        if stop_list:
            text = "".join(text_parts)
            if any(s in text[-(len(s) + len(piece)) :] for s in stop_list):
                return "stop"
        if matcher is not None and matcher.is_stopped():
            return "grammar"
        t0 = time.perf_counter()
        logits = model.eval([tok]).logits[-1]
        st.decode_s += time.perf_counter() - t0
        st.decode_calls += 1


MAX_LOOP_PERIOD = 16


def _looping_token(produced: Sequence[int], repeat_limit: int) -> int | None:
    """The token that would continue a loop at the end of ``produced``, if it ends in one."""
    n_out = len(produced)
    for period in range(1, MAX_LOOP_PERIOD + 1):
        span = max(repeat_limit, 3 * period)
        if n_out < span:
            break
        tail = produced[n_out - span :]
        if all(tail[i] == tail[i - period] for i in range(period, span)):
            return produced[n_out - period]
    return None


def grammar_apply_mask(logits: NDArray[np.float32], mask: Any) -> NDArray[np.float32]:
    """Disallowed logits set to -inf (delegates to the grammars layer's fast path)."""
    from .grammars import apply_mask

    return apply_mask(logits, mask)


def run_generation(
    model: Model,
    prompt_tokens: Sequence[int],
    *,
    grammar: CompiledGrammar | None = None,
    max_tokens: int | None = None,
    sampling: SamplingParams | None = None,
    stop: Sequence[str] | None = None,
    on_event: Callable[[TokenEvent], None] | None = None,
    repeat_limit: int | None = None,
) -> GenerationResult:
    """Run :func:`stream_tokens` to the end and collect the result."""
    stats = GenerationStats()
    tokens: list[int] = []
    gen = stream_tokens(
        model,
        prompt_tokens,
        grammar=grammar,
        max_tokens=max_tokens,
        sampling=sampling,
        stop=stop,
        stats=stats,
        repeat_limit=repeat_limit,
    )
    reason: FinishReason
    while True:
        try:
            ev = next(gen)
        except StopIteration as done:
            reason = done.value
            break
        tokens.extend(ev.tokens)
        if on_event is not None:
            on_event(ev)
    text = model.decode(tokens)
    if reason == "stop" and stop:
        cut = min((text.find(s) for s in stop if s and s in text), default=-1)
        if cut >= 0:
            text = text[:cut]
    return GenerationResult(text=text, tokens=tokens, finish_reason=reason, stats=stats)


Messages = Sequence[Mapping[str, Any]]


def render_prompt(model: Model, prompt_or_messages: str | Messages, *, system: str | None = None) -> list[int]:
    """Token ids of a chat prompt: a string is one user message; a list is the messages."""
    if isinstance(prompt_or_messages, str):
        if not prompt_or_messages.strip():
            raise InvalidInputError("The prompt is empty; give the text to respond to.")
        messages: list[Mapping[str, Any]] = [{"role": "user", "content": prompt_or_messages}]
    elif isinstance(prompt_or_messages, Sequence) and not isinstance(prompt_or_messages, bytes):
        messages = [m for m in prompt_or_messages if not isinstance(m, str)]
        if len(messages) != len(prompt_or_messages):
            raise InvalidInputError("messages must be dicts with 'role' and 'content', not strings.")
    else:
        raise InvalidInputError(
            f"prompt must be a string or a list of messages, got {type(prompt_or_messages).__name__}."
        )
    if system is not None and not (messages and messages[0].get("role") == "system"):
        messages = [{"role": "system", "content": system}, *messages]
    text = model.chat_template.render(messages, add_generation_prompt=True)
    ids = model.tokenize(text, special=True)
    if model.vocab.add_bos and model.vocab.bos_id is not None and (not ids or ids[0] != model.vocab.bos_id):
        ids = [model.vocab.bos_id, *ids]
    return ids


def generate(
    prompt_or_messages: str | Messages,
    *,
    output_type: Any = None,
    model: Model | str | None = None,
    system: str | None = None,
    max_tokens: int | None = None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int | None = None,
    stop: Sequence[str] | None = None,
) -> GenerationResult:
    """Generate a reply through the model's chat template.

    ``output_type`` constrains the reply: ``None`` for free text, or anything
    :func:`pocket_agent.grammars.compile_grammar` takes (Pydantic model, JSON Schema dict,
    ``Regex``, ``Choice``, ``Lark``).
    """
    m = resolve_model(model)
    grammar = None
    if output_type is not None:
        from .grammars import compile_grammar

        grammar = compile_grammar(output_type, m)
    ids = render_prompt(m, prompt_or_messages, system=system)
    return run_generation(
        m,
        ids,
        grammar=grammar,
        max_tokens=max_tokens,
        sampling=SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed),
        stop=stop,
    )
