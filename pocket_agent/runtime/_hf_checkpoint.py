"""A GGUF file as a Hugging Face checkpoint folder, converted once and cached.

:func:`hf_checkpoint` (public as ``pocket_agent.convert.hf_checkpoint``) runs
``pocket_agent/convert/_gguf_to_hf.py`` in a subprocess of ``sys.executable``, so the
caller never imports torch for it, and keeps the result in a cache folder keyed by the
GGUF's path, size and modification time and by the conversion script itself. The
Transformers backend and the adapter trainer both load GGUF models through it. It lives in
``runtime`` because the backend needs it and ``runtime`` sits below ``convert``; it uses
only the standard library.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ..errors import ConversionError
from ._files import OFFLINE_ENV, cache_root, file_lock, log_tail, missing_modules
from .gguf_meta import is_gguf_file

TRAIN_HINT = "pip install 'pocket-agent-mnn[train]'"
HF_CACHE_DIR = "hf"
STAMP_FILE = "pocket_agent_stamp.json"
EXIT_UNSUPPORTED = 3

# Modules the conversion subprocess imports (module name -> PyPI name).
_REQUIRED: dict[str, str] = {
    "torch": "torch",
    "transformers": "transformers",
    "accelerate": "accelerate",  # transformers needs it to read GGUF weights
    "gguf": "gguf",
    "safetensors": "safetensors",
}

_SCRIPT = Path(__file__).resolve().parent.parent / "convert" / "_gguf_to_hf.py"


def _cache_key(src: Path) -> str:
    st = src.stat()
    digest = hashlib.sha256()
    digest.update(f"{src}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    digest.update(_SCRIPT.read_bytes())  # a changed conversion recipe converts again
    return digest.hexdigest()[:16]


def hf_checkpoint(gguf_path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """The Hugging Face checkpoint folder of a GGUF model, converted on first use.

    The folder holds ``config.json``, ``model.safetensors`` (float32, dequantised), the
    tokenizer files and ``pocket_agent_source.json`` (the GGUF's architecture name,
    ``general.name`` and chat template). It lives in ``cache_dir`` if given, else in
    ``$POCKET_AGENT_CACHE/hf`` or ``~/.cache/pocket_agent/hf``, named after the GGUF and a
    hash of its resolved path, size, modification time and the conversion script; a
    changed file converts again. Concurrent callers wait on a lock file, and the folder is
    moved into place only when complete.

    Raises:
        ConversionError: the file is missing or not GGUF, its architecture cannot be read
            by transformers, the ``train`` extra is not installed, or the conversion failed.
    """
    src = Path(gguf_path).expanduser().resolve()
    if not src.is_file():
        raise ConversionError(f"GGUF file not found: {src}")
    if not is_gguf_file(src):
        raise ConversionError(f"{src} is not a GGUF file (it does not start with the GGUF magic bytes).")
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root() / HF_CACHE_DIR
    folder = root / f"{src.stem}-{_cache_key(src)}"
    if (folder / STAMP_FILE).is_file():
        return folder
    with file_lock(root / f".{folder.name}.lock"):
        if (folder / STAMP_FILE).is_file():
            return folder
        missing = missing_modules(_REQUIRED)
        if missing:
            raise ConversionError(
                f"Converting a GGUF for the Transformers backend needs {', '.join(missing)}, which are not "
                f"installed: {TRAIN_HINT}"
            )
        _convert(src, root, folder)
    return folder


def _convert(src: Path, root: Path, folder: Path) -> None:
    staging = root / f".{folder.name}.building-{os.getpid()}"
    log_path = root / f".{folder.name}.log"
    if staging.exists():
        shutil.rmtree(staging)
    env = {**os.environ, **OFFLINE_ENV}
    started = time.monotonic()
    try:
        with open(log_path, "w", encoding="utf-8") as log:
            try:
                proc = subprocess.run(
                    [sys.executable, str(_SCRIPT), str(src), str(staging)],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    check=False,
                )
            except OSError as exc:
                raise ConversionError(f"the GGUF -> transformers step could not start: {exc}") from exc
        if proc.returncode == EXIT_UNSUPPORTED:
            raise ConversionError(f"unsupported architecture in {src}: {log_tail(log_path, 3)}")
        if proc.returncode != 0 or not (staging / "config.json").is_file():
            raise ConversionError(
                f"reading {src} with transformers failed (exit {proc.returncode}); log {log_path}, tail:\n"
                f"{log_tail(log_path)}"
            )
        stamp = {
            "source": str(src),
            "source_bytes": src.stat().st_size,
            "seconds": round(time.monotonic() - started, 1),
        }
        (staging / STAMP_FILE).write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staging, folder)
        log_path.unlink(missing_ok=True)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
