"""The runtime protocol: what every backend gives the layers above it.

A :class:`Model` owns one loaded model and one persistent KV cache (sequence 0). The
layers above it (grammars, the generation loop, tools, decisions) only ever talk to this
interface; nothing outside ``pocket_agent.runtime`` imports ``llama_cpp`` or ``MNN``.

The KV cache is tracked in Python: :attr:`Model.cached_tokens` is exactly the token list
whose keys and values the backend holds, so :meth:`Model.prefill` can evaluate only the
suffix that differs from the previous call.
"""

from __future__ import annotations

import abc
import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np
from numpy.typing import NDArray

from ..errors import (
    AdapterError,
    ContextOverflowError,
    ModelStateError,
    TokenError,
)

if TYPE_CHECKING:
    from .chat_template import ChatTemplate

_F = TypeVar("_F", bound=Callable[..., Any])


def _locked(method: _F) -> _F:
    """Run ``method`` holding the model's lock (see :attr:`Model.lock`)."""

    @functools.wraps(method)
    def wrapper(self: Model, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


LogitsSelection = Literal["last", "all", "none"] | Sequence[int]
"""Which positions of an evaluation return logits: the last one, all, none, or indices
into the evaluated tokens (negative indices count from the end)."""


@dataclass(frozen=True)
class Vocabulary:
    """The model's vocabulary as raw bytes.

    ``token_bytes[i]`` is the exact byte string token ``i`` stands for (special tokens
    hold their text, e.g. ``b"<|im_end|>"``); ``special_ids`` marks control tokens that
    a tokenizer never produces from plain text.
    """

    token_bytes: tuple[bytes, ...]
    special_ids: frozenset[int]
    eos_ids: tuple[int, ...]
    bos_id: int | None = None
    add_bos: bool = False

    @property
    def size(self) -> int:
        return len(self.token_bytes)

    def marked_token_bytes(self) -> list[bytes]:
        """Token bytes with special tokens prefixed by 0xFF, the convention llguidance uses."""
        return [b"\xff" + t if i in self.special_ids else t for i, t in enumerate(self.token_bytes)]

    def token_id(self, text: str) -> int | None:
        """The id of the token whose bytes are exactly ``text`` (special tokens included)."""
        target = text.encode("utf-8")
        for i, tok in enumerate(self.token_bytes):
            if tok == target:
                return i
        return None


@dataclass(frozen=True)
class ModelInfo:
    """Static facts about a loaded model, as ``pocket-agent info`` prints them."""

    backend: str
    path: Path
    name: str
    architecture: str
    n_vocab: int
    n_ctx: int
    n_ctx_train: int
    n_embd: int
    file_size: int
    chat_template_source: str
    extra: dict[str, str] = field(default_factory=dict)
    n_layer: int = 0


@dataclass(frozen=True)
class Capabilities:
    """Optional features a backend supports."""

    multi_sequence: bool
    hidden_states: bool
    lora: bool
    layer_states: bool = False
    probabilities: bool = True
    """Whether the logits are the model's next-token distribution (scored routing compares
    them); a scripted model's are not."""
    cheap_all_logits: bool = True
    """Whether logits at every evaluated position cost little more than at the last one;
    copy speculation verifies its drafts with them, so it drafts only where they do."""


@dataclass
class EvalOutput:
    """Result of evaluating tokens.

    ``logits`` has one row per selected position (``[k, n_vocab]`` float32). ``hidden``,
    when requested, holds the final normalised hidden state at the same positions.
    ``positions`` are the indices (into the evaluated tokens) of the rows.
    """

    logits: NDArray[np.float32]
    positions: list[int]
    hidden: NDArray[np.float32] | None = None


@dataclass
class StatesRequest:
    """Tokens whose hidden states :meth:`Model.layer_states` reads.

    ``prefix`` is evaluated once; every branch continues it on its own (a branch sees the
    prefix and itself, never another branch). States are returned at ``prefix_positions``
    (indices into ``prefix``) and at every token of every branch.
    """

    prefix: list[int]
    branches: list[list[int]] = field(default_factory=list)
    prefix_positions: list[int] = field(default_factory=list)


@dataclass
class LayerStates:
    """What :meth:`Model.layer_states` returns for one :class:`StatesRequest`.

    ``prefix`` is ``[len(prefix_positions), n_embd]``; ``branches[i]`` is
    ``[len(branch i), n_embd]``; all float32, the output of the requested block.
    """

    prefix: NDArray[np.float32]
    branches: list[NDArray[np.float32]]


@dataclass
class EvalStats:
    """Counters a caller can read to see how much work the backend did."""

    tokens_evaluated: int = 0
    eval_calls: int = 0


LORA_BASE_KEY = "pocket_agent.base_model_id"
"""GGUF LoRA key holding the identity (``model_identity``) of the base model it was trained on."""
LORA_BASE_NAME_KEY = "pocket_agent.base_model_name"


@dataclass
class LoraAdapter:
    """A LoRA adapter loaded into a model; pass it back to scale or remove it."""

    path: Path
    scale: float
    handle: object = field(repr=False)


class Model(abc.ABC):
    """A loaded language model with a persistent KV cache.

    Concrete backends implement the ``_``-prefixed hooks; the public methods here do the
    argument checking that keeps bad input away from native code (empty token lists,
    out-of-range ids, context overflow, use after close).

    One model serves one call at a time: :attr:`lock` (reentrant) is held by every method
    that touches the KV cache, and by each public entry point (``extract``, ``generate``,
    ``Agent.run``, ``decide``) for the whole call, so threads sharing a model take turns and
    each gets the result it would get alone. Concurrency comes from more processes.
    """

    backend: str = ""
    info: ModelInfo
    vocab: Vocabulary
    capabilities: Capabilities

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._cached: list[int] = []
        # the LoRA weights (adapter, scale) the cached keys/values were computed with
        self._cache_weights: tuple[tuple[int, float], ...] = ()
        self._closed = False
        self.stats = EvalStats()
        self._loras: list[LoraAdapter] = []
        self._open_loras: list[LoraAdapter] = []
        self._chat_template: ChatTemplate | None = None
        # (tokens, last-position logits) of the latest prefill: asking for the same prompt
        # again returns these instead of re-evaluating its last token, whose logits from a
        # 1-token batch differ numerically from the many-token batch (quantised kernels).
        self._prefill_memo: tuple[list[int], EvalOutput] | None = None
        # The first cached position that was evaluated in a batch of one token (a decode
        # step). llama.cpp computes a position identically in any batch of two or more tokens
        # but differently alone, so prefill never reuses the cache from there on: a prompt's
        # logits then depend only on the prompt, never on what the cache held before.
        self._single_from: int | None = None

    # -- static facts ----------------------------------------------------------------

    @property
    def n_ctx(self) -> int:
        """Context window in tokens (the KV cache size of sequence 0)."""
        return self.info.n_ctx

    @property
    def n_vocab(self) -> int:
        return self.vocab.size

    @property
    def path(self) -> Path:
        return self.info.path

    @property
    @abc.abstractmethod
    def chat_template(self) -> ChatTemplate:
        """The model's own chat template (from its metadata)."""

    # -- text <-> tokens -------------------------------------------------------------

    @abc.abstractmethod
    def tokenize(self, text: str | bytes, *, special: bool = False) -> list[int]:
        """Tokenize exactly as the model's tokenizer does.

        ``special=True`` parses special-token text (``<|im_end|>``) into its control
        token; otherwise it is tokenized as plain text. No BOS is added.
        """

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        """Raw bytes of ``tokens`` (may end inside a UTF-8 sequence)."""
        self._check_ids(tokens, allow_empty=True)
        return b"".join(self.vocab.token_bytes[t] for t in tokens)

    def decode(self, tokens: Sequence[int]) -> str:
        """Text of ``tokens``; an incomplete trailing UTF-8 sequence is replaced."""
        return self.detokenize(tokens).decode("utf-8", errors="replace")

    def stream_decoder(self) -> StreamDecoder:
        """A decoder that turns tokens into text as they arrive, holding back partial UTF-8."""
        return StreamDecoder(self)

    # -- evaluation --------------------------------------------------------------------

    @property
    def cached_tokens(self) -> list[int]:
        """The tokens whose keys/values the KV cache holds (a copy)."""
        with self.lock:
            self._sync_weights()
            return list(self._cached)

    @property
    def n_cached(self) -> int:
        with self.lock:
            self._sync_weights()
            return len(self._cached)

    def _weights_key(self) -> tuple[tuple[int, float], ...]:
        return tuple((id(a), a.scale) for a in self._loras if a.scale != 0.0)

    def _sync_weights(self) -> None:
        """Forget the KV cache if it was computed with other LoRA weights than the current ones.

        Changing adapters does not clear the cache at once: switching back before anything
        is evaluated (a task adapter on, off, and on again for the next call) finds the
        shared prompt still cached.
        """
        key = self._weights_key()
        if key != self._cache_weights:
            if self._cached or self._prefill_memo is not None:
                self._clear_cache()
            self._cache_weights = key

    def _clear_cache(self) -> None:
        self._reset()
        self._cached.clear()
        self._prefill_memo = None
        self._single_from = None

    @_locked
    def eval(
        self,
        tokens: Sequence[int],
        *,
        logits: LogitsSelection = "last",
        hidden: bool = False,
    ) -> EvalOutput:
        """Append ``tokens`` to the KV cache and evaluate them.

        Returns logits (and hidden states with ``hidden=True``) at the positions chosen
        by ``logits``, indexed relative to ``tokens``.
        """
        self._check_open()
        self._sync_weights()
        toks = self._check_ids(tokens)
        positions = self._select_positions(len(toks), logits)
        needed = len(self._cached) + len(toks)
        if needed > self.n_ctx:
            raise ContextOverflowError(
                f"{needed} tokens do not fit in the context window of {self.n_ctx} tokens "
                f"({len(self._cached)} cached + {len(toks)} new). Shorten the input or load "
                f"the model with a larger n_ctx.",
                needed=needed,
                n_ctx=self.n_ctx,
            )
        if hidden and not self.capabilities.hidden_states:
            raise ModelStateError(f"The {self.backend} backend cannot return hidden states.")
        out = self._eval(toks, positions, hidden)
        if len(toks) == 1 and self._single_from is None:
            self._single_from = len(self._cached)
        self._cached.extend(toks)
        self.stats.tokens_evaluated += len(toks)
        self.stats.eval_calls += 1
        return out

    @_locked
    def rollback(self, n: int) -> None:
        """Drop cached tokens after the first ``n``; the cache then holds ``n`` tokens."""
        self._check_open()
        self._sync_weights()
        if not 0 <= n <= len(self._cached):
            raise TokenError(f"Cannot roll back to {n} tokens: the cache holds {len(self._cached)}.")
        if n < len(self._cached):
            self._rollback(n)
            del self._cached[n:]
            if self._single_from is not None and n <= self._single_from:
                self._single_from = None
            if self._prefill_memo is not None and n < len(self._prefill_memo[0]):
                self._prefill_memo = None

    @_locked
    def reset(self) -> None:
        """Clear the KV cache."""
        self._check_open()
        self._clear_cache()
        self._cache_weights = self._weights_key()

    @_locked
    def prefill(
        self,
        tokens: Sequence[int],
        *,
        logits: LogitsSelection = "last",
        hidden: bool = False,
    ) -> EvalOutput:
        """Make the cache hold exactly ``tokens``, evaluating only what is not cached yet.

        The longest common prefix with :attr:`cached_tokens` is kept; the rest is rolled
        back and the new suffix evaluated. At least one token is always evaluated so the
        last position's logits are fresh, except when ``tokens`` equals the previous
        prefill's tokens and they are still cached: then the logits remembered from that
        prefill are returned, so repeating a prompt gives bit-identical results. ``logits``
        indices refer to the evaluated suffix; most callers use the default ``"last"``.

        The result depends only on ``tokens``, not on what the cache held: the suffix is
        evaluated in a batch of at least two tokens, and cached positions that a one-token
        decode step computed are never reused (a backend's kernels may round differently
        for a single token than for a batch).
        """
        toks = self._check_ids(tokens)
        self._sync_weights()
        keep = common_prefix_length(self._cached, toks)
        memo = self._prefill_memo
        if logits == "last" and not hidden and memo is not None and keep == len(toks) and memo[0] == toks:
            self.rollback(keep)
            return EvalOutput(logits=memo[1].logits.copy(), positions=list(memo[1].positions))
        keep = self.reusable_prefix(toks)
        self.rollback(keep)
        out = self.eval(toks[keep:], logits=logits, hidden=hidden)
        if logits == "last" and not hidden:
            self._prefill_memo = (toks, EvalOutput(logits=out.logits.copy(), positions=list(out.positions)))
        return out

    def reusable_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` may be taken from the cache before evaluating the rest.

        The common prefix with :attr:`cached_tokens`, but never a position that a one-token
        decode step computed, and always leaving at least two tokens to evaluate together:
        llama.cpp computes a position identically in any batch of two or more tokens, but
        differently alone. Evaluating from here makes the logits depend only on ``tokens``.
        """
        self._sync_weights()
        return reusable_length(self._cached, self._single_from, tokens)

    @_locked
    def eval_branches(
        self,
        prefix: Sequence[int],
        branches: Sequence[Sequence[int]],
        *,
        hidden: bool = False,
    ) -> list[EvalOutput]:
        """Evaluate several continuations of one prefix, the prefix only once.

        Returns, for each branch, logits at every position of ``[last prefix token] +
        branch`` (so row ``i`` predicts ``branch[i]`` and the last row follows the
        branch). Afterwards the cache holds ``prefix``. Backends with multi-sequence
        support evaluate all branches in one batch.
        """
        self._check_open()
        if not branches:
            raise TokenError("eval_branches needs at least one branch.")
        checked = [self._check_ids(b) for b in branches]
        pre = self._check_ids(prefix)
        longest = max(len(b) for b in checked)
        if len(pre) + longest > self.n_ctx:
            raise ContextOverflowError(
                f"Prefix ({len(pre)}) plus the longest branch ({longest}) exceed the context "
                f"window of {self.n_ctx} tokens.",
                needed=len(pre) + longest,
                n_ctx=self.n_ctx,
            )
        if hidden and not self.capabilities.hidden_states:
            raise ModelStateError(f"The {self.backend} backend cannot return hidden states.")
        first = self.prefill(pre, logits="last", hidden=hidden)
        outs = self._eval_branches(checked, hidden)
        results = []
        for out in outs:
            logits = np.concatenate([first.logits[-1:], out.logits], axis=0)
            hid = None
            if hidden:
                assert first.hidden is not None and out.hidden is not None
                hid = np.concatenate([first.hidden[-1:], out.hidden], axis=0)
            results.append(EvalOutput(logits=logits, positions=[-1, *out.positions], hidden=hid))
        return results

    @_locked
    def layer_states(
        self,
        requests: Sequence[StatesRequest],
        *,
        layer: int,
        loras: Sequence[tuple[LoraAdapter, float]] = (),
    ) -> list[LayerStates]:
        """Hidden states after transformer block ``layer`` (0-based) for many requests.

        The requests are evaluated in as few backend calls as possible: their common
        prefix once, then several requests side by side as separate sequences, and only
        the blocks up to ``layer`` are computed. The KV cache that :meth:`eval` and
        generation use is not touched. ``loras`` are adapters from :meth:`open_lora`
        applied at the given scale while the states are read. ``layer`` must be below
        ``info.n_layer - 1`` (the final block's output is :meth:`eval`'s ``hidden``).
        """
        self._check_open()
        if not self.capabilities.layer_states:
            raise ModelStateError(
                f"The {self.backend} backend cannot read the states of inner layers; use a GGUF model (llama.cpp)."
            )
        n_layer = self.info.n_layer
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < n_layer - 1:
            raise TokenError(f"layer must be an integer from 0 to {n_layer - 2} for this model, got {layer!r}.")
        checked: list[StatesRequest] = []
        for i, req in enumerate(requests):
            prefix = self._check_ids(req.prefix)
            branches = [self._check_ids(b) for b in req.branches]
            positions = [int(p) for p in req.prefix_positions]
            if any(not 0 <= p < len(prefix) for p in positions):
                raise TokenError(f"requests[{i}]: prefix_positions must lie in 0..{len(prefix) - 1}.")
            if not branches and not positions:
                raise TokenError(f"requests[{i}] asks for no states (no branches, no prefix_positions).")
            needed = len(prefix) + max((len(b) for b in branches), default=0)
            if needed > self.n_ctx:
                raise ContextOverflowError(
                    f"requests[{i}] needs {needed} tokens; the context window is {self.n_ctx}.",
                    needed=needed,
                    n_ctx=self.n_ctx,
                )
            checked.append(StatesRequest(prefix, branches, positions))
        for adapter, scale in loras:
            if not any(adapter is a for a in self._open_loras):
                raise AdapterError("layer_states() takes LoRA adapters opened with open_lora() on this model.")
            if not np.isfinite(scale):
                raise AdapterError(f"A LoRA scale must be a finite number, got {scale!r}.")
        if not checked:
            return []
        return self._layer_states(checked, layer, [(a, float(s)) for a, s in loras])

    # -- adapters ----------------------------------------------------------------------

    @_locked
    def open_lora(self, path: str | Path) -> LoraAdapter:
        """Load a LoRA adapter without applying it to generation (for :meth:`layer_states`)."""
        adapter = self._new_lora(path, 0.0)
        self._open_loras.append(adapter)
        return adapter

    def _new_lora(self, path: str | Path, scale: float) -> LoraAdapter:
        self._check_open()
        if not self.capabilities.lora:
            raise AdapterError(f"The {self.backend} backend does not support LoRA adapters.")
        p = Path(path)
        from .peft_lora import is_peft_adapter, peft_as_gguf

        if is_peft_adapter(p):  # a folder saved by PEFT: converted to a GGUF LoRA, loaded, removed
            with peft_as_gguf(self, p) as converted:
                try:
                    handle = self._load_lora(converted)
                except AdapterError as exc:
                    raise AdapterError(f"The PEFT adapter {p} does not load: {exc}") from exc
            return LoraAdapter(path=p, scale=float(scale), handle=handle)
        if not p.is_file():
            raise AdapterError(f"LoRA adapter file not found: {p}")
        self._check_lora_base(p)
        return LoraAdapter(path=p, scale=float(scale), handle=self._load_lora(p))

    def _check_lora_base(self, path: Path) -> None:
        """Refuse a GGUF LoRA that records (``pocket_agent.base_model_id``) another base model."""
        from .gguf_meta import GGUFFormatError, is_gguf_file, read_gguf_metadata
        from .identity import model_identity

        if not is_gguf_file(path):
            return
        try:
            meta = read_gguf_metadata(path, [LORA_BASE_KEY, LORA_BASE_NAME_KEY])
        except (GGUFFormatError, OSError) as exc:
            raise AdapterError(f"{path} is not a readable GGUF LoRA: {exc}") from exc
        recorded = meta.get(LORA_BASE_KEY)
        if isinstance(recorded, str) and recorded != model_identity(self):
            raise AdapterError(
                f"The LoRA {path.name} was trained for base model {meta.get(LORA_BASE_NAME_KEY, '?')!s} "
                f"(identity {recorded[:16]}...), not for {self.info.name!r} (identity "
                f"{model_identity(self)[:16]}...). Load it into the model it was trained on, or train one for "
                "this model."
            )

    @_locked
    def close_lora(self, adapter: LoraAdapter) -> None:
        """Free an adapter from :meth:`open_lora`."""
        self._check_open()
        if not any(adapter is a for a in self._open_loras):
            raise AdapterError("That LoRA adapter was not opened with open_lora() on this model.")
        self._forget_open_lora(adapter)
        self._open_loras = [a for a in self._open_loras if a is not adapter]
        self._free_lora(adapter)

    @_locked
    def load_lora(self, path: str | Path, *, scale: float = 1.0) -> LoraAdapter:
        """Load a LoRA adapter (GGUF for llama.cpp, .mnn for MNN) and apply it at ``scale``.

        ``path`` may also be a folder saved by PEFT (``adapter_config.json`` and
        ``adapter_model.safetensors``) on the llama.cpp and Transformers backends: it is
        converted to a GGUF LoRA as it loads (:mod:`pocket_agent.runtime.peft_lora`)."""
        adapter = self._new_lora(path, scale)
        self._loras.append(adapter)
        self._apply_loras()
        return adapter

    @_locked
    def set_lora_scale(self, adapter: LoraAdapter, scale: float) -> None:
        """Rescale a loaded adapter; 0 turns it off without unloading it."""
        self._check_open()
        if adapter not in self._loras:
            raise AdapterError("That LoRA adapter is not loaded in this model.")
        adapter.scale = float(scale)
        self._apply_loras()

    @_locked
    def remove_lora(self, adapter: LoraAdapter) -> None:
        """Unload an adapter; the model then computes base logits again."""
        self._check_open()
        if adapter not in self._loras:
            raise AdapterError("That LoRA adapter is not loaded in this model.")
        self._loras.remove(adapter)
        self._apply_loras()
        if adapter.scale != 0.0:  # its id may be reused by a later adapter: never trust the cache
            self.reset()
        self._free_lora(adapter)

    @property
    def loras(self) -> list[LoraAdapter]:
        return list(self._loras)

    # -- lifecycle ---------------------------------------------------------------------

    @_locked
    def close(self) -> None:
        """Free native memory. Further use raises :class:`ModelStateError`."""
        if not self._closed:
            self._closed = True
            self._close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.info.name!r} backend={self.backend} path={str(self.path)!r}>"

    # -- checks ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ModelStateError("This model has been closed; load it again to use it.")

    def _check_ids(self, tokens: Sequence[int], *, allow_empty: bool = False) -> list[int]:
        if isinstance(tokens, (str, bytes)):
            raise TokenError("Expected a list of token ids, got text; call model.tokenize() first.")
        toks = [int(t) for t in tokens]
        if not toks and not allow_empty:
            raise TokenError("Cannot evaluate an empty token list.")
        n = self.vocab.size
        bad = [t for t in toks if not 0 <= t < n]
        if bad:
            raise TokenError(f"Token ids out of range [0, {n}): {bad[:5]}")
        return toks

    @staticmethod
    def _select_positions(n: int, logits: LogitsSelection) -> list[int]:
        if isinstance(logits, str):
            if logits == "last":
                return [n - 1]
            if logits == "all":
                return list(range(n))
            if logits == "none":
                return []
            raise TokenError(f"logits must be 'last', 'all', 'none' or a list of indices, got {logits!r}")
        out = []
        for i in logits:
            j = int(i) + n if int(i) < 0 else int(i)
            if not 0 <= j < n:
                raise TokenError(f"Logits position {i} is outside the {n} evaluated tokens.")
            out.append(j)
        return out

    # -- backend hooks -----------------------------------------------------------------

    @abc.abstractmethod
    def _eval(self, tokens: list[int], positions: list[int], hidden: bool) -> EvalOutput:
        """Evaluate ``tokens`` after the cache; return rows for ``positions``."""

    @abc.abstractmethod
    def _rollback(self, n: int) -> None: ...

    @abc.abstractmethod
    def _reset(self) -> None: ...

    def _eval_branches(self, branches: list[list[int]], hidden: bool) -> list[EvalOutput]:
        """Default: one branch at a time, rolling back to the prefix after each."""
        base = len(self._cached)
        outs = []
        for branch in branches:
            outs.append(self.eval(branch, logits="all", hidden=hidden))
            self.rollback(base)
        return outs

    # Lanes (see :mod:`.lanes`): sequences decoded together, one batch per step. A backend
    # with lanes keeps them apart from sequence 0, beside a prefix they share.

    def _lane_max(self) -> int:
        """How many lanes the backend can open at once (0: none)."""
        return 0

    def _lane_open(self, width: int) -> tuple[int, list[int]]:
        """Get ``width`` lanes ready (ids 1..width); returns the tokens each can hold and the
        shared prefix held from an earlier opening."""
        raise ModelStateError(f"The {self.backend} backend cannot decode several sequences together.")

    def _lane_share(self, tokens: list[int]) -> list[int]:
        """Make the shared prefix ``tokens`` (evaluating what is missing); returns what it holds."""
        raise ModelStateError(f"The {self.backend} backend has no lanes.")

    def _lane_start(self, lane: int, keep: int) -> None:
        """Make ``lane`` hold the first ``keep`` tokens of the shared prefix."""
        raise ModelStateError(f"The {self.backend} backend has no lanes.")

    def _lane_decode(self, items: list[tuple[int, int, int, bool]]) -> list[NDArray[np.float32]]:
        """Evaluate ``(token, position, lane, want_logits)`` items in one batch; the logits
        rows of the wanted items, in order."""
        raise ModelStateError(f"The {self.backend} backend has no lanes.")

    def _lane_drop(self, lane: int) -> None:
        """Forget everything ``lane`` holds."""
        raise ModelStateError(f"The {self.backend} backend has no lanes.")

    def _lane_adopt(self, lane: int) -> None:
        """Make sequence 0's cache hold exactly what ``lane`` holds."""
        raise ModelStateError(f"The {self.backend} backend has no lanes.")

    def _lane_close(self) -> None:
        """The lanes are closed (their memory may be kept for the next opening)."""
        return None

    def _layer_states(
        self, requests: list[StatesRequest], layer: int, loras: list[tuple[LoraAdapter, float]]
    ) -> list[LayerStates]:
        raise ModelStateError(f"The {self.backend} backend cannot read the states of inner layers.")

    def _forget_open_lora(self, adapter: LoraAdapter) -> None:
        """Stop using an opened adapter before it is freed."""
        return None

    def _load_lora(self, path: Path) -> object:
        raise AdapterError(f"The {self.backend} backend does not support LoRA adapters.")

    def _apply_loras(self) -> None:
        raise AdapterError(f"The {self.backend} backend does not support LoRA adapters.")

    def _free_lora(self, adapter: LoraAdapter) -> None:
        return None

    @abc.abstractmethod
    def _close(self) -> None: ...


class StreamDecoder:
    """Turns tokens into text incrementally, never splitting a UTF-8 character."""

    def __init__(self, model: Model) -> None:
        self._model = model
        self._pending = b""

    def feed(self, token: int) -> str:
        """Add one token; return the text that is now complete."""
        data = self._pending + self._model.detokenize([token])
        text, self._pending = split_complete_utf8(data)
        return text

    def flush(self) -> str:
        """Return whatever is held back, with invalid bytes replaced."""
        data, self._pending = self._pending, b""
        return data.decode("utf-8", errors="replace")


def split_complete_utf8(data: bytes) -> tuple[str, bytes]:
    """Split ``data`` into decoded text and a trailing incomplete UTF-8 sequence.

    Invalid bytes elsewhere are replaced with U+FFFD; only a tail that could still become
    a valid character (at most 3 bytes) is held back.
    """
    for k in (1, 2, 3):
        if len(data) >= k and _could_be_utf8_prefix(data[-k:]):
            return data[:-k].decode("utf-8", errors="replace"), data[-k:]
    return data.decode("utf-8", errors="replace"), b""


def _could_be_utf8_prefix(tail: bytes) -> bool:
    lead = tail[0]
    if 0xF0 <= lead <= 0xF4:
        width = 4
    elif 0xE0 <= lead <= 0xEF:
        width = 3
    elif 0xC2 <= lead <= 0xDF:
        width = 2
    else:
        return False
    return len(tail) < width and all(0x80 <= b < 0xC0 for b in tail[1:])


def reusable_length(cached: Sequence[int], single_from: int | None, tokens: Sequence[int]) -> int:
    """:meth:`Model.reusable_prefix` for a cache holding ``cached``, whose positions from
    ``single_from`` on (``None``: none) a one-token decode step computed."""
    keep = min(common_prefix_length(cached, tokens), max(len(tokens) - 2, 0))
    return keep if single_from is None else min(keep, single_from)


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
