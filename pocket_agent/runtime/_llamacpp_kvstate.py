"""Re-lay the values of a llama.cpp sequence state between flash-attention and plain contexts.

A context with flash attention stores each cell's values as a row; one without stores
them transposed (a row per value dimension), and ``llama_state_seq_set_data`` refuses a
state of the other layout ("incompatible V transposition"). Split weights
(:class:`~pocket_agent.runtime.llamacpp.LlamaCppModel` with ``generation_weights``) evaluate
prompts with flash attention, which is faster there and gives the same logits on any
thread count for batches of two or more tokens, and generate without it, whose one-token
logits do not depend on the thread count either; the prompt's state is re-laid out here.

The sequence state of a one-stream cache is: an 8-byte header, the stream count, the cell
count, per cell its position, sequence count and sequence ids, then ``v_trans`` and the
layer count, per layer the keys (type, row size, a row per cell), then per layer the values:
as rows (type, row size, a row per cell) or transposed (type, element size, value width,
then per value dimension one element per cell). Keys and everything else are copied as
they are. Checked against llama.cpp in ``tests/test_split_weights.py``: layer 0 (whose
values do not depend on attention) comes out bit-identical in both layouts.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from ..errors import BackendError

_HEADER = 8
_ELEMENT_BYTES = {0: 4, 1: 2, 30: 2}  # ggml types F32, F16, BF16: the unquantized caches


def relayout_values(state: bytes | bytearray | memoryview, *, transposed: bool) -> bytearray:
    """``state`` (a one-stream sequence state) with its values laid out ``transposed`` or as rows."""
    data = memoryview(state).cast("B")
    try:
        return _relayout(data, transposed)
    except (struct.error, ValueError) as exc:
        raise BackendError(f"llama.cpp wrote a sequence state pocket_agent cannot read ({exc}).") from exc


def value_blocks(state: bytes | bytearray | memoryview) -> list[np.ndarray]:
    """Each layer's values in ``state``, one row of raw elements per cell, whatever the layout."""
    data = memoryview(state).cast("B")
    try:
        layout = _Layout.read(data)
        return [block for _, _, _, block in layout.values(data)]
    except (struct.error, ValueError) as exc:
        raise BackendError(f"llama.cpp wrote a sequence state pocket_agent cannot read ({exc}).") from exc


def state_cells(state: Any, size: int) -> int:
    """The cell count of a one-stream sequence state of ``size`` bytes (a ``ctypes`` byte
    array or bytes), or 0 where it says otherwise."""
    if size < _HEADER + 8:
        return 0
    n_stream, n_cells = struct.unpack("<II", bytes(state[_HEADER : _HEADER + 8]))
    return int(n_cells) if n_stream == 1 else 0


class _Layout:
    """Where the parts of a sequence state are (see the module doc)."""

    def __init__(self, n_cells: int, flag_at: int, transposed: bool, n_layer: int, values_at: int) -> None:
        self.n_cells, self.flag_at, self.transposed = n_cells, flag_at, transposed
        self.n_layer, self.values_at = n_layer, values_at

    @classmethod
    def read(cls, data: memoryview) -> _Layout:
        o = _HEADER
        n_stream, n_cells = struct.unpack_from("<II", data, o)
        o += 8
        if n_stream != 1:
            raise ValueError(f"{n_stream} streams")
        for _ in range(n_cells):
            _, n_seq = struct.unpack_from("<iI", data, o)
            o += 8 + 4 * n_seq
        flag_at = o
        transposed, n_layer = struct.unpack_from("<II", data, o)
        o += 8
        for _ in range(n_layer):
            _, row = struct.unpack_from("<iQ", data, o)
            o += 12 + n_cells * row
        return cls(n_cells, flag_at, bool(transposed), n_layer, o)

    def values(self, data: memoryview) -> list[tuple[int, int, int, np.ndarray]]:
        """Per layer: (offset, ggml type, element bytes, values as [cell, width] raw elements)."""
        o, n_cells, out = self.values_at, self.n_cells, []
        for _ in range(self.n_layer):
            if self.transposed:
                vtype, size, width = struct.unpack_from("<iII", data, o)
            else:
                vtype, row = struct.unpack_from("<iQ", data, o)
                size = _ELEMENT_BYTES.get(vtype, 0)
                width = row // size if size else 0
            if size != _ELEMENT_BYTES.get(vtype) or width <= 0:
                raise ValueError(f"values of ggml type {vtype}")
            body = np.frombuffer(data, dtype=f"V{size}", count=n_cells * width, offset=o + 12)
            block = body.reshape(width, n_cells).T if self.transposed else body.reshape(n_cells, width)
            out.append((o, vtype, size, block))
            o += 12 + n_cells * width * size
        if o != len(data):
            raise ValueError(f"{len(data) - o} bytes after the values")
        return out


def _relayout(data: memoryview, transposed: bool) -> bytearray:
    layout = _Layout.read(data)
    out = bytearray(data)
    if layout.transposed == transposed:
        return out
    struct.pack_into("<I", out, layout.flag_at, int(transposed))
    for o, vtype, size, block in layout.values(data):
        width = block.shape[1]
        if transposed:
            struct.pack_into("<iII", out, o, vtype, size, width)
            moved = block.T
        else:
            struct.pack_into("<iQ", out, o, vtype, width * size)
            moved = block
        body = np.ascontiguousarray(moved).tobytes()
        out[o + 12 : o + 12 + len(body)] = body
    return out
