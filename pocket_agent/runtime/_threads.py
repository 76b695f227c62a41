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
machine's load is noticed within a few hundred evaluations.

The ceiling is never tried blind. The first evaluation of each size runs on it only where
the other processes leave its cores free (:mod:`._cpu_load`: ``/proc/stat`` since the model
began to load, else the running tasks now), else on 1 thread; and on 1 thread, each later
try of the ceiling waits for free cores too. A one-shot command (``pocket-agent generate``,
one ``decide``) evaluates each size once or a few times, far too few for measurement to
repay one collapsed evaluation (a 37-token prompt on 2 threads beside a busy process: 4.4
tok/s against 70 on 1), so the first choice has to be the safe one. Without flash attention the
arithmetic does not depend on the thread count (llama.cpp splits rows, not reductions), so the
choice changes speed only, never the output; with it, a one-token step splits its keys across
threads and the backend keeps the count fixed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from ._cpu_load import cpu_load

T = TypeVar("T")

SIZE_CLASSES = (1, 8, 64)
"""Upper bounds of the evaluation-size classes (tokens): one token, short runs, medium runs;
anything longer is a prompt."""

_EMA_WEIGHT = 0.3
_PREFER_CEILING = 0.1  # 1 thread must be this much faster per token to be chosen
_FIRST_RETRY = 8
_LONGEST_RETRY = 256
_COLLAPSE = 2.0  # a ceiling's warm-up run this many times slower per token than 1 thread: not tried again soon


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
    probing: bool = False  # on 1 thread, the ceiling measured once (a warm-up): measure it again
    since_retry: int = 0
    retry_after: int = _FIRST_RETRY


class ThreadGovernor:
    """Chooses between 1 thread and ``threads`` per evaluation size, by timing evaluations.

    ``set_threads(n)`` is called before an evaluation whose thread count differs from the
    previous one; ``clock`` times evaluations (seconds); ``cores_free(n)`` says whether ``n``
    threads would find their cores free now (default: :meth:`._cpu_load.CpuLoad.free_for`).
    With ``adaptive=False`` (or ``threads == 1``) every evaluation runs on ``threads`` and
    nothing is timed. ``single_on_one``: one-token evaluations always run on 1 thread (for a
    context with flash attention, whose one-token results depend on the thread count).
    """

    def __init__(
        self,
        threads: int,
        set_threads: Callable[[int], None],
        *,
        adaptive: bool = True,
        clock: Callable[[], float] = time.perf_counter,
        cores_free: Callable[[int], bool] | None = None,
        single_on_one: bool = False,
    ) -> None:
        self.threads = threads
        self._clock = clock
        self.adaptive = adaptive and threads > 1
        self._set_threads = set_threads
        self._cores_free = cores_free if cores_free is not None else cpu_load().free_for
        self._single_on_one = single_on_one and self.adaptive
        self._current = threads
        self._classes = [_ClassState(chosen=threads) for _ in range(len(SIZE_CLASSES) + 1)]

    @property
    def current(self) -> int:
        """The thread count the context runs on now (what ``set_threads`` was last given)."""
        return self._current

    def choices(self) -> dict[str, int]:
        """The thread count each size class runs on now (for reports and tests)."""
        names = [f"<={b} tokens" for b in SIZE_CLASSES] + [f">{SIZE_CLASSES[-1]} tokens"]
        return {name: state.chosen for name, state in zip(names, self._classes, strict=True)}

    def run(self, n_tokens: int, evaluate: Callable[[], T]) -> T:
        """Run ``evaluate`` (one evaluation of ``n_tokens`` tokens) on the chosen thread count."""
        if not self.adaptive:
            return evaluate()
        if self._single_on_one and n_tokens <= 1:
            self._switch(1)
            return evaluate()
        state = self._classes[size_class(n_tokens)]
        n = self._pick(state)
        self._switch(n)
        start = self._clock()
        result = evaluate()
        self._record(state, n, (self._clock() - start) / max(1, n_tokens))
        return result

    def _switch(self, n: int) -> None:
        if n != self._current:
            self._set_threads(n)
            self._current = n

    def _pick(self, state: _ClassState) -> int:
        ceiling = self.threads
        if not state.samples:  # the first evaluation of this size: the ceiling only on free cores
            state.chosen = ceiling if self._cores_free(ceiling) else 1
            return state.chosen
        due = state.since_retry >= state.retry_after
        if state.chosen == ceiling:
            if state.samples.get(ceiling, 0) < 2:
                return ceiling  # its first run paid for warming up (buffers, the thread team)
            if state.samples.get(1, 0) < 1 or due:
                return 1  # one thread is always safe to try
            return ceiling
        if state.probing or due:  # on 1 thread: try the ceiling only where its cores are free
            if self._cores_free(ceiling):
                return ceiling
            state.probing = False
            state.since_retry = 0
        return 1

    def _better(self, state: _ClassState) -> int:
        """1 thread only when it is clearly faster: a modest second-thread gain is real but
        noisy, and a collapse is several times slower, far past the margin."""
        one, ceiling = state.per_token[1], state.per_token[self.threads]
        return 1 if one < (1.0 - _PREFER_CEILING) * ceiling else self.threads

    def _record(self, state: _ClassState, n: int, seconds_per_token: float) -> None:
        ceiling = self.threads
        retry = n != state.chosen and n in state.per_token and state.since_retry >= state.retry_after
        count = state.samples.get(n, 0)
        state.samples[n] = count + 1
        old = state.per_token.get(n)
        if old is None or retry or count == 1:
            state.per_token[n] = seconds_per_token  # first, stale (a retry's) or warm-up-tainted
        else:
            state.per_token[n] = old + _EMA_WEIGHT * (seconds_per_token - old)
        if len(state.per_token) < 2:
            state.since_retry += 1
            return
        if state.samples.get(ceiling, 0) < 2:  # the ceiling measured once: that run warmed it up
            if state.chosen == 1:
                collapsed = state.per_token[ceiling] > _COLLAPSE * state.per_token[1]
                state.probing = not collapsed  # measure it again, unless it collapsed even so
                if collapsed:
                    self._lost(state)
            return
        state.probing = False
        best = self._better(state)
        if retry:
            state.since_retry = 0
            if best != state.chosen:
                state.chosen = best
                state.retry_after = _FIRST_RETRY
            else:
                self._lost(state)
            return
        if best != state.chosen:
            state.chosen = best
            state.retry_after = _FIRST_RETRY
        state.since_retry += 1

    @staticmethod
    def _lost(state: _ClassState) -> None:
        """The other count lost again: try it more rarely."""
        state.since_retry = 0
        state.retry_after = min(2 * state.retry_after, _LONGEST_RETRY)
