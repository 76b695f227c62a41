"""llama.cpp itself, below :class:`~pocket_agent.runtime.llamacpp.LlamaCppModel`: the library
loaded and initialised once per process (its log routed into ``logging``), its quantizer, its
system info, and the small pieces of evaluation output the model assembles."""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BackendUnavailableError, ModelLoadError, ModelNotFoundError
from .base import EvalOutput, Vocabulary

logger = logging.getLogger("pocket_agent.llamacpp")

GGUF_MAGIC = b"GGUF"

_init_lock = threading.Lock()
_backend_ready = False
recent_log: collections.deque[str] = collections.deque(maxlen=40)
_log_callback: Any = None  # kept alive: llama.cpp holds a raw pointer to it


def llama_cpp_module() -> Any:
    try:
        import llama_cpp
    except ImportError as exc:  # pragma: no cover - exercised only without the dependency
        raise BackendUnavailableError(
            "GGUF models need llama-cpp-python: pip install 'llama-cpp-python>=0.3.36,<0.4'"
        ) from exc
    return llama_cpp


def ensure_backend() -> Any:
    """Initialise llama.cpp once per process and route its log into ``logging``."""
    global _backend_ready, _log_callback
    lc = llama_cpp_module()
    with _init_lock:
        if not _backend_ready:

            @lc.llama_log_callback  # type: ignore[untyped-decorator]
            def _on_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
                msg = text.decode("utf-8", errors="replace")
                recent_log.append(msg)
                if level == 3:
                    logger.debug("llama.cpp error: %s", msg.rstrip())

            _log_callback = _on_log
            lc.llama_log_set(_log_callback, ctypes.c_void_p(0))
            lc.llama_backend_init()
            _backend_ready = True
    return lc


def recent_errors() -> str:
    lines = [ln.strip() for ln in list(recent_log)[-8:] if ln.strip()]
    return "; ".join(lines[-4:])


def stack_rows(
    rows: dict[int, tuple[np.ndarray, np.ndarray | None]], positions: list[int], hidden: bool, n_vocab: int
) -> EvalOutput:
    if len(positions) == 1:  # a decode step: the row read is already a fresh copy, no second one
        logits = rows[positions[0]][0].astype(np.float32, copy=False)[None, :]
    elif positions:
        logits = np.stack([rows[p][0] for p in positions]).astype(np.float32, copy=False)
    else:
        logits = np.zeros((0, n_vocab), dtype=np.float32)
    hid = None
    if hidden and positions:
        hid = np.stack([h for p in positions if (h := rows[p][1]) is not None]).astype(np.float32, copy=False)
    return EvalOutput(logits=logits, positions=list(positions), hidden=hid)


def token_text(vocab: Vocabulary, tok: int | None) -> str:
    if tok is None:
        return ""
    return vocab.token_bytes[tok].decode("utf-8", errors="replace")


def check_gguf_file(p: Path) -> None:
    if not p.exists():
        raise ModelNotFoundError(f"Model file not found: {p}")
    if not p.is_file():
        raise ModelNotFoundError(f"{p} is not a file; a GGUF model is a single .gguf file.")
    with p.open("rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        raise ModelLoadError(f"{p} is not a GGUF file (it does not start with the GGUF magic bytes).")


def quantize_gguf(source: Path, target: Path, *, file_type: int, threads: int | None = None) -> None:
    """Write ``source`` re-quantized to ``file_type`` (a ``llama_ftype``) at ``target``, with
    llama.cpp's own quantizer; :class:`OSError` when it fails (``target`` is then removed)."""
    lc = ensure_backend()  # its log goes through the backend's quiet handler
    params = lc.llama_model_quantize_default_params()
    params.ftype = file_type
    params.allow_requantize = True
    params.nthread = threads or max(1, min(4, os.cpu_count() or 1))
    rc = lc.llama_model_quantize(str(source).encode("utf-8"), str(target).encode("utf-8"), params)
    if rc != 0 or not target.is_file():
        target.unlink(missing_ok=True)
        raise OSError(f"llama.cpp's quantizer returned {rc}: {recent_errors()}")


def system_info() -> str:
    """llama.cpp's system info string (the CPU features its build uses)."""
    raw = llama_cpp_module().llama_print_system_info()
    return raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw)


def read_vocab(lc: Any, vp: Any) -> Vocabulary:
    """The model's vocabulary: every token's bytes, the special and end-of-generation tokens."""
    n = int(lc.llama_vocab_n_tokens(vp))
    buf = ctypes.create_string_buffer(1024)
    pieces: list[bytes] = []
    special: set[int] = set()
    eog: list[int] = []
    control = lc.LLAMA_TOKEN_ATTR_CONTROL
    user_defined = lc.LLAMA_TOKEN_ATTR_USER_DEFINED
    for tok in range(n):
        k = lc.llama_token_to_piece(vp, tok, buf, 1024, 0, True)
        piece = buf.raw[:k] if k > 0 else b""
        pieces.append(piece)
        attr = lc.llama_vocab_get_attr(vp, tok)
        if attr & control or (attr & user_defined and piece.startswith(b"<") and piece.endswith(b">")):
            special.add(tok)
        if lc.llama_vocab_is_eog(vp, tok):
            eog.append(tok)
    eos = int(lc.llama_vocab_eos(vp))
    eos_ids = ([eos] if eos >= 0 else []) + [t for t in eog if t != eos]
    bos = int(lc.llama_vocab_bos(vp))
    return Vocabulary(
        token_bytes=tuple(pieces),
        special_ids=frozenset(special),
        eos_ids=tuple(eos_ids),
        bos_id=bos if bos >= 0 else None,
        add_bos=bool(lc.llama_vocab_get_add_bos(vp)),
    )
