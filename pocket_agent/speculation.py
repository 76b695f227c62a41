"""Draft tokens for copy speculation (prompt-lookup decoding).

A small model extracting from a document mostly copies: a grounded value is a verbatim span
of the document, so once the output has started a value, the tokens that followed the same
tokens in the prompt are a good guess for what comes next. :class:`PromptLookup` finds the
latest earlier occurrence of the output's last tokens in the context (prompt and output so
far) and proposes what followed it. The generation loop (``pocket_agent.generate``) cuts the
draft to what the grammar accepts, evaluates it together with the sampled token in one
model call, keeps the prefix that greedy decoding would have chosen anyway and rolls the
rest back. This module is pure token bookkeeping: it knows no model and no grammar.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

DEFAULT_MAX_DRAFT = 8
MIN_DRAFT = 4


class PromptLookup:
    """Proposes draft tokens by copying the context after an earlier occurrence of its end.

    Args:
        prompt: the prompt tokens (the document is in there).
        min_match: how many trailing tokens must match (at least 2; one token alone, a
            digit or a quote, matches too many places to be worth a draft).
        max_match: the longest match compared; among candidates the longest match wins,
            then the latest.
        max_draft: the most tokens one draft proposes. The draft length adapts: it doubles
            (up to this) after a fully accepted draft and shrinks to one more than the
            accepted part (at least 4) after a rejection.
    """

    def __init__(
        self, prompt: Sequence[int], *, min_match: int = 2, max_match: int = 4, max_draft: int = DEFAULT_MAX_DRAFT
    ) -> None:
        if min_match < 2 or max_match < min_match:
            raise ValueError("PromptLookup needs 2 <= min_match <= max_match.")
        self.min_match = min_match
        self.max_match = max_match
        self.max_draft = max(MIN_DRAFT, max_draft)
        self.draft_len = self.max_draft
        self._tokens: list[int] = []
        self._index: dict[tuple[int, int], list[int]] = {}
        self._extend(prompt)
        self._n_prompt = len(self._tokens)

    def follow(self, output: Sequence[int]) -> None:
        """Bring the context up to date with the output so far (all of it, every time)."""
        self._extend(output[len(self._tokens) - self._n_prompt :])

    def _extend(self, tokens: Iterable[int]) -> None:
        toks = self._tokens
        for t in tokens:
            toks.append(int(t))
            if len(toks) >= 2:
                self._index.setdefault((toks[-2], toks[-1]), []).append(len(toks) - 1)

    def propose(self) -> list[int]:
        """The tokens that followed the best earlier match of the context's end (maybe none)."""
        toks = self._tokens
        end = len(toks) - 1
        if end < 1:
            return []
        candidates = self._index.get((toks[-2], toks[-1]), ())
        best, best_len = -1, 0
        for c in reversed(candidates):
            if c >= end:  # the tail itself
                continue
            m = 2
            while m < self.max_match and c - m >= 0 and toks[c - m] == toks[end - m]:
                m += 1
            if m > best_len:
                best, best_len = c, m
                if m == self.max_match:
                    break
        if best < 0 or best_len < self.min_match:
            return []
        return toks[best + 1 : best + 1 + self.draft_len]

    def feedback(self, proposed: int, accepted: int) -> None:
        """Adapt the draft length to how much of a ``proposed``-token draft was accepted."""
        if proposed <= 0:
            return
        if accepted >= proposed:
            self.draft_len = min(self.max_draft, self.draft_len * 2)
        else:
            self.draft_len = max(MIN_DRAFT, min(self.max_draft, accepted + 1))


__all__ = ["DEFAULT_MAX_DRAFT", "PromptLookup"]
