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
from .options import Limits, Sampling, resolve_limits, resolve_sampling
from .runtime import Model, resolve_model
from .runtime.prompt import encode_chat
from .speculation import PromptLookup
from .usage import Usage

if TYPE_CHECKING:
    from .grammars import CompiledGrammar
    from .grammars.matcher import GrammarMatcher

FinishReason = Literal["grammar", "eos", "stop", "length"]


@dataclass
class GenerationResult:
    """Text and tokens a generation produced, why it stopped, and what it cost."""

    text: str
    tokens: list[int]
    finish_reason: FinishReason
    usage: Usage


@dataclass(frozen=True)
class TokenEvent:
    """One step of a streamed generation: the new tokens and the text they completed."""

    tokens: list[int]
    text: str
    forced: bool


class Sampler:
    def __init__(self, params: Sampling) -> None:
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: NDArray[np.float32]) -> int:
        p = self.params
        if p.temperature == 0:
            return int(np.argmax(logits))
        scaled = logits.astype(np.float64) / p.temperature
        if np.isposinf(scaled).any():  # a temperature so small that logits overflowed: greedy
            return int(np.argmax(logits))
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


class RepeatGuard:
    """The loop guard: bans the token that would continue a loop at the end of the output.

    Under a grammar a ban lasts until the grammar next forces tokens (the next key), so a
    model stuck in ``0000`` inside a value moves on to what the grammar allows next; in free
    text it lasts one step.
    """

    def __init__(self, repeat_limit: int | None, *, sticky: bool) -> None:
        self.repeat_limit = repeat_limit
        self.sticky = sticky
        self.banned: set[int] = set()

    def clear(self) -> None:
        self.banned.clear()

    def apply(self, logits: NDArray[np.float32], produced: Sequence[int]) -> NDArray[np.float32]:
        if not self.repeat_limit:
            return logits
        if not self.sticky:
            self.banned.clear()
        loop_next = _looping_token(produced, self.repeat_limit)
        if loop_next is not None:
            self.banned.add(loop_next)
        if not self.banned:
            return logits
        banned = logits.copy()
        banned[list(self.banned)] = -np.inf
        # Never ban the output into a dead end.
        return banned if np.isfinite(banned).any() else logits


class GenerationRun:
    """The state of one generation: what was produced, its text, and its usage."""

    def __init__(self, model: Model, matcher: GrammarMatcher | None, limit: int, usage: Usage) -> None:
        self.model = model
        self.matcher = matcher
        self.limit = limit
        self.usage = usage
        self.decoder = model.stream_decoder()
        self.produced: list[int] = []
        self.text_parts: list[str] = []
        self.sampled_run = 0  # output tokens since the last forced ones

    def prefill(self, prompt: list[int]) -> NDArray[np.float32]:
        before = self.model.stats.tokens_evaluated
        t0 = time.perf_counter()
        logits: NDArray[np.float32] = self.model.prefill(prompt).logits[-1]
        self.usage.prefill_s += time.perf_counter() - t0
        self.usage.prompt_tokens += len(prompt)
        self.usage.prompt_tokens_evaluated += self.model.stats.tokens_evaluated - before
        return logits

    def evaluate(self, tokens: list[int]) -> NDArray[np.float32]:
        t0 = time.perf_counter()
        logits: NDArray[np.float32] = self.model.eval(tokens).logits[-1]
        self.usage.decode_s += time.perf_counter() - t0
        self.usage.decode_calls += 1
        return logits

    def evaluate_all(self, tokens: list[int]) -> NDArray[np.float32]:
        """Evaluate ``tokens`` in one call; the logits after each of them (one row each)."""
        t0 = time.perf_counter()
        rows: NDArray[np.float32] = self.model.eval(tokens, logits="all").logits
        self.usage.decode_s += time.perf_counter() - t0
        self.usage.decode_calls += 1
        return rows

    def accept(self, tokens: list[int], *, forced: bool) -> TokenEvent:
        """Record output tokens; the event carries the text they completed."""
        if self.matcher is not None:
            if forced:
                self.matcher.consume_many(tokens)
            else:
                self.matcher.consume(tokens[0])
        self.produced.extend(tokens)
        self.usage.completion_tokens += len(tokens)
        if forced:
            self.usage.forced_tokens += len(tokens)
            self.sampled_run = 0
        else:
            self.sampled_run += len(tokens)
        piece = "".join(self.decoder.feed(t) for t in tokens)
        self.text_parts.append(piece)
        return TokenEvent(tokens=list(tokens), text=piece, forced=forced)

    def masked(self, logits: NDArray[np.float32]) -> NDArray[np.float32]:
        """Logits with what the grammar disallows set to -inf."""
        assert self.matcher is not None
        t0 = time.perf_counter()
        out = grammar_apply_mask(logits, self.matcher.compute_mask())
        dt = time.perf_counter() - t0
        self.usage.mask_s += dt
        self.usage.mask_times.append(dt)
        if not np.isfinite(out).any():
            raise GenerationError(f"The grammar allows no token here: {self.matcher.error() or 'dead end'}.")
        return out

    def over_budget(self) -> OutputBudgetExceeded:
        return OutputBudgetExceeded(
            f"max_tokens={self.limit} ran out before the output was complete; raise max_tokens or simplify the "
            f"schema. The partial output is on .partial.",
            partial="".join(self.text_parts) + self.decoder.flush(),
            tokens=len(self.produced),
        )

    def hit_stop(self, stop: Sequence[str], piece: str) -> bool:
        if not stop:
            return False
        text = "".join(self.text_parts)
        return any(s in text[-(len(s) + len(piece)) :] for s in stop)


