"""How many threads each evaluation runs on, chosen by measurement.

More threads are not always faster for a model this small. On a 2-vCPU machine whose two
vCPUs share one physical core (a common cloud layout), a one-token decode step of a 135M
model is slower on 2 threads than on 1 (the per-operation barriers cost more than the split
saves), while a prompt still prefills faster on 2. And when another process keeps one core
busy, llama.cpp's spinning barriers make every multi-threaded evaluation collapse (measured:
decode 26 tok/s on 2 threads against 63 on 1, prefill 120 against 250).

:class:`ThreadGovernor` therefore treats the model's ``threads`` as a ceiling: for each
evaluation size (one token, a short run, a prompt) it keeps a moving average of seconds per
token on 1 thread and on ``threads``, runs ``threads`` unless 1 thread is clearly faster
(by 10%: a second thread's modest gain is noisy, a collapse is several times slower), and
now and then tries the other again, more rarely each time it loses, so a change in the
machine's load is noticed within a few hundred evaluations. Without flash attention the
arithmetic does not depend on the thread count (llama.cpp splits rows, not reductions), so the
choice changes speed only, never the output; with it, a one-token step splits its keys across
threads and the backend keeps the count fixed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

SIZE_CLASSES = (1, 8, 64)
"""Upper bounds of the evaluation-size classes (tokens): one token, short runs, medium runs;
anything longer is a prompt."""

_EMA_WEIGHT = 0.3
_PREFER_CEILING = 0.1  # 1 thread must be this much faster per token to be chosen
_FIRST_RETRY = 8
_LONGEST_RETRY = 256


def size_class(n_tokens: int) -> int:
    """The index of the size class an evaluation of ``n_tokens`` tokens belongs to."""
    for i, bound in enumerate(SIZE_CLASSES):
        if n_tokens <= bound:
            return i
    return len(SIZE_CLASSES)


@dataclass
class _ClassState:
    """What one size class has measured: seconds per token for each candidate thread count."""

    per_token: dict[int, float] = field(default_factory=dict)
    samples: dict[int, int] = field(default_factory=dict)
    chosen: int = 0
    since_retry: int = 0
    retry_after: int = _FIRST_RETRY


class ThreadGovernor:
    """Chooses between 1 thread and ``threads`` per evaluation size, by timing evaluations.

    ``set_threads(n)`` is called before an evaluation whose thread count differs from the
    previous one; ``clock`` times evaluations (seconds). With ``adaptive=False`` (or
    ``threads == 1``) every evaluation runs on ``threads`` and nothing is timed.
    """

    def __init__(
        self,
        threads: int,
        set_threads: Callable[[int], None],
        *,
        adaptive: bool = True,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.threads = threads
        self._clock = clock
        self.adaptive = adaptive and threads > 1
        self._set_threads = set_threads
        self._current = threads
        self._classes = [_ClassState(chosen=threads) for _ in range(len(SIZE_CLASSES) + 1)]

    def choices(self) -> dict[str, int]:
        """The thread count each size class runs on now (for reports and tests)."""
        names = [f"<={b} tokens" for b in SIZE_CLASSES] + [f">{SIZE_CLASSES[-1]} tokens"]
        return {name: state.chosen for name, state in zip(names, self._classes, strict=True)}

    def run(self, n_tokens: int, evaluate: Callable[[], T]) -> T:
        """Run ``evaluate`` (one evaluation of ``n_tokens`` tokens) on the chosen thread count."""
        if not self.adaptive:
            return evaluate()
        state = self._classes[size_class(n_tokens)]
        n = self._pick(state)
        if n != self._current:
            self._set_threads(n)
            self._current = n
        start = self._clock()
        result = evaluate()
        self._record(state, n, (self._clock() - start) / max(1, n_tokens))
        return result

    def _other(self, n: int) -> int:
        return 1 if n == self.threads else self.threads

    def _pick(self, state: _ClassState) -> int:
        # measure both candidates first: the ceiling twice (its first run pays for warming
        # up: buffers, the thread team), then 1 thread
        if state.samples.get(self.threads, 0) < 2:
            return self.threads
        if state.samples.get(1, 0) < 1:
            return 1
        if state.since_retry >= state.retry_after:
            return self._other(state.chosen)
        return state.chosen

    def _better(self, state: _ClassState) -> int:
        """1 thread only when it is clearly faster: a modest second-thread gain is real but
        noisy, and a collapse is several times slower, far past the margin."""
        one, ceiling = state.per_token[1], state.per_token[self.threads]
        return 1 if one < (1.0 - _PREFER_CEILING) * ceiling else self.threads

    def _record(self, state: _ClassState, n: int, seconds_per_token: float) -> None:
        measured = len(state.per_token) == 2 and state.samples.get(self.threads, 0) >= 2
        retry = measured and n != state.chosen and state.since_retry >= state.retry_after
        count = state.samples.get(n, 0)
        state.samples[n] = count + 1
        old = state.per_token.get(n)
        if old is None or retry or (count == 1 and n == self.threads):
            state.per_token[n] = seconds_per_token  # first, stale (a retry's) or warm-up-tainted
        else:
            state.per_token[n] = old + _EMA_WEIGHT * (seconds_per_token - old)
        if len(state.per_token) < 2 or state.samples.get(self.threads, 0) < 2:
            return
        best = self._better(state)
        if retry:
            state.since_retry = 0
            if best != state.chosen:
                state.chosen = best
                state.retry_after = _FIRST_RETRY
            else:
                state.retry_after = min(2 * state.retry_after, _LONGEST_RETRY)
            return
        if best != state.chosen:
            state.chosen = best
            state.retry_after = _FIRST_RETRY
        state.since_retry += 1
