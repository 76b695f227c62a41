"""Lanes: several token sequences decoded together, one batched evaluation per step.

Decoding a small model on a CPU costs about as much for the next token of four sequences
in one batch as for two tokens of one (measured, SmolLM2-135M Q8_0 at 1 thread: 52 ms a
step for 4 lanes, 24 ms for one). A lane is a KV sequence apart from the model's main
one (sequence 0): it starts as a copy of a shared prefix (the prompt part every job has),
is fed its own tokens in :meth:`Lanes.step` together with the other lanes', and when its
work is done its keys and values can become the main cache (:meth:`Lanes.adopt`), so an
ordinary call continues from there without evaluating anything again.

Only backends that can evaluate several sequences in one batch have lanes (llama.cpp);
see :func:`lane_count`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from ..errors import BackendError, ContextOverflowError, ModelStateError
from .base import Model, common_prefix_length


def lane_count(model: Model) -> int:
    """How many lanes ``model`` can open at once (0: none)."""
    return model._lane_max() if model.capabilities.multi_sequence else 0


class Lanes:
    """``width`` lanes of ``model``, opened together and closed together.

    Hold ``model.lock`` while calling into them. Each lane holds at most :attr:`capacity`
    tokens, prompt and output together.
    """

    def __init__(self, model: Model, width: int) -> None:
        if width < 1:
            raise ValueError(f"width must be at least 1, got {width}.")
        if width > lane_count(model):
            raise ModelStateError(f"The {model.backend} model has {lane_count(model)} lane(s); {width} were asked for.")
        self._model = model
        self.capacity, self._prefix = model._lane_open(width)
        self._free = list(range(1, width + 1))
        self._tokens: dict[int, list[int]] = {}  # lane -> the tokens it holds
        self._single: dict[int, int] = {}  # lane -> its first position fed alone (a one-token feed)
        self._weights = model._weights_key()
        self._closed = False

    def __enter__(self) -> Lanes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def free(self) -> int:
        """How many lanes are not in use."""
        return len(self._free)

    @property
    def prefix(self) -> list[int]:
        """The shared prefix new lanes start from (a copy)."""
        return list(self._prefix)

    def room(self, lane: int) -> int:
        """How many more tokens ``lane`` can take."""
        return self.capacity - len(self._tokens[lane])

    def share(self, prefix: Sequence[int]) -> None:
        """Make ``prefix`` the shared prefix new lanes start from (what is already evaluated of
        it stays)."""
        self._check()
        if len(prefix) > self.capacity:
            prefix = prefix[: self.capacity]
        self._prefix = self._model._lane_share(self._model._check_ids(prefix, allow_empty=True))

    def start(self, prompt: Sequence[int]) -> tuple[int, int]:
        """Take a free lane for ``prompt``; it starts holding the longest prefix of ``prompt``
        that the shared prefix holds, leaving at least two tokens to evaluate (a batch of
        one token rounds differently). Returns ``(lane, n)``: feed ``prompt[n:]`` to it."""
        self._check()
        if not self._free:
            raise ModelStateError("No lane is free; finish one first.")
        keep = min(common_prefix_length(self._prefix, prompt), max(len(prompt) - 2, 0))
        lane = self._free.pop(0)
        self._model._lane_start(lane, keep)
        self._tokens[lane] = list(prompt[:keep])
        return lane, keep

    def finish(self, lane: int) -> None:
        """Free ``lane`` and forget what it holds."""
        if lane in self._tokens:
            self._model._lane_drop(lane)
            del self._tokens[lane]
            self._single.pop(lane, None)
            self._free.append(lane)

    def close(self) -> None:
        """Free every lane."""
        if self._closed:
            return
        for lane in list(self._tokens):
            self.finish(lane)
        self._model._lane_close()
        self._closed = True

    def _check(self) -> None:
        if self._closed:
            raise ModelStateError("These lanes are closed.")
        self._model._check_open()
        if self._model._weights_key() != self._weights:
            raise ModelStateError("The model's LoRA adapters changed while lanes were open; open new lanes.")

    def step(self, feeds: Mapping[int, Sequence[int]]) -> dict[int, NDArray[np.float32]]:
        """Evaluate each lane's new tokens; the logits after each lane's last new token.

        Lanes fed one token each are evaluated in one batch; a lane fed several tokens is
        evaluated on its own. llama.cpp computes a sequence's attention differently for
        one new token than for several (logits apart by up to ~1 for SmolLM2-135M), and
        splits a batch by sequence as it likes, so mixing them would give a lane results
        its generation alone would not; evaluated this way each lane's logits equal those
        on Q8_0 weights (measured: 8 of 8 SROIE outputs equal token for token). BF16
        weights sum one row in another order than several: logits up to ~0.15 apart.

        Raises :class:`ContextOverflowError` (nothing evaluated) when a lane's tokens do not
        fit it. A failed evaluation leaves the lanes fed in it in an unknown state: they are
        freed before the error is raised.
        """
        self._check()
        model = self._model
        groups: dict[int, list[int]] = {}  # 0: the lanes fed one token; else a lane fed several, alone
        for lane, toks in feeds.items():
            if lane not in self._tokens:
                raise ModelStateError(f"Lane {lane} is not in use.")
            if not toks:
                continue
            model._check_ids(toks)
            if len(toks) > self.room(lane):
                raise ContextOverflowError(
                    f"Lane {lane} holds {len(self._tokens[lane])} tokens and cannot take {len(toks)} more "
                    f"(it holds {self.capacity}).",
                    needed=len(self._tokens[lane]) + len(toks),
                    n_ctx=self.capacity,
                )
            groups.setdefault(0 if len(toks) == 1 else lane, []).append(lane)
        out: dict[int, NDArray[np.float32]] = {}
        for lanes in groups.values():
            items: list[tuple[int, int, int, bool]] = []
            for lane in lanes:
                toks, pos = feeds[lane], len(self._tokens[lane])
                items.extend((t, pos + j, lane, j == len(toks) - 1) for j, t in enumerate(toks))
            try:
                rows = model._lane_decode(items)
            except BackendError:
                for lane in feeds:
                    self.finish(lane)
                raise
            for lane, row in zip(lanes, rows, strict=True):
                if len(feeds[lane]) == 1:
                    self._single.setdefault(lane, len(self._tokens[lane]))
                self._tokens[lane].extend(feeds[lane])
                out[lane] = row
        return out

    def adopt(self, lane: int) -> None:
        """Make the model's main cache hold what ``lane`` holds (its keys and values move
        over), then free the lane. A following :meth:`Model.prefill` of the lane's tokens, or
        of a prefix of them, evaluates only what it has to."""
        self._check()
        model = self._model
        toks = self._tokens[lane]
        single = self._single.get(lane)
        with model.lock:
            model._clear_cache()
            try:
                model._lane_adopt(lane)
            finally:
                self.finish(lane)
            model._cached.extend(toks)
            # later prefills re-evaluate from the first position a one-token feed computed
            # (see Model.reusable_prefix), as after decoding on sequence 0
            model._single_from = single
