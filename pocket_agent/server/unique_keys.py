"""No JSON object written under a grammar repeats a key: a decode-time guard.

A grammar cannot say "a key not used before in this object" (the set of keys is unbounded;
llguidance compiles context-free grammars), so ``{"type": "object"}`` (``json_object`` mode)
lets a small model write ``{"name": "a", "name": "b"}``: valid JSON text for some parsers,
a lost value for all of them. :func:`unique_keys` wraps a compiled grammar so that its
matchers follow the JSON being written (:class:`KeyTracker`) and, while an object key is
being written, take out of each next-token mask the tokens that would close it as a key the
same object already has. The model then writes another key (or ends the key otherwise);
everything else the grammar allows stays allowed.

Keys are compared as the bytes written. Inside a key the guard also takes out the escapes
``\\u`` and ``\\/``, the only ones that give a character a second spelling, so equal bytes
mean equal keys (a control character other than ``\\b\\f\\n\\r\\t`` cannot be a key's).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..grammars import CompiledGrammar, GrammarMatcher
from ..runtime import Model

_QUOTE, _BACKSLASH = 0x22, 0x5C
_SECOND_SPELLINGS = (b"\\u", b"\\/")


@dataclass
class KeyTracker:
    """Follows JSON text byte by byte: the open containers (for an object, the keys it has,
    as written), and whether the text is inside an object key (``key`` holds it so far).

    Text outside any container is skipped, so the JSON may follow other text (a tool call's
    tag). The text is assumed valid (the grammar sees to that): the tracker does not check it.
    """

    stack: list[set[bytes] | None] = field(default_factory=list)
    """One entry per open container: an object's keys, or ``None`` for an array."""
    key: bytearray | None = None
    """The key being written (its bytes after the opening quote), or ``None``."""
    in_string: bool = False
    escaped: bool = False
    """The last byte of the string so far is a backslash that starts an escape."""
    expect_key: bool = False

    def feed(self, data: bytes) -> None:
        """Advance over ``data``."""
        for b in data:
            if self.in_string:
                self._string_byte(b)
            elif b in b"{[":
                self.stack.append(set() if b == 0x7B else None)
                self.expect_key = b == 0x7B
            elif not self.stack:
                continue
            elif b in b"}]":
                self.stack.pop()
                self.expect_key = False
            elif b == 0x2C:  # ,
                self.expect_key = self.stack[-1] is not None
            elif b == _QUOTE:
                self.in_string = True
                self.key = bytearray() if self.expect_key and self.stack[-1] is not None else None
                self.expect_key = False

    def _string_byte(self, b: int) -> None:
        if self.escaped:
            self.escaped = False
        elif b == _BACKSLASH:
            self.escaped = True
        elif b == _QUOTE:
            self.in_string = False
            if self.key is not None:
                keys = self.stack[-1]
                assert keys is not None
                keys.add(bytes(self.key))
                self.key = None
            return
        if self.key is not None:
            self.key.append(b)

    @property
    def in_key(self) -> bool:
        """Whether the text is inside an object key."""
        return self.key is not None

    def taken(self) -> list[bytes]:
        """The keys the innermost open object already has."""
        keys = self.stack[-1] if self.stack else None
        return sorted(keys) if keys else []

    def copy(self) -> KeyTracker:
        """An independent tracker in the same state."""
        return KeyTracker(
            stack=[None if s is None else set(s) for s in self.stack],
            key=None if self.key is None else bytearray(self.key),
            in_string=self.in_string,
            escaped=self.escaped,
            expect_key=self.expect_key,
        )


class KeyVocabulary:
    """A model's token bytes, sorted, to find the tokens that begin with given bytes."""

    def __init__(self, token_bytes: Sequence[bytes], special_ids: frozenset[int]) -> None:
        self.token_bytes = list(token_bytes)
        self.special = special_ids
        order = sorted((t, i) for i, t in enumerate(self.token_bytes) if i not in special_ids and t)
        self._sorted = [t for t, _ in order]
        self._ids = np.array([i for _, i in order], dtype=np.int64)
        spelled = [i for i, t in enumerate(self.token_bytes) if any(s in t for s in _SECOND_SPELLINGS)]
        self.second_spellings = np.array(spelled, dtype=np.int64)
        """Tokens holding ``\\u`` or ``\\/`` (taken out inside a key)."""

    def starting_with(self, prefix: bytes) -> NDArray[np.int64]:
        """Ids of the (non-special) tokens whose bytes begin with ``prefix``."""
        lo = bisect.bisect_left(self._sorted, prefix)
        hi = lo
        while hi < len(self._sorted) and self._sorted[hi].startswith(prefix):
            hi += 1
        return self._ids[lo:hi]


_VOCABS: dict[int, tuple[Any, KeyVocabulary]] = {}
_VOCABS_LOCK = threading.Lock()


