"""What every pocket_agent llama.cpp context shares: its parameters, batch filling, row reading."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np


def context_params(lc: Any, *, n_ctx: int, n_batch: int, n_seq: int, threads: int, flash_attn: bool) -> Any:
    """``llama_context_params`` for a CPU context: one micro-batch per decode (``n_ubatch =
    n_batch``), ``n_seq`` sequences in one unified KV cache, no pooling, logits only."""
    cparams = lc.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = n_batch
    cparams.n_ubatch = n_batch
    cparams.n_seq_max = n_seq
    cparams.kv_unified = True
    cparams.n_threads = threads
    cparams.n_threads_batch = threads
    cparams.pooling_type = lc.LLAMA_POOLING_TYPE_NONE
    cparams.embeddings = False
    cparams.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
    return cparams


def fill_batch(batch: Any, items: Sequence[tuple[int, int, int, bool]]) -> None:
    """Write ``(token, position, sequence, want_logits)`` items into a ``llama_batch``, one sequence per token."""
    for i, (tok, pos, seq, out) in enumerate(items):
        batch.token[i] = tok
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = 1 if out else 0
    batch.n_tokens = len(items)


def copy_floats(ptr: Any, row_type: Any) -> np.ndarray:
    """A float32 copy of the floats at a ``float *`` (logits or a hidden state), ``row_type``
    being a ``ctypes.c_float * n`` type made once (``np.ctypeslib.as_array`` builds one per call,
    ~30 us on a decode step)."""
    address = ctypes.cast(ptr, ctypes.c_void_p).value
    return np.frombuffer(row_type.from_address(address), dtype=np.float32).copy()
