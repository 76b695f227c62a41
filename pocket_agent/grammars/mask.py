"""Token bitmasks: apply them to logits and list the tokens they allow.

A bitmask row is an ``int32`` array of ``ceil(V / 32)`` words; bit ``i % 32`` of word
``i // 32`` is set when token ``i`` is allowed (llguidance's layout).

Masks from JSON grammars are bimodal: at structural positions a handful of tokens are
allowed (often 1-20), inside strings almost all are (~48.8k of 49k). :func:`apply_mask`
picks its path by the number of non-zero words (one cheap pass over ~1.5k words): few
-> gather the allowed ids and write them into a ``-inf`` row; many -> unpack the
*inverted* mask to a boolean row and ``np.copyto(..., where=)``. ``bench/mask.py``
measures these against the alternatives kept in :data:`MASK_VARIANTS`.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import InvalidInputError

SPARSE_WORDS = 96
"""At most this many non-zero mask words -> :func:`apply_mask` gathers the allowed ids
(at most 3,072 tokens). Measured crossover with the unpack path: ~100-128 words."""

_NEG_INF = -np.inf
_LITTLE = sys.byteorder == "little"


def new_bitmask(vocab_size: int) -> NDArray[np.int32]:
    """An all-allowed bitmask row for ``vocab_size`` tokens."""
    if vocab_size <= 0:
        raise InvalidInputError(f"vocab_size must be positive, got {vocab_size}.")
    return np.full((vocab_size + 31) // 32, -1, dtype=np.int32)


def _words(bitmask: Any) -> NDArray[np.int32]:
    w = np.asarray(bitmask)
    if w.ndim == 2 and w.shape[0] == 1:
        w = w[0]
    if w.ndim != 1 or w.dtype != np.int32:
        raise InvalidInputError(f"bitmask must be a 1-D int32 array, got shape {w.shape} dtype {w.dtype}.")
    if not _LITTLE:
        w = w.astype("<i4")
    return np.ascontiguousarray(w)


def _logits(logits: Any) -> NDArray[np.floating[Any]]:
    if not isinstance(logits, np.ndarray) or logits.ndim != 1 or not np.issubdtype(logits.dtype, np.floating):
        raise InvalidInputError("logits must be a 1-D float numpy array (one row of the vocabulary).")
    return logits


def _ids_from_words(words: NDArray[np.int32]) -> NDArray[np.int64]:
    nz = np.flatnonzero(words)
    if nz.size == 0:
        return nz
    k = np.flatnonzero(np.unpackbits(words[nz].view(np.uint8), bitorder="little"))
    ids: NDArray[np.int64] = (nz[k >> 5] << 5) | (k & 31)
    return ids


def allowed_tokens(bitmask: Any, vocab_size: int | None = None) -> NDArray[np.int64]:
    """Sorted ids of the tokens a bitmask allows (ids ``>= vocab_size`` are dropped)."""
    ids = _ids_from_words(_words(bitmask))
    if vocab_size is not None and ids.size and ids[-1] >= vocab_size:
        ids = ids[: np.searchsorted(ids, vocab_size)]
    return ids


def count_allowed(bitmask: Any) -> int:
    """Number of set bits in a bitmask."""
    return int(np.bitwise_count(_words(bitmask).view(np.uint32)).sum())


def is_allowed(bitmask: Any, token: int) -> bool:
    """Whether ``token`` is allowed by a bitmask."""
    w = _words(bitmask)
    t = int(token)
    if not 0 <= t < w.size * 32:
        return False
    return bool((int(w[t >> 5]) >> (t & 31)) & 1)


def apply_mask(logits: NDArray[Any], bitmask: Any, *, inplace: bool = False) -> NDArray[Any]:
    """Logits with every token the bitmask disallows set to ``-inf``.

    ``logits`` is one row ``(V,)`` of floats; tokens beyond the mask's ``32 * len(bitmask)``
    bits are disallowed, mask bits beyond ``V`` are ignored. Returns a new array unless
    ``inplace=True`` (then ``logits`` itself is changed and returned).
    """
    lg = _logits(logits)
    words = _words(bitmask)
    v = lg.shape[0]
    nbits = words.size * 32
    if np.count_nonzero(words) <= SPARSE_WORDS:
        ids = _ids_from_words(words)
        if ids.size and ids[-1] >= v:
            ids = ids[: np.searchsorted(ids, v)]
        vals = lg[ids]
        out = lg if inplace else np.empty_like(lg)
        out.fill(_NEG_INF)
        out[ids] = vals
        return out
    n = min(v, nbits)
    dis = np.unpackbits((~words).view(np.uint8), count=n, bitorder="little").view(np.bool_)
    out = lg if inplace else lg.copy()
    if v > nbits:
        out[nbits:] = _NEG_INF
        np.copyto(out[:nbits], _NEG_INF, where=dis)
    else:
        np.copyto(out, _NEG_INF, where=dis)
    return out
