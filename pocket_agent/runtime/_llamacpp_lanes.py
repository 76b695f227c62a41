"""The llama.cpp context that runs lanes (:mod:`.lanes`): one KV stream per sequence.

Lanes do not live in the model's main context. In its unified KV cache every sequence's
attention runs over every cell in use, so a document's prompt evaluated beside three
others costs twice as much (measured at 1 thread: 138 vs 268 tok/s), and without flash
attention a batch of several sequences also comes out numerically different (logits off
by up to ~1). A context with a KV stream per sequence (``kv_unified = false``) has
neither problem: measured, the same logits as one-sequence decoding, and 4 lanes' steps
in 52 ms against 24 ms for one. It shares the model's weights; only its KV cache (about
23 KB per token for SmolLM2-135M) is extra, allocated the first time lanes open.

Stream 0 holds the prefix the lanes share; a lane starts as a copy of it. llama.cpp
copies between streams only whole sequences (a partial ``seq_cp`` aborts the process),
so a copy is whole and then trimmed. A finished lane's keys and values move to the main
context through llama.cpp's sequence state API.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import BackendError
from ._llamacpp_context import context_params, copy_floats, fill_batch
from ._threads import ThreadGovernor
from .base import common_prefix_length

_HEADER = 8  # bytes before the stream count in a sequence state

LANE_CTX = 2048
"""Cells per lane (and for the shared prefix): prompt and output of one document. A longer
one is generated alone in the main context."""


class LaneContext:
    """Up to ``width`` lanes (sequences 1..width) and a shared prefix (sequence 0)."""

    def __init__(
        self,
        lc: Any,
        model: Any,
        *,
        width: int,
        n_ctx: int,
        n_batch: int,
        threads: int,
        adaptive_threads: bool,
        flash_attn: bool,
        n_vocab: int,
    ) -> None:
        self._lc = lc
        self._logits_row = ctypes.c_float * n_vocab
        self.width = width
        n_seq = width + 1
        cparams = context_params(
            lc, n_ctx=n_ctx * n_seq, n_batch=n_batch, n_seq=n_seq, threads=threads, flash_attn=flash_attn
        )
        cparams.kv_unified = False
        self._ctx = lc.llama_init_from_model(model, cparams)
        if not self._ctx:
            raise BackendError("llama.cpp could not create the context for batched decoding.")
        ctx = self._ctx
        self._governor = ThreadGovernor(threads, lambda n: lc.llama_set_n_threads(ctx, n, n), adaptive=adaptive_threads)
        self._mem = lc.llama_get_memory(self._ctx)
        self._n_batch = n_batch
        self._batch = lc.llama_batch_init(n_batch, 0, 1)
        self.capacity = int(lc.llama_n_ctx_seq(self._ctx))
        self.prefix: list[int] = []  # what sequence 0 holds
        self._loras: list[tuple[int, float]] = []

    def set_loras(self, active: Sequence[tuple[Any, float]]) -> None:
        """Apply the main context's active LoRA adapters (``(handle, scale)``); a change
        forgets everything this context holds."""
        wanted = [(id(h), s) for h, s in active]
        if wanted == self._loras:
            return
        lc = self._lc
        n = len(active)
        arr = (lc.llama_adapter_lora_p_ctypes * max(n, 1))(*[h for h, _ in active])
        scales = (ctypes.c_float * max(n, 1))(*[s for _, s in active])
        if lc.llama_set_adapters_lora(self._ctx, arr if n else None, n, scales if n else None) != 0:
            raise BackendError("llama.cpp could not apply the LoRA adapters to the batched-decoding context.")
        self._loras = wanted
        lc.llama_memory_clear(self._mem, True)
        self.prefix = []

    def share(self, tokens: Sequence[int]) -> None:
        """Make sequence 0 hold ``tokens``, evaluating only what it does not hold yet."""
        if list(tokens) == self.prefix:
            return
        # at least two tokens are evaluated: a batch of one token rounds differently
        keep = min(common_prefix_length(self.prefix, tokens), max(len(tokens) - 2, 0))
        self._lc.llama_memory_seq_rm(self._mem, 0, keep, -1)
        del self.prefix[keep:]
        rest = list(tokens[keep:])
        if rest:
            self.decode([(t, keep + j, 0, False) for j, t in enumerate(rest)])
        self.prefix.extend(rest)

    def start(self, lane: int, keep: int) -> None:
        """Make ``lane`` hold the first ``keep`` tokens of sequence 0."""
        lc = self._lc
        lc.llama_memory_seq_rm(self._mem, lane, -1, -1)
        if keep > 0:
            lc.llama_memory_seq_cp(self._mem, 0, lane, -1, -1)  # whole: see the module doc
            lc.llama_memory_seq_rm(self._mem, lane, keep, -1)

    def decode(self, items: Sequence[tuple[int, int, int, bool]]) -> list[NDArray[np.float32]]:
        """Evaluate ``(token, position, sequence, want_logits)`` items; the wanted rows, in order."""
        lc = self._lc
        rows: list[NDArray[np.float32]] = []
        b = self._batch
        for c0 in range(0, len(items), self._n_batch):
            chunk = items[c0 : c0 + self._n_batch]
            fill_batch(b, chunk)
            rc = self._governor.run(len(chunk), lambda: lc.llama_decode(self._ctx, b))
            if rc != 0:
                raise BackendError(f"llama_decode failed with code {rc} in the batched-decoding context.")
            for i, item in enumerate(chunk):
                if item[3]:
                    ptr = lc.llama_get_logits_ith(self._ctx, i)
                    if not ptr:
                        raise BackendError(f"llama.cpp returned no logits for batch index {i} in the lanes.")
                    rows.append(copy_floats(ptr, self._logits_row))
        return rows

    def drop(self, lane: int) -> None:
        self._lc.llama_memory_seq_rm(self._mem, lane, -1, -1)

    def export(self, lane: int) -> bytes:
        """The keys and values ``lane`` holds, in llama.cpp's sequence state format for a
        cache of one stream (what the main context has).

        The format is a header, the number of streams, then one block per stream: its cell
        count, the cells, their keys and values; a stream without the sequence is just a
        zero count. The per-cell payload does not depend on the layout, so the lane's
        block is taken out and given a one-stream count; llama.cpp refuses a state whose
        stream count differs from its own ("n_stream mismatch").
        """
        lc = self._lc
        size = int(lc.llama_state_seq_get_size(self._ctx, lane))
        buf = (ctypes.c_uint8 * size)()
        written = int(lc.llama_state_seq_get_data(self._ctx, buf, size, lane))
        if written <= 0:
            raise BackendError("llama.cpp could not read a finished lane's keys and values.")
        data = ctypes.string_at(buf, written)
        n_streams = self.width + 1
        start = _HEADER + 4 + 4 * lane
        end = written - 4 * (n_streams - 1 - lane)
        empty = data[_HEADER + 4 : start] + data[end:]
        if int.from_bytes(data[_HEADER : _HEADER + 4], "little") != n_streams or any(empty) or end <= start:
            raise BackendError("llama.cpp wrote a lane's state in a layout pocket_agent does not know.")
        return data[:_HEADER] + (1).to_bytes(4, "little") + data[start:end]

    def close(self) -> None:
        if self._batch is not None:
            self._lc.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            self._lc.llama_free(self._ctx)
            self._ctx = None
