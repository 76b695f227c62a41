"""One llama.cpp context that evaluates tokens: its batch, thread governor and KV cache.

:class:`~pocket_agent.runtime.llamacpp.LlamaCppModel` holds one of these, or two where
generation runs in a context of its own (``generation_weights``): prompts with flash
attention (on a BF16 copy under ``layout="split"``), generation without it (on a Q8_0 copy,
or on the same weights), the prompt's keys and values carried from the first context to the
second (re-laid out by :mod:`._llamacpp_kvstate` where only one uses flash attention).

The KV cache grows with use. llama.cpp allocates (and zeroes) a context's whole cache when
it creates it: 23 KB per cell for SmolLM2-135M, 90 MB for the 4096 cells of the default
context, while a receipt, a decision or an agent turn uses a few hundred. A context starts
with :data:`FIRST_CELLS` cells (or ``n_ctx``, if smaller) and, when an evaluation needs more,
is replaced by one with twice as many (at least what is needed, at most ``n_ctx``) holding
the same keys and values (llama.cpp's sequence state, moved in a few ms; a new context
costs 15-50 ms, once per doubling). Results do not change: llama.cpp attends over the cells
in use (rounded up to 256), not over the cache's size.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import BackendError
from ._llamacpp_context import copy_floats, fill_batch
from ._llamacpp_kvstate import relayout_values, state_cells
from ._threads import ThreadGovernor

FIRST_CELLS = 1024
"""KV cells a context starts with (see the module doc)."""


class EvalContext:
    """A llama.cpp context created from ``cparams`` on ``model``'s weights (see module doc)."""

    def __init__(
        self,
        lc: Any,
        model: Any,
        params: Callable[[int], Any],
        *,
        n_ctx: int,
        threads: int,
        adaptive_threads: bool,
        n_vocab: int,
        n_embd: int,
        recent_errors: Callable[[], str],
        first_cells: int = FIRST_CELLS,
    ) -> None:
        """``params(cells)``: the ``llama_context_params`` of a context with ``cells`` KV cells;
        ``n_ctx``: the most cells the context grows to."""
        self._lc = lc
        self._model = model
        self._params = params
        self._recent_errors = recent_errors
        self.max_cells = n_ctx
        self.ctx: Any = None
        self.mem: Any = None
        self.capacity = 0
        self._loras: tuple[Any, Any, int] | None = None  # what set_loras applied: (adapters, scales, count)
        self._embeddings_on = False
        self._create(min(n_ctx, first_cells))
        cparams = params(self.capacity)
        self.n_batch = int(cparams.n_batch)
        # without flash attention llama.cpp keeps the values transposed (its state says so too)
        self.values_transposed = int(cparams.flash_attn_type) != int(lc.LLAMA_FLASH_ATTN_TYPE_ENABLED)
        self.batch: Any = lc.llama_batch_init(self.n_batch, 0, 1)
        self.governor = ThreadGovernor(
            threads, lambda n: lc.llama_set_n_threads(self.ctx, n, n), adaptive=adaptive_threads
        )
        self._n_vocab = n_vocab
        self._n_embd = n_embd
        self._logits_row = ctypes.c_float * n_vocab
        self._hidden_row = ctypes.c_float * n_embd
        self._state_buf: Any = None

    def _create(self, cells: int) -> None:
        """Replace the context with one of ``cells`` KV cells, holding what sequence 0 held."""
        lc = self._lc
        ctx = lc.llama_init_from_model(self._model, self._params(cells))
        if not ctx:
            raise BackendError(f"llama.cpp could not create a context of {cells} cells: {self._recent_errors()}")
        old, held = self.ctx, self.used_cells() if self.ctx else 0
        try:
            if held:
                size = int(lc.llama_state_seq_get_size(old, 0))
                buf = (ctypes.c_uint8 * size)()
                written = int(lc.llama_state_seq_get_data(old, buf, size, 0))
                if written <= 0 or int(lc.llama_state_seq_set_data(ctx, buf, written, 0)) <= 0:
                    why = self._recent_errors()
                    raise BackendError(f"llama.cpp could not move the KV cache to a larger context: {why}")
            adapters, scales, n = self._loras if self._loras is not None else (None, None, 0)
            if n and lc.llama_set_adapters_lora(ctx, adapters, n, scales) != 0:
                raise BackendError("llama.cpp could not apply the LoRA adapters to a larger context.")
            if self._embeddings_on:
                lc.llama_set_embeddings(ctx, True)
            if old is not None:
                current = self.governor.current
                lc.llama_set_n_threads(ctx, current, current)
        except BaseException:
            lc.llama_free(ctx)
            raise
        self.ctx, self.mem = ctx, lc.llama_get_memory(ctx)
        self.capacity = int(lc.llama_n_ctx(ctx))
        if old is not None:
            lc.llama_free(old)

    def reserve(self, cells: int) -> None:
        """Grow the KV cache to hold ``cells`` cells, if it holds fewer (up to ``n_ctx``)."""
        if cells > self.capacity and self.capacity < self.max_cells:
            self._create(min(self.max_cells, max(2 * self.capacity, cells)))

    def used_cells(self) -> int:
        """Cells sequence 0 holds (its last position + 1)."""
        return int(self._lc.llama_memory_seq_pos_max(self.mem, 0)) + 1

    def set_loras(self, adapters: Any, scales: Any, n: int) -> int:
        """Apply ``n`` LoRA adapters (llama.cpp arrays of handles and scales); llama.cpp's code."""
        rc = int(self._lc.llama_set_adapters_lora(self.ctx, adapters if n else None, n, scales if n else None))
        if rc == 0:
            self._loras = (adapters, scales, n)
        return rc

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
        if size > 0:
            self.reserve(state_cells(data, size))  # grown empty: nothing to carry over
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
