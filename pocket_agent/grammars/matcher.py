"""The matcher a generation loop drives: next-token masks, consuming tokens, forced tokens.

Typical loop::

    m = compile_grammar(Invoice, model).matcher()
    while not m.is_stopped():
        forced = m.forced_tokens()          # e.g. '{"' 'invoice' ... : feed as one batch
        if forced:
            m.consume_many(forced); ...; continue
        mask = m.compute_mask()             # int32 words, reused buffer
        logits = apply_mask(logits, mask, inplace=True)
        tok = sample(logits)
        m.consume(tok)                      # EOS ends it once the output is complete
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from ..errors import ConstraintError, InvalidInputError, TokenRejectedError
from .mask import allowed_tokens

if TYPE_CHECKING:
    from .compiler import CompiledGrammar


class GrammarMatcher:
    """State of one output being generated under a :class:`CompiledGrammar`.

    Not thread-safe; make one per generation (``compiled.matcher()`` is cheap). A
    rejected token never changes the state: :meth:`consume` raises
    :class:`TokenRejectedError` and the matcher stays usable.
    """

    def __init__(self, compiled: CompiledGrammar) -> None:
        self.compiled = compiled
        self._m = compiled.new_llmatcher()
        self._mask: NDArray[np.int32] = np.zeros(compiled.mask_words, dtype=np.int32)
        self._consumed = 0
        self._vocab_size = compiled.vocab_size

    # -- masks -------------------------------------------------------------------------

    def fill_mask(self, bitmask_row: NDArray[np.int32]) -> None:
        """Write the next-token mask into ``bitmask_row`` (1-D, C-contiguous int32,
        :attr:`CompiledGrammar.mask_words` long)."""
        row = bitmask_row
        if (
            not isinstance(row, np.ndarray)
            or row.dtype != np.int32
            or row.ndim != 1
            or row.shape[0] != self._mask.shape[0]
            or not row.flags.c_contiguous
            or not row.flags.writeable
        ):
            raise InvalidInputError(
                f"bitmask_row must be a writeable C-contiguous int32 array of {self._mask.shape[0]} words."
            )
        self._m.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        if self._m.is_error():
            raise self._failed("computing the next-token mask")

    def compute_mask(self) -> NDArray[np.int32]:
        """The next-token mask, in a buffer this matcher reuses (copy it to keep it)."""
        self._m.unsafe_compute_mask_ptr(self._mask.ctypes.data, self._mask.nbytes)
        if self._m.is_error():
            raise self._failed("computing the next-token mask")
        return self._mask

    def allowed_tokens(self) -> NDArray[np.int64]:
        """Ids of the tokens allowed next (computes the mask)."""
        return allowed_tokens(self.compute_mask(), self._vocab_size)

    # -- consuming -----------------------------------------------------------------------

    def is_allowed(self, token: int) -> bool:
        """Whether ``token`` may come next (no state change; cheaper than a full mask)."""
        t = int(token)
        return 0 <= t < self._vocab_size and self._m.validate_tokens([t]) == 1

    def validate(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` (a prefix) the grammar would accept now; no state change."""
        toks = [int(t) for t in tokens]
        if any(not 0 <= t < self._vocab_size for t in toks):
            bad = next(i for i, t in enumerate(toks) if not 0 <= t < self._vocab_size)
            toks = toks[:bad]
        return self._m.validate_tokens(toks) if toks else 0

    def consume(self, token: int) -> None:
        """Advance by one token; raise :class:`TokenRejectedError` if it is not allowed."""
        t = int(token)
        if 0 <= t < self._vocab_size and self._m.try_consume_tokens([t]) == 1:
            self._consumed += 1
            return
        raise self._rejected(t)

    def consume_many(self, tokens: Sequence[int]) -> None:
        """Advance by several tokens, all or nothing: if one is rejected, none is consumed
        and :class:`TokenRejectedError` names the first bad one."""
        toks = [int(t) for t in tokens]
        if not toks:
            return
        good = 0
        while good < len(toks) and 0 <= toks[good] < self._vocab_size:
            good += 1
        n = self._m.try_consume_tokens(toks[:good]) if good else 0
        if n == len(toks):
            self._consumed += n
            return
        err = self._rejected(toks[n], offset=n)
        if n and not self._m.rollback(n):
            raise ConstraintError(f"Could not undo {n} tokens after a rejected token.", detail=self._m.get_error())
        raise err

    def try_consume(self, tokens: Sequence[int]) -> int:
        """Consume the longest accepted prefix of ``tokens``; return its length."""
        toks = [int(t) for t in tokens]
        good = 0
        while good < len(toks) and 0 <= toks[good] < self._vocab_size:
            good += 1
        n = self._m.try_consume_tokens(toks[:good]) if good else 0
        self._consumed += n
        return n

    # -- fast-forward ------------------------------------------------------------------------

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces next (e.g. a fixed JSON key), safe to feed without
        sampling; empty when the next token is a real choice. Not consumed yet."""
        if self._m.is_stopped():
            return []
        return list(self._m.compute_ff_tokens())

    def forced_bytes(self) -> bytes:
        """Bytes the grammar forces next (may end inside a token)."""
        if self._m.is_stopped():
            return b""
        return bytes(self._m.compute_ff_bytes())

    # -- state -------------------------------------------------------------------------------

    def is_accepting(self) -> bool:
        """The output so far is complete and valid (EOS would be accepted)."""
        return bool(self._m.is_accepting())

    def is_stopped(self) -> bool:
        """No more tokens except EOS can follow (EOS consumed, grammar exhausted, or error)."""
        return bool(self._m.is_stopped())

    def stop_reason(self) -> str:
        """llguidance's stop reason (``"NotStopped"``, ``"EndOfSentence"``, ``"NoExtension"``...)."""
        return str(self._m.stop_reason())

    def error(self) -> str:
        """llguidance's error text, empty unless the matcher failed."""
        return str(self._m.get_error()).replace("\n<non-verbose/>", "")

    def is_error(self) -> bool:
        """The matcher hit an internal error or limit and cannot continue."""
        return bool(self._m.is_error())

    @property
    def num_consumed(self) -> int:
        """Tokens consumed since the start (or the last :meth:`reset`)."""
        return self._consumed

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` consumed tokens."""
        if not isinstance(n, int) or not 0 <= n <= self._consumed:
            raise InvalidInputError(f"Cannot roll back {n!r} tokens: {self._consumed} were consumed.")
        if n == 0:
            return
        if not self._m.rollback(n):
            raise ConstraintError(f"The grammar matcher could not roll back {n} tokens.", detail=self.error())
        self._consumed -= n

    def reset(self) -> None:
        """Back to the start of the output (also clears an error state)."""
        self._m = self.compiled.new_llmatcher()
        self._consumed = 0

    def copy(self) -> GrammarMatcher:
        """An independent matcher in the same state."""
        other = GrammarMatcher.__new__(GrammarMatcher)
        other.compiled = self.compiled
        other._m = self._m.deep_copy()
        other._mask = np.zeros_like(self._mask)
        other._consumed = self._consumed
        other._vocab_size = self._vocab_size
        return other

    # -- errors ------------------------------------------------------------------------------

    def _token_text(self, t: int) -> str:
        if not 0 <= t < self._vocab_size:
            return "<out of range>"
        try:
            return str(self.compiled.tokenizer.dbg_tokens([t]))
        except Exception:  # pragma: no cover - debug text only
            return f"#{t}"

    def _rejected(self, t: int, offset: int = 0) -> TokenRejectedError:
        pos = self._consumed + offset
        if self._m.is_error():
            return TokenRejectedError(
                f"The grammar matcher is in an error state and cannot take token {t}: {self.error()}",
                token=t,
                position=pos,
                detail=self.error(),
            )
        if not 0 <= t < self._vocab_size:
            return TokenRejectedError(
                f"Token id {t} is outside the vocabulary [0, {self._vocab_size}).", token=t, position=pos
            )
        probe: Any = self._m.deep_copy()  # state right before the bad token
        probe.consume_token(t)
        detail = str(probe.get_error()).replace("\n<non-verbose/>", "")
        return TokenRejectedError(
            f"Token {t} {self._token_text(t)} is not allowed by the grammar after {pos} tokens"
            + (f": {detail}" if detail else "."),
            token=t,
            position=pos,
            detail=detail,
        )

    def _failed(self, what: str) -> ConstraintError:
        return ConstraintError(
            f"The grammar matcher failed while {what}: {self.error()}. Generation cannot stay constrained.",
            detail=self.error(),
        )

    def __repr__(self) -> str:
        return (
            f"<GrammarMatcher {self.compiled.kind} consumed={self._consumed} "
            f"accepting={self.is_accepting()} stopped={self.is_stopped()}>"
        )
