"""One llama.cpp context that evaluates tokens: its batch, thread governor and KV cache.

:class:`~pocket_agent.runtime.llamacpp.LlamaCppModel` holds one of these, or two where
generation runs in a context of its own (``generation_weights``): prompts with flash
attention (on a BF16 copy under ``layout="split"``), generation without it (on a Q8_0 copy,
or on the same weights), the prompt's keys and values carried from the first context to the
second (re-laid out by :mod:`._llamacpp_kvstate` where only one uses flash attention).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import BackendError
from ._llamacpp_context import copy_floats, fill_batch
from ._llamacpp_kvstate import relayout_values
from ._threads import ThreadGovernor


class EvalContext:
    """A llama.cpp context created from ``cparams`` on ``model``'s weights (see module doc)."""

    def __init__(
        self,
        lc: Any,
        model: Any,
        cparams: Any,
        *,
        threads: int,
        adaptive_threads: bool,
        n_vocab: int,
        n_embd: int,
        recent_errors: Callable[[], str],
    ) -> None:
        self._lc = lc
        self._recent_errors = recent_errors
        ctx = lc.llama_init_from_model(model, cparams)
        if not ctx:
            raise BackendError(f"llama.cpp could not create a context: {recent_errors()}")
        self.ctx: Any = ctx
        self.mem = lc.llama_get_memory(ctx)
        self.n_batch = int(cparams.n_batch)
        # without flash attention llama.cpp keeps the values transposed (its state says so too)
        self.values_transposed = int(cparams.flash_attn_type) != int(lc.LLAMA_FLASH_ATTN_TYPE_ENABLED)
        self.batch: Any = lc.llama_batch_init(self.n_batch, 0, 1)
        self.governor = ThreadGovernor(threads, lambda n: lc.llama_set_n_threads(ctx, n, n), adaptive=adaptive_threads)
        self._n_vocab = n_vocab
        self._n_embd = n_embd
        self._logits_row = ctypes.c_float * n_vocab
        self._hidden_row = ctypes.c_float * n_embd
        self._embeddings_on = False
        self._state_buf: Any = None

    def set_embeddings(self, on: bool) -> None:
        if on != self._embeddings_on:
            self._lc.llama_set_embeddings(self.ctx, on)
            self._embeddings_on = on

    def decode(self, items: Sequence[tuple[int, int, int, bool]]) -> None:
        """Decode ``(token, pos, seq_id, want_output)`` items (at most ``n_batch``) in one ``llama_decode``."""
        b = self.batch
        fill_batch(b, items)
        rc = self.governor.run(len(items), lambda: self._lc.llama_decode(self.ctx, b))
        if rc != 0:
            raise BackendError(f"llama_decode failed with code {rc}: {self._recent_errors()}")

    def read_row(self, i: int, hidden: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """Logits (and the final hidden state with ``hidden``) of row ``i`` of the last decode."""
        ptr = self._lc.llama_get_logits_ith(self.ctx, i)
        if not ptr:
            raise BackendError(f"llama.cpp returned no logits for batch index {i}.")
        logits = copy_floats(ptr, self._logits_row)
        hid = None
        if hidden:
            eptr = self._lc.llama_get_embeddings_ith(self.ctx, i)
            if not eptr:
                raise BackendError(f"llama.cpp returned no hidden state for batch index {i}.")
            hid = copy_floats(eptr, self._hidden_row)
        return logits, hid

    def remove(self, seq: int, start: int, end: int = -1) -> bool:
        """Drop sequence ``seq``'s cells at positions ``[start, end)`` (``-1``: to the end)."""
        return bool(self._lc.llama_memory_seq_rm(self.mem, seq, start, end))

    def copy_seq(self, src: int, dst: int) -> None:
        self._lc.llama_memory_seq_cp(self.mem, src, dst, -1, -1)

    def clear(self) -> None:
        self._lc.llama_memory_clear(self.mem, True)

    def take_seq(self, source: EvalContext) -> None:
        """Make sequence 0 hold exactly what ``source``'s sequence 0 holds (its keys and values)."""
        lc = self._lc
        size = int(lc.llama_state_seq_get_size(source.ctx, 0))
        if self._state_buf is None or len(self._state_buf) < size:
            self._state_buf = (ctypes.c_uint8 * size)()
        written = int(lc.llama_state_seq_get_data(source.ctx, self._state_buf, size, 0))
        if source.values_transposed == self.values_transposed:
            self.import_seq(self._state_buf, written)
            return
        state = relayout_values(memoryview(self._state_buf)[:written], transposed=self.values_transposed)
        self.import_seq((ctypes.c_uint8 * len(state)).from_buffer(state), len(state))

    def import_seq(self, data: Any, size: int) -> None:
        """Replace sequence 0 with a sequence state (``llama_state_seq_get_data``'s bytes)."""
        lc = self._lc
        lc.llama_memory_seq_rm(self.mem, 0, -1, -1)
        if size <= 0 or int(lc.llama_state_seq_set_data(self.ctx, data, size, 0)) <= 0:
            lc.llama_memory_seq_rm(self.mem, 0, -1, -1)
            raise BackendError(f"llama.cpp could not move keys and values between contexts: {self._recent_errors()}")

    def close(self) -> None:
        lc = self._lc
        if self.batch is not None:
            lc.llama_batch_free(self.batch)
            self.batch = None
        if self.ctx:
            lc.llama_free(self.ctx)
            self.ctx = None