def stream_tokens(
    model: Model,
    prompt_tokens: Sequence[int],
    *,
    grammar: CompiledGrammar | None = None,
    sampling: Sampling | None = None,
    limits: Limits | None = None,
    stop: Sequence[str] | None = None,
    usage: Usage | None = None,
    end_bias: float = 0.0,
) -> Generator[TokenEvent, None, FinishReason]:
    """Generate after ``prompt_tokens``, yielding each step as it happens.

    With ``grammar`` every sampled token is allowed by the grammar; tokens the grammar
    forces are evaluated as one batch and yielded with ``forced=True``. The generator's
    return value (``StopIteration.value``) is the finish reason. Running out of
    ``limits.max_tokens`` before a grammar is complete raises :class:`OutputBudgetExceeded`.
    ``limits.repeat_limit`` is the loop guard (see :class:`~pocket_agent.Limits`). The model
    is held (its lock) from the first step until the generator finishes or is closed.

    With ``sampling.speculate`` (off by default) each sampled token is evaluated together with the tokens the
    grammar forces right after it, and under greedy sampling with a draft: the tokens that
    followed the output's last sampled tokens earlier in the context (copy speculation: a
    grounded value is a span of the document), cut to what the grammar accepts. Draft
    tokens are kept while each is the token this loop would have chosen from the same
    logits; the rest is rolled back from the KV cache.

    ``end_bias`` is added to the end-of-sequence logits wherever the grammar allows ending
    (a negative one makes the output go on where it may: another tool call in a turn of calls).
    """
    lim = resolve_limits(limits)
    smp = resolve_sampling(sampling)
    sampler = Sampler(smp)
    matcher = grammar.matcher() if grammar is not None else None
    drafts = smp.speculate and smp.greedy and model.capabilities.cheap_all_logits
    lookup = PromptLookup(prompt_tokens) if drafts else None
    run = GenerationRun(model, matcher, lim.max_tokens, usage if usage is not None else Usage())
    guard = RepeatGuard(lim.repeat_limit, sticky=matcher is not None)
    eos = set(model.vocab.eos_ids)
    stop_list = [s for s in (stop or []) if s]
    with model.lock:
        run.usage.requests += 1
        logits = run.prefill(list(prompt_tokens))
        while True:
            step = advance(run, guard, sampler, eos, stop_list, logits, end_bias)
            if step.event is not None:
                yield step.event
            if step.finish is not None:
                return step.finish
            if step.event is None or step.event.forced:
                logits = run.evaluate(step.feed)
                continue
            tok = step.feed[0]
            if smp.speculate and matcher is not None:
                forced = matcher.forced_tokens()
                if forced and len(run.produced) + len(forced) <= run.limit:
                    # what the loop would do next, with the sampled token in the same evaluation
                    guard.clear()
                    yield run.accept(forced, forced=True)
                    if matcher.is_stopped():
                        return "grammar"
                    logits = run.evaluate([tok, *forced])
                    continue
            draft = _draft(run, lookup) if lookup is not None else []
            if not draft or lookup is None:
                logits = run.evaluate([tok])
                continue
            rows = run.evaluate_all([tok, *draft])
            kept, reason = yield from _verify(run, guard, sampler, draft, rows, stop_list, eos, end_bias)
            run.usage.draft_tokens += len(draft)
            run.usage.draft_accepted += kept
            lookup.feedback(len(draft), kept)
            if kept < len(draft):
                model.rollback(model.n_cached - (len(draft) - kept))
            if reason is not None:
                return reason
            logits = rows[kept]


