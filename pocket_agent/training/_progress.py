"""A dependency-free progress line for training (stage, count, running numbers)."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Protocol, TextIO


class Progress(Protocol):
    def __call__(self, stage: str, done: int, total: int, numbers: Mapping[str, float]) -> None: ...


class ProgressBar:
    """Writes ``stage [#####.....] done/total loss=0.41 12s`` to a terminal, redrawn in place.

    On a stream that is not a terminal it writes one line per stage change and at most one
    line every ``every`` seconds, so logs stay readable.
    """

    def __init__(self, stream: TextIO | None = None, *, enabled: bool = True, every: float = 10.0) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.every = every
        self._t0 = time.perf_counter()
        self._last_stage = ""
        self._last_write = 0.0
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def __call__(self, stage: str, done: int, total: int, numbers: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        finished = done >= total
        if not self._tty and stage == self._last_stage and not finished and now - self._last_write < self.every:
            return
        width = 24
        filled = int(width * done / max(total, 1))
        nums = " ".join(f"{k}={v:.4g}" for k, v in numbers.items())
        line = f"{stage} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {nums} {now - self._t0:.0f}s"
        if self._tty:
            self.stream.write("\r\x1b[K" + line + ("\n" if finished else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self._last_stage = stage
        self._last_write = now
