"""Training progress (stage, count, running numbers) drawn by tqdm."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any, Protocol, TextIO

from tqdm import tqdm


class Progress(Protocol):
    def __call__(self, stage: str, done: int, total: int, numbers: Mapping[str, float]) -> None: ...


class ProgressBar:
    """One tqdm bar per stage (``frozen blocks``, ``epoch 1/3``, ``validation``) with the
    running numbers (``loss=0.41``) after it, redrawn in place on a terminal.

    A stage's bar stays on screen when the stage is done; one left unfinished by the next
    stage (an epoch paused for a validation check) is cleared and drawn anew when the stage
    goes on. On a stream that is not a terminal it writes tqdm's line for the stage, one per
    stage change and at most one every ``every`` seconds, so logs stay readable.
    """

    def __init__(self, stream: TextIO | None = None, *, enabled: bool = True, every: float = 10.0) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.every = every
        self._started: dict[str, float] = {}
        self._last_stage = ""
        self._last_write = 0.0
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._bar: Any = None

    def __call__(self, stage: str, done: int, total: int, numbers: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        postfix = " ".join(f"{k}={v:.4g}" for k, v in numbers.items())
        if self._tty:
            self._draw(stage, done, total, postfix)
            return
        now = time.perf_counter()
        finished = done >= total
        if stage == self._last_stage and not finished and now - self._last_write < self.every:
            return
        elapsed = now - self._started.setdefault(stage, now)
        line = tqdm.format_meter(done, total, elapsed, prefix=stage, postfix=postfix or None, ascii=True)
        self.stream.write(line + "\n")
        self.stream.flush()
        self._last_stage = stage
        self._last_write = now

    def _draw(self, stage: str, done: int, total: int, postfix: str) -> None:
        bar = self._bar
        if bar is None or bar.desc != stage or bar.total != total or done < bar.n:
            self.close()
            bar = self._bar = tqdm(
                total=total, initial=done, desc=stage, postfix=postfix or None, file=self.stream, dynamic_ncols=True
            )
        bar.set_postfix_str(postfix, refresh=False)
        bar.update(done - bar.n)
        if done >= total:
            self.close()

    def close(self) -> None:
        """End the bar on screen: kept if its stage is done, cleared if not."""
        bar, self._bar = self._bar, None
        if bar is not None:
            bar.leave = bar.n >= (bar.total or 0)
            bar.close()
