"""Generation for many prompts at once: one batched evaluation per step across lanes.

The next token of four prompts costs less than four next tokens of one (SmolLM2-135M,
1 thread: 58 ms against 31 ms). :func:`generate_batched` keeps up to ``width``
generations running in lanes (KV sequences beside the main one, see
:mod:`pocket_agent.runtime.lanes`) and advances all of them at every step: the lanes'
single sampled tokens in one batch, prompts and forced runs each on their own (see
:meth:`~pocket_agent.runtime.lanes.Lanes.step` for why). Each generation has its own
grammar matcher, sampler and loop guard, and goes through the same step as
:func:`~pocket_agent.generate.stream_tokens` (:func:`~pocket_agent.generate.advance`).

Copy speculation is not used here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import BackendError, ContextOverflowError, InvalidInputError, ModelStateError, PocketAgentError
from .generate import GenerationRun, RepeatGuard, Sampler, advance
from .options import Limits, Sampling, resolve_limits, resolve_sampling
from .runtime import Model
from .runtime.base import common_prefix_length
from .runtime.lanes import Lanes, lane_count
from .usage import Usage

if TYPE_CHECKING:
    from .grammars import CompiledGrammar

MIN_SHARED = 16
"""Prompts sharing at least this many leading tokens evaluate them once, for all lanes."""

RESERVE_DIVISOR = 4
"""A prompt is started when its tokens and a quarter of ``max_tokens`` fit beside the running
ones: outputs are mostly far shorter than their budget. A lane that runs out of room later
is handed back to be generated alone (:attr:`BatchResult.tokens` is None)."""


@dataclass
class BatchJob:
    """One generation: its prompt, its grammar, and whatever the caller wants back with it."""

    prompt: list[int]
    grammar: CompiledGrammar | None
    data: Any = None


@dataclass
class BatchResult:
    """How one :class:`BatchJob` ended.

    ``tokens`` are the output tokens; ``None`` with no ``error`` means the job was not
    generated here (no room, or the batch could not go on): generate it alone. When
    ``tokens`` is set, the model's sequence 0 holds the prompt and output (up to the
    last token that needed evaluating), so scoring after it evaluates nothing again.
    """

    job: BatchJob
    tokens: list[int] | None = None
    error: PocketAgentError | None = None


@dataclass
class _Lane:
    job: BatchJob
    run: GenerationRun
    guard: RepeatGuard
    sampler: Sampler
    feed: list[int] = field(default_factory=list)


def batch_width(model: Model, requested: int) -> int:
    """The number of lanes a batched run on ``model`` uses: ``requested``, at most what the
    backend has; 1 means no batching."""
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
        raise InvalidInputError(f"batch must be a positive integer, got {requested!r}.")
    return max(1, min(requested, lane_count(model)))


def generate_batched(
    model: Model,
    jobs: Iterable[BatchJob],
    *,
    width: int,
    sampling: Sampling | None = None,
    limits: Limits | None = None,
) -> Iterator[BatchResult]:
    """Generate every job's output, up to ``width`` at a time; yields each job's result as it
    finishes (not in order). Jobs are taken from ``jobs`` only as lanes free up.

    Each job gets what :func:`~pocket_agent.generate.stream_tokens` would give it alone
    (same grammar, sampler seed, loop guard and budget, and on llama.cpp the same logits:
    see :meth:`~pocket_agent.runtime.lanes.Lanes.step`). The
    part of a prompt it shares with the prompt before it is evaluated once for all
    lanes. A job that does not fit a lane is yielded with ``tokens=None``, to be generated
    alone. The model's lock is held while working and released at every yield.
    """
    smp = resolve_sampling(sampling)
    lim = resolve_limits(limits)
    eos = set(model.vocab.eos_ids)
    source = iter(jobs)
    exhausted = False
    previous: list[int] = []  # the prompt started last
    active: dict[int, _Lane] = {}
    with model.lock:
        lanes = Lanes(model, width)
    try:
        while True:
            ended: list[tuple[int | None, BatchResult]] = []
            with model.lock:
                while lanes.free and not exhausted and not ended:
                    job = next(source, None)
                    if job is None:
                        exhausted = True
                        break
                    if len(job.prompt) + lim.max_tokens // RESERVE_DIVISOR > lanes.capacity:
                        ended.append((None, BatchResult(job)))  # too long for a lane
                        continue
                    shared = common_prefix_length(previous, job.prompt)
                    if shared >= MIN_SHARED and common_prefix_length(lanes.prefix, job.prompt) < shared:
                        lanes.share(job.prompt[:shared])
                    previous = job.prompt
                    lane, keep = lanes.start(job.prompt)
                    matcher = job.grammar.matcher() if job.grammar is not None else None
                    run = GenerationRun(model, matcher, lim.max_tokens, Usage())
                    guard = RepeatGuard(lim.repeat_limit, sticky=matcher is not None)
                    active[lane] = _Lane(job, run, guard, Sampler(smp), job.prompt[keep:])
                if active and not ended:
                    ended = _step(lanes, active, eos)
            for held, result in ended:
                if held is not None:
                    with model.lock:
                        if result.tokens is not None:
                            lanes.adopt(held)
                        else:
                            lanes.finish(held)
                yield result
            if exhausted and not active and not ended:
                return
    finally:
        with model.lock:
            lanes.close()


def _step(lanes: Lanes, active: dict[int, _Lane], eos: set[int]) -> list[tuple[int | None, BatchResult]]:
    """Evaluate every lane's feed in one batch and advance each lane; the lanes that ended.

    A lane whose next tokens do not fit it is handed back to be generated alone; when the
    backend fails, every job in flight is.
    """
    ended: list[tuple[int | None, BatchResult]] = []
    for lane in [lane for lane, st in active.items() if len(st.feed) > lanes.room(lane)]:
        ended.append((lane, BatchResult(active.pop(lane).job)))
    try:
        rows = lanes.step({lane: st.feed for lane, st in active.items()})
    except (BackendError, ModelStateError, ContextOverflowError):
        ended.extend((lane, BatchResult(st.job)) for lane, st in active.items())
        active.clear()
        return ended
    for lane, logits in rows.items():
        st = active[lane]
        try:
            step = advance(st.run, st.guard, st.sampler, eos, (), logits)
        except PocketAgentError as exc:
            ended.append((lane, BatchResult(st.job, error=exc)))
            del active[lane]
            continue
        if step.finish is not None:
            ended.append((lane, BatchResult(st.job, tokens=list(st.run.produced))))
            del active[lane]
        else:
            st.feed = step.feed
    return ended


__all__ = ["BatchJob", "BatchResult", "batch_width", "generate_batched"]
