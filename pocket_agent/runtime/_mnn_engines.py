"""Which of two MNN engines evaluates a sequence: the model's thread count, or one thread.

MNN fixes an LLM's thread count when it loads, and its multi-thread runtime collapses when
another process keeps a core busy (2 threads beside a busy process on a 2-vCPU AMD EPYC:
0.42x the prefill and 0.26x the decode speed of 1 thread). pymnn allows one LLM per process,
but ``create_lora`` given the model's own graph makes a second LLM that shares the weights
with a runtime of its own, loaded with one thread. Each engine keeps its own KV cache, so
the engine is chosen when a prompt is evaluated (a prefill), never between decode steps.

:class:`EngineChooser` keeps, per engine, a moving average of seconds per token for prompt
evaluations and for one-token steps, and at each prefill picks the engine whose estimated
time for that prefill (the tokens its cache lacks) and the steps that usually follow is
lower, switching only when the other is clearly (10%) faster. It measures the
multi-thread engine first, then tries the one-thread engine (given up if four prefills on
it measure nothing: prefills too short to time, no steps), and later retries whichever
engine lost, more rarely each time it loses again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

CEILING, ONE_THREAD = 0, 1
PROMPT_MIN_TOKENS = 16
"""Evaluations of at least this many tokens measure the prompt speed."""
STEPS_PER_PREFILL = 32
"""One-token steps a prefill is assumed to be followed by, in the estimate."""
_EMA_WEIGHT = 0.3
_MEASURED_STEPS = 8  # or this many one-token steps
_MARGIN = 0.1
_FIRST_RETRY = 8
_LONGEST_RETRY = 256
_TRIAL_PREFILLS = 4  # unmeasured after this many prefills on it: the one-thread engine is not tried again


@dataclass
class _Speed:
    prompt: float | None = None  # seconds per token
    step: float | None = None
    prompts: int = 0  # prompt evaluations measured
    steps: int = 0


def _average(old: float | None, new: float) -> float:
    return new if old is None else old + _EMA_WEIGHT * (new - old)


class EngineChooser:
    """Chooses between the ceiling engine (0) and the one-thread engine (1); see the module doc."""

    def __init__(self) -> None:
        self.speeds = [_Speed(), _Speed()]
        self.active = CEILING
        self._since_retry = 0
        self._retry_after = _FIRST_RETRY
        self._stale: set[tuple[int, str]] = set()  # (engine, "prompt" | "step") to replace, not average
        self._trial_prefills = 0  # prefills run on the one-thread engine before it was measured

    def record(self, engine: int, n_tokens: int, seconds: float) -> None:
        """An evaluation of ``n_tokens`` tokens on ``engine`` took ``seconds``."""
        speed = self.speeds[engine]
        if n_tokens == 1:
            old = None if (engine, "step") in self._stale else speed.step
            speed.step = _average(old, seconds)
            speed.steps += 1
            self._stale.discard((engine, "step"))
        elif n_tokens >= PROMPT_MIN_TOKENS:
            # the ceiling's first prompt pays for warming up (buffers, the thread pool): replaced
            warm_up = engine == CEILING and speed.prompts == 1
            old = None if (engine, "prompt") in self._stale or warm_up else speed.prompt
            speed.prompt = _average(old, seconds / n_tokens)
            speed.prompts += 1
            self._stale.discard((engine, "prompt"))

    def _measured(self, engine: int) -> bool:
        # the ceiling's first evaluations pay for warming up (buffers, the thread pool)
        speed = self.speeds[engine]
        return speed.prompts >= (2 if engine == CEILING else 1) or speed.steps >= _MEASURED_STEPS

    def _estimate(self, engine: int, uncached: int, with_prompts: bool, with_steps: bool) -> float | None:
        speed = self.speeds[engine]
        per_token = speed.prompt if with_prompts else speed.step
        if per_token is None:
            return None
        return uncached * per_token + (STEPS_PER_PREFILL * speed.step if with_steps and speed.step else 0.0)

    def choose(self, uncached: Sequence[int]) -> int:
        """The engine for a prefill (it becomes :attr:`active`); ``uncached[e]``: the tokens
        engine ``e`` would have to evaluate for it."""
        self.active = self._choose(uncached)
        return self.active

    def _choose(self, uncached: Sequence[int]) -> int:
        if not self._measured(CEILING):
            return CEILING
        if not self._measured(ONE_THREAD):
            # a workload of short prefills and no steps may never measure it: then give up
            self._trial_prefills += 1
            if self._trial_prefills <= _TRIAL_PREFILLS:
                return ONE_THREAD
            return CEILING
        other = ONE_THREAD - self.active
        self._since_retry += 1
        if self._since_retry >= self._retry_after:  # look again at the engine that lost
            self._since_retry = 0
            self._retry_after = min(2 * self._retry_after, _LONGEST_RETRY)
            self._stale |= {(other, "prompt"), (other, "step")}  # the machine's load may have changed
            return other
        # compare what both engines have measured: prompts (else steps as a prompt's upper
        # bound per token), plus the steps that follow a prompt
        with_prompts = all(s.prompt is not None for s in self.speeds)
        with_steps = all(s.step is not None for s in self.speeds)
        mine = self._estimate(self.active, uncached[self.active], with_prompts, with_steps)
        theirs = self._estimate(other, uncached[other], with_prompts, with_steps)
        if mine is not None and theirs is not None and theirs < (1.0 - _MARGIN) * mine:
            self._retry_after = _FIRST_RETRY
            return other
        return self.active
