"""A model's identity for Dec adapters: a hash of facts that survive format conversion."""

from __future__ import annotations

import hashlib
import weakref

from .base import Model

IDENTITY_SCHEME = "pocket-agent/model-identity/v1"

_cache: weakref.WeakKeyDictionary[Model, str] = weakref.WeakKeyDictionary()


def identity_from_facts(architecture: str, n_embd: int, token_bytes: tuple[bytes, ...] | list[bytes]) -> str:
    """The identity hash from its inputs (see :func:`model_identity`)."""
    h = hashlib.sha256()
    h.update(IDENTITY_SCHEME.encode("ascii") + b"\n")
    h.update(architecture.strip().lower().encode("utf-8") + b"\n")
    h.update(f"{int(n_embd)}\n{len(token_bytes)}\n".encode("ascii"))
    for tok in token_bytes:
        h.update(len(tok).to_bytes(4, "little"))
        h.update(tok)
    return h.hexdigest()


def model_identity(model: Model) -> str:
    """The base model's identity: ``sha256`` (hex) of stable facts about it.

    Hashed, in order: the scheme name ``pocket-agent/model-identity/v1``, the
    architecture name (lower case, e.g. ``llama``), the hidden size ``n_embd``, the
    vocabulary size, and every token's exact bytes (length-prefixed, 4 bytes little
    endian) in id order. Weights and quantisation are not part of it, so a GGUF and an
    MNN build converted from the same checkpoint share the identity when both backends
    report the same architecture name and vocabulary bytes.
    """
    cached = _cache.get(model)
    if cached is None:
        cached = identity_from_facts(model.info.architecture, model.info.n_embd, model.vocab.token_bytes)
        _cache[model] = cached
    return cached
