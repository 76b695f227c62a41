"""Standard-library helpers for the conversion steps that run in subprocesses: the cache
folder, a file lock, the tail of a log, missing optional modules, an offline environment.

They live in ``runtime`` (the lowest layer that converts anything: the Transformers backend
converts GGUF files) so that ``convert`` uses the same ones.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

# What every conversion subprocess runs with: offline, no telemetry, quiet and reproducible.
OFFLINE_ENV: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",
    "HF_HUB_DISABLE_UPDATE_CHECK": "1",
    "DO_NOT_TRACK": "1",
    "DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONUNBUFFERED": "1",
}


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """The pocket_agent cache folder: ``cache_dir``, ``$POCKET_AGENT_CACHE`` or ``~/.cache/pocket_agent``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("POCKET_AGENT_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "pocket_agent"


@contextlib.contextmanager
def file_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` (POSIX); a no-op elsewhere."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+b") as fh:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            yield
            return
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def log_tail(log_path: Path, lines: int = 30) -> str:
    """The last ``lines`` non-empty lines of a log (each progress bar's last frame only)."""
    try:
        text = log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    # spinners and progress bars redraw with carriage returns: keep each line's last frame
    cleaned = [line.rsplit("\r", 1)[-1].rstrip() for line in text.splitlines()]
    return "\n".join([line for line in cleaned if line.strip()][-lines:])


def missing_modules(required: Mapping[str, str]) -> list[str]:
    """PyPI names of the ``{module: distribution}`` entries that are not installed (no imports)."""
    missing = []
    for module, dist in required.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(dist)
    return missing