def key_vocabulary(model: Model) -> KeyVocabulary:
    """The :class:`KeyVocabulary` of ``model``'s vocabulary (built once per vocabulary)."""
    vocab = model.vocab
    with _VOCABS_LOCK:
        hit = _VOCABS.get(id(vocab))
        if hit is None or hit[0] is not vocab:
            hit = (vocab, KeyVocabulary(vocab.token_bytes, vocab.special_ids))
            _VOCABS[id(vocab)] = hit
        return hit[1]


def banned_tokens(tracker: KeyTracker, vocab: KeyVocabulary) -> NDArray[np.int64]:
    """The tokens that must not come next: inside a key, those closing it as a key the object
    has, and the escapes that would spell a character a second way; elsewhere none."""
    if tracker.key is None:
        return np.zeros(0, dtype=np.int64)
    so_far = bytes(tracker.key)
    parts = [vocab.second_spellings]
    if tracker.escaped:  # the key ends in a backslash: "u" or "/" would complete \u or \/
        parts += [vocab.starting_with(b"u"), vocab.starting_with(b"/")]
    for key in tracker.taken():
        if key.startswith(so_far):
            parts.append(vocab.starting_with(key[len(so_far) :] + b'"'))
    return np.unique(np.concatenate(parts))


def clear_bits(mask: NDArray[np.int32], ids: NDArray[np.int64]) -> None:
    """Disallow ``ids`` in the bitmask row ``mask`` (in place)."""
    ids = ids[ids < mask.size * 32]
    if ids.size == 0:
        return
    words = mask.view(np.uint32)
    bits = np.left_shift(np.uint32(1), (ids & 31).astype(np.uint32))
    np.bitwise_and.at(words, ids >> 5, ~bits)


class UniqueKeysMatcher(GrammarMatcher):
    """A :class:`GrammarMatcher` whose masks never let an object repeat a key."""

    def __init__(self, compiled: CompiledGrammar, vocab: KeyVocabulary) -> None:
        super().__init__(compiled)
        self._vocab = vocab
        self._tracker = KeyTracker()
        self._history: list[int] = []

    def _ban(self, mask: NDArray[np.int32]) -> None:
        if not self._tracker.in_key:
            return
        banned = banned_tokens(self._tracker, self._vocab)
        if banned.size == 0:
            return
        before = mask.copy()
        clear_bits(mask, banned)
        if not mask.any():  # never a dead end: (a grammar that forces the key) keep its mask
            mask[:] = before

    def _feed(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            t = int(t)
            self._history.append(t)
            if t not in self._vocab.special:
                self._tracker.feed(self._vocab.token_bytes[t])

    def fill_mask(self, bitmask_row: NDArray[np.int32]) -> None:
        """Write the next-token mask (see :meth:`GrammarMatcher.fill_mask`), repeated keys out."""
        super().fill_mask(bitmask_row)
        self._ban(bitmask_row)

    def compute_mask(self) -> NDArray[np.int32]:
        """The next-token mask (see :meth:`GrammarMatcher.compute_mask`), repeated keys out."""
        mask = super().compute_mask()
        self._ban(mask)
        return mask

    def consume(self, token: int) -> None:
        """Advance by one token (see :meth:`GrammarMatcher.consume`)."""
        super().consume(token)
        self._feed([token])

    def consume_many(self, tokens: Sequence[int]) -> None:
        """Advance by several tokens, all or nothing (see :meth:`GrammarMatcher.consume_many`)."""
        super().consume_many(tokens)
        self._feed(tokens)

    def try_consume(self, tokens: Sequence[int]) -> int:
        """Consume the longest accepted prefix of ``tokens``; return its length."""
        n = super().try_consume(tokens)
        self._feed(list(tokens)[:n])
        return n

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` consumed tokens."""
        super().rollback(n)
        if n:
            kept = self._history[:-n]
            self._history = []
            self._tracker = KeyTracker()
            self._feed(kept)

    def reset(self) -> None:
        """Back to the start of the output."""
        super().reset()
        self._history = []
        self._tracker = KeyTracker()

    def copy(self) -> UniqueKeysMatcher:
        """An independent matcher in the same state."""
        base = super().copy()
        other = UniqueKeysMatcher.__new__(UniqueKeysMatcher)
        other.__dict__.update(base.__dict__)
        other._vocab = self._vocab
        other._tracker = self._tracker.copy()
        other._history = list(self._history)
        return other


class UniqueKeysGrammar(CompiledGrammar):
    """A compiled grammar whose matchers are :class:`UniqueKeysMatcher` objects; the same
    grammar otherwise (it shares the wrapped one's compiled state)."""

    def __init__(self, inner: CompiledGrammar, vocab: KeyVocabulary) -> None:
        self.__dict__.update(inner.__dict__)
        self.key_vocabulary = vocab

    def matcher(self) -> GrammarMatcher:
        """A new :class:`UniqueKeysMatcher` at the start of the output."""
        return UniqueKeysMatcher(self, self.key_vocabulary)


def unique_keys(grammar: CompiledGrammar, model: Model) -> CompiledGrammar:
    """``grammar`` with matchers that let no JSON object repeat a key (see the module)."""
    if isinstance(grammar, UniqueKeysGrammar):
        return grammar
    return UniqueKeysGrammar(grammar, key_vocabulary(model))