@dataclass
class Step:
    """One step of a generation: what was produced, what to evaluate next, whether it ended."""

    event: TokenEvent | None = None
    feed: list[int] = field(default_factory=list)
    """The tokens just produced, which the model evaluates next unless the generation ended."""
    finish: FinishReason | None = None


def advance(
    run: GenerationRun,
    guard: RepeatGuard,
    sampler: Sampler,
    eos: set[int],
    stop: Sequence[str],
    logits: NDArray[np.float32],
    end_bias: float = 0.0,
) -> Step:
    """Produce the next output from ``logits`` (the logits after everything so far): the
    tokens the grammar forces, else one sampled token; or the finish reason. ``end_bias`` is
    added to the end-of-sequence logits (see :func:`stream_tokens`).

    Raises :class:`OutputBudgetExceeded` when the budget runs out before the grammar is
    complete, :class:`GenerationError` when the model ends an incomplete output.
    """
    matcher = run.matcher
    if matcher is not None:
        if matcher.is_stopped():
            return Step(finish="grammar")
        forced = matcher.forced_tokens()
        if forced:
            guard.clear()
            if len(run.produced) + len(forced) > run.limit:
                raise run.over_budget()
            event = run.accept(forced, forced=True)
            return Step(event, forced, "grammar" if matcher.is_stopped() else None)
        logits = _bias_ends(run.masked(logits), eos, end_bias)
    logits = guard.apply(logits, run.produced)
    if len(run.produced) >= run.limit:
        if matcher is not None:
            raise run.over_budget()
        return Step(finish="length")
    tok = sampler(logits)
    if tok in eos:
        if matcher is None:
            return Step(finish="eos")
        if not matcher.is_accepting():
            raise GenerationError("The model ended the output before the grammar was complete.")
        return Step(finish="grammar")
    event = run.accept([tok], forced=False)
    if run.hit_stop(stop, event.text):
        return Step(event, [tok], "stop")
    if matcher is not None and matcher.is_stopped():
        return Step(event, [tok], "grammar")
    return Step(event, [tok])


def _bias_ends(logits: NDArray[np.float32], eos: set[int], end_bias: float) -> NDArray[np.float32]:
    """``logits`` with ``end_bias`` added to the end-of-sequence tokens the mask allows."""
    if not end_bias or not eos:
        return logits
    ends = list(eos)
    if not np.isfinite(logits[ends]).any():
        return logits
    biased = logits.copy()
    biased[ends] += end_bias
    return biased


def _draft(run: GenerationRun, lookup: PromptLookup) -> list[int]:
    """Draft tokens to evaluate together with the token just sampled: the context's
    continuation of the output's last sampled tokens, cut to what the grammar accepts;
    never an end-of-sequence token, never past ``max_tokens``."""
    # Look up only tokens the model chose: after forced keys and punctuation ('"date": "')
    # the context's continuation is some other value.
    if run.sampled_run < lookup.min_match:
        return []
    lookup.follow(run.produced)
    draft = lookup.propose()[: run.limit - len(run.produced)]
    eos = set(run.model.vocab.eos_ids)
    for i, t in enumerate(draft):
        if t in eos:
            draft = draft[:i]
            break
    if run.matcher is not None and draft:
        draft = draft[: run.matcher.validate(draft)]
    return draft


