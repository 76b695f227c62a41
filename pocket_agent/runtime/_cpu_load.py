"""Whether other processes keep this process's CPUs busy: what the thread governor asks before
it runs an evaluation on more than one thread.

On a 2-core machine with one core kept busy by another process, llama.cpp's threads meet at
barriers where one of them waits a time slice for the other: a 37-token prompt on 2 threads
was measured at 4.4 tok/s against 70 on 1. One such evaluation costs more than a hundred
evaluations gain from a second thread, so the governor (:mod:`._threads`) runs the first
evaluation of each size, and every later try of its thread ceiling, on 1 thread unless this
module says the cores are free.

Linux only (``/proc``); elsewhere nothing is known and the governor measures as before.
Two readings, both cheap (~30 us):

- over a window (50 ms to 2 s since the previous look): the CPU time every task spent on
  this process's CPUs (``/proc/stat``, the CPUs in its affinity) minus this process's own
  (``time.process_time``), in cores: what other processes used, on average;
- right now, when there is no such window (the first look, or the last one was long ago):
  the tasks the kernel counts as running (``/proc/loadavg``) that are not this process's
  threads, the smallest of three looks 1 ms apart, scaled to the share of the machine's CPUs
  this process may use.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

MIN_WINDOW_S = 0.05  # shorter: a few scheduler ticks, too coarse to average over
MAX_WINDOW_S = 2.0  # longer: an average that no longer says what runs now
BUSY_MARGIN = 0.5  # cores other processes may use before a thread ceiling is refused

_PROC = Path("/proc")


@dataclass(frozen=True)
class _Snapshot:
    at: float  # time.monotonic()
    busy: float  # CPU seconds every task spent on this process's CPUs
    own: float  # CPU seconds of this process (all its threads)


def _allowed_cpus() -> frozenset[int] | None:
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return None


def _snapshot(proc: Path, cpus: frozenset[int] | None) -> _Snapshot | None:
    """CPU time spent busy on ``cpus`` (user, nice, system, irq, softirq, steal), from ``/proc/stat``."""
    try:
        text = (proc / "stat").read_text()
        hz = float(os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, AttributeError):
        return None
    busy = 0
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *values = line.split()
        try:
            cpu = int(name[3:])
            v = [int(x) for x in values[:8]]
        except ValueError:
            continue
        if (cpus is None or cpu in cpus) and len(v) == 8:
            busy += v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
    return _Snapshot(time.monotonic(), busy / hz, time.process_time())


def _own_running(proc: Path) -> int:
    """Threads of this process the kernel has running or runnable now (this one included)."""
    n = 0
    try:
        tasks = list((proc / "self" / "task").iterdir())
    except OSError:
        return 1
    for task in tasks:
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2 : stat.rfind(")") + 3] == "R":
            n += 1
    return max(1, n)


def _running_now(proc: Path, cpus: frozenset[int] | None) -> float | None:
    """Cores other processes occupy right now, from the kernel's count of running tasks."""
    looks = []
    for i in range(3):
        try:
            running = int((proc / "loadavg").read_text().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return None
        looks.append(max(0, running - _own_running(proc)))
        if i < 2:
            time.sleep(0.001)
    online = os.cpu_count() or 1
    share = len(cpus) / online if cpus else 1.0
    return min(looks) * min(1.0, share)


class CpuLoad:
    """What other processes use of this process's CPUs (see the module doc); one per process
    (:func:`cpu_load`), shared by every model's thread governors."""

    def __init__(self, proc: Path = _PROC) -> None:
        self._proc = proc
        self._cpus = _allowed_cpus()
        self._lock = threading.Lock()
        self._last = _snapshot(proc, self._cpus)
        self._verdict: tuple[float, float | None] | None = None  # (when, cores) of the last reading

    @property
    def cores(self) -> int:
        """The CPUs this process may run on."""
        return len(self._cpus) if self._cpus else (os.cpu_count() or 1)

    def mark(self) -> None:
        """Start a window now (a model begins to load: its first evaluation looks back to here)."""
        with self._lock:
            self._last = _snapshot(self._proc, self._cpus)

    def others(self) -> float | None:
        """Cores other processes used lately (over the window since the last look, else right
        now), or None where ``/proc`` says nothing."""
        with self._lock:
            now = _snapshot(self._proc, self._cpus)
            last = self._last
            if now is None:
                return None
            window = now.at - last.at if last is not None else 0.0
            cores: float | None
            if last is not None and MIN_WINDOW_S <= window <= MAX_WINDOW_S:
                used = (now.busy - last.busy) - (now.own - last.own)
                cores = max(0.0, used / window)
                self._last = now
            elif window < MIN_WINDOW_S and self._verdict is not None and now.at - self._verdict[0] < 1.0:
                return self._verdict[1]  # looked a moment ago: let the window grow
            else:
                cores = _running_now(self._proc, self._cpus)
                self._last = now
            self._verdict = (now.at, cores)
            return cores

    def free_for(self, threads: int) -> bool:
        """Whether ``threads`` threads would find their cores free: other processes use at most
        ``BUSY_MARGIN`` of a core beyond what this process leaves them. Unknown counts as free."""
        others = self.others()
        return others is None or others <= self.cores - threads + BUSY_MARGIN


_shared: CpuLoad | None = None
_shared_lock = threading.Lock()


def cpu_load() -> CpuLoad:
    """The process-wide :class:`CpuLoad`."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = CpuLoad()
        return _shared
