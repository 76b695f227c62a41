"""Several continuations of one prefix: their logits, batched where the backend is exact.

Scored choices (decision options, printed numbers in extraction) evaluate a handful of
short branches after one long shared prefix. Backends with multi-sequence support can do
that in one batch; :func:`branches_reliable` checks once per model that the batch gives
the single-sequence results, else :func:`branch_logits` evaluates the branches one by one.
"""

from __future__ import annotations

import weakref

import numpy as np
from numpy.typing import NDArray

from .base import Model

_reliable: weakref.WeakKeyDictionary[Model, bool] = weakref.WeakKeyDictionary()
_PROBE_TEXT = "The quick brown fox jumps over the lazy dog while the five boxing wizards jump quickly."


def branch_logits(model: Model, prefix: list[int], branches: list[list[int]]) -> list[NDArray[np.float32]]:
    """Logits at ``[last prefix token] + branch`` for every branch; the prefix is evaluated once.

    All branches go into one batched decode when the backend reproduces single-sequence
    results that way (:func:`branches_reliable`); otherwise each branch is evaluated after
    the cached prefix and rolled back.
    """
    if branches_reliable(model):
        return [out.logits for out in model.eval_branches(prefix, branches)]
    first = model.prefill(prefix, logits="last").logits[-1:]
    base = len(prefix)
    out = []
    for branch in branches:
        res = model.eval(branch, logits="all")
        model.rollback(base)
        out.append(np.concatenate([first, res.logits], axis=0))
    return out


def branches_reliable(model: Model) -> bool:
    """Whether batched multi-sequence evaluation matches one-sequence evaluation on this model.

    Checked once per model with a short probe (three identical branches after a short
    prefix, compared with the same tokens evaluated as one sequence). llama.cpp builds
    without flash attention were seen to return logits off by up to ~1.3 for the second
    and later sequences of a batch; such models get the sequential path.
    """
    if not model.capabilities.multi_sequence:
        return False
    known = _reliable.get(model)
    if known is not None:
        return known
    toks = model.tokenize(_PROBE_TEXT)
    prefix, branch = toks[:4], toks[4:]
    model.reset()
    ref = model.eval(toks, logits="all").logits[len(prefix) - 1 :]
    model.reset()
    outs = model.eval_branches(prefix, [branch, branch, branch])
    ok = all(float(np.abs(o.logits - ref).max()) < 1e-2 for o in outs)
    model.reset()
    _reliable[model] = ok
    return ok


__all__ = ["branch_logits", "branches_reliable"]
