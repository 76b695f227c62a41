"""What the CPU allows: the default thread count, and whether llama.cpp's extra weight
buffers are safe on it.

Both are decided before a model loads, because a wrong choice kills the process in native
code (llama.cpp's AMX buffer on Intel Sapphire Rapids and later) or slows every call
(more threads than the process may run on).
"""

from __future__ import annotations

import logging
import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("pocket_agent.llamacpp")

THREADS_ENV = "POCKET_AGENT_THREADS"
EXTRA_BUFFERS_ENV = "POCKET_AGENT_EXTRA_BUFFERS"

_warned = threading.Event()


# -- threads ---------------------------------------------------------------------------------


def _cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs allowed by the cgroup's quota (v2 ``cpu.max``, else v1 ``cfs_quota_us``), or None."""
    try:
        fields = (root / "cpu.max").read_text().split()
        if fields and fields[0] != "max":
            return int(fields[0]) / int(fields[1])
        if fields:
            return None
    except (OSError, ValueError, IndexError):
        pass
    try:
        q = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        p = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        if q > 0 and p > 0:
            return q / p
    except (OSError, ValueError):
        pass
    return None


def _positive_int_env(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        logger.warning("Ignoring %s=%r: not an integer.", name, raw)
        return None
    if value < 1:
        logger.warning("Ignoring %s=%r: must be at least 1.", name, raw)
        return None
    return value


def default_threads() -> int:
    """Threads to use when the caller gives none.

    ``$POCKET_AGENT_THREADS`` if set; else the smallest of the cores this process may run on
    (CPU affinity), the cgroup's CPU quota (containers, rounded up) and ``$OMP_NUM_THREADS``
    (what a scheduler such as Ray sets for a worker).
    """
    forced = _positive_int_env(THREADS_ENV)
    if forced is not None:
        return forced
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    quota = _cgroup_cpu_limit()
    if quota is not None:
        n = min(n, max(1, math.ceil(quota)))
    omp = _positive_int_env("OMP_NUM_THREADS")
    if omp is not None:
        n = min(n, omp)
    return max(1, n)


# -- llama.cpp's extra buffer types (AMX) ------------------------------------------------------


@dataclass(frozen=True)
class BufferDecision:
    """Whether GGUF weights may go into llama.cpp's extra buffer types, and why."""

    use_extra_buffers: bool
    reason: str


def system_info_has_amx(system_info: str) -> bool:
    """Whether llama.cpp's system info string says its CPU backend uses AMX (``AMX_INT8 = 1``)."""
    for part in system_info.replace("\n", "|").split("|"):
        key, _, value = part.partition("=")
        if key.strip() == "AMX_INT8" and value.strip() == "1":
            return True
    return False


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The CPU's feature flags (Linux), or an empty set."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("flags"):
                return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def decide_extra_buffers(system_info: str, flags: set[str], setting: bool | None = None) -> BufferDecision:
    """Decide whether to load weights with llama.cpp's extra buffer types (AMX, repack).

    ``setting`` (the caller's or the environment's choice) wins. Otherwise they are turned
    off when the build uses AMX (``AMX_INT8 = 1`` in its system info) or, when the system
    info does not say, when the CPU has AMX: the AMX buffer's matrix multiply crashes the
    process at the first prompt of more than one token (llama.cpp#20824).
    """
    if setting is not None:
        return BufferDecision(bool(setting), "set by the caller" if setting else "turned off by the caller")
    if system_info_has_amx(system_info):
        return BufferDecision(False, "off: llama.cpp uses Intel AMX here, whose buffer crashes on prompts")
    if "AMX_INT8" not in system_info and "amx_int8" in flags:
        return BufferDecision(False, "off: the CPU has Intel AMX, whose llama.cpp buffer crashes on prompts")
    return BufferDecision(True, "on")


def extra_buffers_setting(argument: bool | None) -> bool | None:
    """The caller's choice: the ``load_model`` argument, else ``$POCKET_AGENT_EXTRA_BUFFERS``
    (``1``/``0``; ``auto`` or unset lets the guard decide)."""
    if argument is not None:
        return bool(argument)
    raw = os.environ.get(EXTRA_BUFFERS_ENV, "").strip().lower()
    if raw in ("", "auto"):
        return None
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    logger.warning("Ignoring %s=%r: use 1, 0 or auto.", EXTRA_BUFFERS_ENV, raw)
    return None


def note_decision(decision: BufferDecision) -> None:
    """Log a guard that turned the extra buffers off, once per process."""
    if not decision.use_extra_buffers and decision.reason.startswith("off") and not _warned.is_set():
        _warned.set()
        logger.warning(
            "llama.cpp extra buffer types %s; GGUF weights load without them (slower prefill, no crash). "
            "Set %s=1 to force them.",
            decision.reason,
            EXTRA_BUFFERS_ENV,
        )