def _verify(
    run: GenerationRun,
    guard: RepeatGuard,
    sampler: Sampler,
    draft: list[int],
    rows: NDArray[np.float32],
    stop: Sequence[str],
    eos: set[int],
    end_bias: float,
) -> Generator[TokenEvent, None, tuple[int, FinishReason | None]]:
    """Accept the draft's tokens while each is what the loop would choose from its row.

    ``rows[i]`` are the logits before ``draft[i]``. Each position goes through the same
    steps as the loop in :func:`stream_tokens` (forced tokens, mask, loop guard, budget,
    sampler); the first disagreement, or anything that needs the loop's own handling, ends
    the check. Returns how many draft tokens became output, and the finish reason if the
    output ended inside the draft.
    """
    matcher = run.matcher
    i = 0
    while i < len(draft):
        if matcher is not None:
            forced = matcher.forced_tokens()
            if forced:
                if draft[i : i + len(forced)] != forced or len(run.produced) + len(forced) > run.limit:
                    break
                guard.clear()
                yield run.accept(forced, forced=True)
                i += len(forced)
                if matcher.is_stopped():
                    return i, "grammar"
                continue
            logits = _bias_ends(run.masked(rows[i]), eos, end_bias)
        else:
            logits = rows[i]
        if not sampler.params.greedy or len(run.produced) >= run.limit:
            break
        tok = sampler(guard.apply(logits, run.produced))
        if tok != draft[i]:
            break
        event = run.accept([tok], forced=False)
        i += 1
        yield event
        if run.hit_stop(stop, event.text):
            return i, "stop"
        if matcher is not None and matcher.is_stopped():
            return i, "grammar"
    return i, None


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
    sampling: Sampling | None = None,
    limits: Limits | None = None,
    stop: Sequence[str] | None = None,
    on_event: Callable[[TokenEvent], None] | None = None,
) -> GenerationResult:
    """Run :func:`stream_tokens` to the end and collect the result."""
    usage = Usage()
    tokens: list[int] = []
    gen = stream_tokens(model, prompt_tokens, grammar=grammar, sampling=sampling, limits=limits, stop=stop, usage=usage)
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
    return GenerationResult(text=text, tokens=tokens, finish_reason=reason, usage=usage)


Messages = Sequence[Mapping[str, Any]]


def render_prompt(model: Model, prompt_or_messages: str | Messages, *, system: str | None = None) -> list[int]:
    """Token ids of a chat prompt: a string is one user message; a list is the messages.

    Control tokens come only from the chat template: every message's content is tokenized
    as plain text.
    """
    if isinstance(prompt_or_messages, str):
        if not prompt_or_messages.strip():
            raise InvalidInputError("The prompt is empty; give the text to respond to.")
        messages: list[Mapping[str, Any]] = [{"role": "user", "content": prompt_or_messages}]
    elif isinstance(prompt_or_messages, Sequence) and not isinstance(prompt_or_messages, bytes):
        messages = [m for m in prompt_or_messages if isinstance(m, Mapping)]
        if len(messages) != len(prompt_or_messages):
            raise InvalidInputError("messages must be dicts with 'role' and 'content'.")
        for i, m in enumerate(messages):
            content = m.get("content")
            if content is not None and not isinstance(content, str):
                raise InvalidInputError(f"messages[{i}]['content'] must be a string, got {type(content).__name__}.")
    else:
        raise InvalidInputError(
            f"prompt must be a string or a list of messages, got {type(prompt_or_messages).__name__}."
        )
    if system is not None:
        if not isinstance(system, str):
            raise InvalidInputError(f"system must be a string, got {type(system).__name__}.")
        if not (messages and messages[0].get("role") == "system"):
            messages = [{"role": "system", "content": system}, *messages]
    return encode_chat(model, messages, add_generation_prompt=True)


def generate(
    prompt_or_messages: str | Messages,
    *,
    output_type: Any = None,
    model: Model | str | None = None,
    system: str | None = None,
    sampling: Sampling | None = None,
    limits: Limits | None = None,
    max_tokens: int | None = None,
    stop: Sequence[str] | None = None,
) -> GenerationResult:
    """Generate a reply through the model's chat template.

    Args:
        prompt_or_messages: a user message, or a list of ``{"role", "content"}`` messages.
        output_type: ``None`` for free text, or anything
            :func:`pocket_agent.grammars.compile_grammar` takes (Pydantic model, JSON Schema
            dict, ``Regex``, ``Choice``, ``Lark``).
        model: a loaded model or path; default: the process-wide default model.
        system: a system message put first (unless the messages start with one).
        sampling: how tokens are chosen (default greedy).
        limits: ``max_tokens`` and the loop guard (``repeat_limit``) apply.
        max_tokens: shortcut for ``limits.max_tokens``.
        stop: strings that end free text (not included in the result).
    """
    lim = resolve_limits(limits, max_tokens=max_tokens)
    smp = resolve_sampling(sampling)
    if stop is not None and (isinstance(stop, str) or not all(isinstance(s, str) for s in stop)):
        raise InvalidInputError("stop must be a list of strings.")
    m = resolve_model(model)
    grammar = None
    if output_type is not None:
        from .grammars import compile_grammar

        grammar = compile_grammar(output_type, m)
    with m.lock:
        ids = render_prompt(m, prompt_or_messages, system=system)
        return run_generation(m, ids, grammar=grammar, sampling=smp, limits=lim, stop=stop)
