"""The ways of applying a token bitmask to logits that ``bench/mask.py`` measures.

``pocket_agent.grammars.mask.apply_mask`` is the one the library uses (the adaptive
variant); the others are kept here, outside the package, to show why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pocket_agent.grammars.mask import _NEG_INF, _ids_from_words, _logits, _words, apply_mask


def apply_mask_reference(logits: NDArray[Any], bitmask: Any) -> NDArray[Any]:
    """Bit-by-bit reference: slow, obviously right (used by the tests)."""
    lg = _logits(logits)
    words = _words(bitmask)
    out = lg.copy()
    for t in range(lg.shape[0]):
        if t >= words.size * 32 or not (int(words[t >> 5]) >> (t & 31)) & 1:
            out[t] = _NEG_INF
    return out


def _v_llguidance(lg: NDArray[Any], words: NDArray[np.int32]) -> NDArray[Any]:
    from llguidance.numpy import apply_token_bitmask_inplace

    out = lg.copy()
    apply_token_bitmask_inplace(out, words)  # type: ignore[no-untyped-call]
    return out


def _v_unpack_index(lg: NDArray[Any], words: NDArray[np.int32]) -> NDArray[Any]:
    allowed = np.unpackbits(words.view(np.uint8), count=lg.shape[0], bitorder="little").view(np.bool_)
    out = lg.copy()
    out[~allowed] = _NEG_INF
    return out


def _v_unpack_copyto(lg: NDArray[Any], words: NDArray[np.int32]) -> NDArray[Any]:
    dis = np.unpackbits((~words).view(np.uint8), count=lg.shape[0], bitorder="little").view(np.bool_)
    out = lg.copy()
    np.copyto(out, _NEG_INF, where=dis)
    return out


def _v_unpack_putmask(lg: NDArray[Any], words: NDArray[np.int32]) -> NDArray[Any]:
    dis = np.unpackbits((~words).view(np.uint8), count=lg.shape[0], bitorder="little").view(np.bool_)
    out = lg.copy()
    np.putmask(out, dis, _NEG_INF)
    return out


def _v_where(lg: NDArray[Any], words: NDArray[np.int32]) -> NDArray[Any]:
    allowed = np.unpackbits(words.view(np.uint8), count=lg.shape[0], bitorder="little").view(np.bool_)
    return np.where(allowed, lg, _NEG_INF)


_BYTE_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little").astype(np.bool_)


def _v_lut(lg: NDArray[Any], words: NDArray[np.int32]) -> NDArray[Any]:
    allowed = np.take(_BYTE_BITS, words.view(np.uint8), axis=0).reshape(-1)[: lg.shape[0]]
    out = lg.copy()
    np.copyto(out, _NEG_INF, where=~allowed)
    return out


def _v_gather(lg: NDArray[Any], words: NDArray[np.int32]) -> NDArray[Any]:
    ids = _ids_from_words(words)
    out = np.full_like(lg, _NEG_INF)
    out[ids] = lg[ids]
    return out


def _v_scatter_disallowed(lg: NDArray[Any], words: NDArray[np.int32]) -> NDArray[Any]:
    ids = _ids_from_words(~words)
    out = lg.copy()
    out[ids[ids < lg.shape[0]]] = _NEG_INF
    return out


def _v_adaptive(lg: NDArray[Any], words: NDArray[np.int32]) -> NDArray[Any]:
    return apply_mask(lg, words)


MASK_VARIANTS: dict[str, Callable[[NDArray[Any], NDArray[np.int32]], NDArray[Any]]] = {
    "llguidance.numpy (repeat+shift)": _v_llguidance,
    "unpackbits + bool index": _v_unpack_index,
    "unpackbits(~mask) + copyto": _v_unpack_copyto,
    "unpackbits(~mask) + putmask": _v_unpack_putmask,
    "unpackbits + np.where": _v_where,
    "byte LUT + copyto": _v_lut,
    "gather allowed ids": _v_gather,
    "scatter disallowed ids": _v_scatter_disallowed,
    "adaptive (apply_mask)": _v_adaptive,
}
"""Every ``apply_mask`` strategy measured in ``bench/mask.py`` (all return a new array)."""
