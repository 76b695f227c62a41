"""Compile an output type into an llguidance constraint over a model's vocabulary.

Two caches keep this cheap:

* one ``llguidance.LLTokenizer`` per :class:`~pocket_agent.runtime.Vocabulary` object
  (built from the model's token bytes and its exact tokenizer, ~0.15 s for 49k tokens);
* per vocabulary, an LRU of compiled grammars keyed by the llguidance grammar text (a
  canonical JSON of the constraint: the schema with its options, regex, Lark text).

A compiled grammar holds a fresh "prototype" matcher; every :class:`GrammarMatcher` is a
deep copy of it (about a microsecond), so a cache hit costs no grammar construction.
"""

from __future__ import annotations

import enum
import json
import threading
import time
import typing
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import llguidance as llg
import numpy as np

from ..errors import InvalidInputError, ModelStateError, SchemaError, UnsupportedSchemaError
from .schema import check_depth, check_schema, classify_error, close_objects, forget_checked_schemas
from .types import Choice, GrammarSpec, JsonSchema, Lark, Regex, Whitespace

if TYPE_CHECKING:
    from ..runtime import Model
    from .matcher import GrammarMatcher

DEFAULT_CACHE_SIZE = 128
"""Compiled grammars kept per vocabulary (least recently used are dropped first)."""

FREE_TEXT_REGEX = r"(?s:.*)"

_COMPACT: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
_FLEXIBLE: dict[str, Any] = {"whitespace_flexible": True, "item_separator": ",", "key_separator": ":"}
# Never let llguidance silently ignore a keyword or approximate oneOf with anyOf.
_STRICT: dict[str, Any] = {"lenient": False, "coerce_one_of": False}
# accepts(): a pure schema check of the text, whatever layout and escapes it uses.
_ACCEPT: dict[str, Any] = {**_FLEXIBLE, "json_allow_general_unicode_escapes": True}

_LIMITS = llg.LLParserLimits(verbose_errors=False)


# --- tokenizer per vocabulary -----------------------------------------------------------


class _ModelTokenizer:
    """The object ``llguidance.TokenizerWrapper`` wraps: token bytes, EOS/BOS, special ids
    and ``__call__(bytes) -> ids`` running the model's own tokenizer (no BOS, no special
    parsing). Holds the model weakly so caches never keep a model alive."""

    def __init__(self, model: Model) -> None:
        vocab = model.vocab
        if not vocab.eos_ids:
            raise InvalidInputError(f"{model!r} has no end-of-sequence token; grammars need one to stop.")
        self.tokens: list[bytes] = vocab.marked_token_bytes()
        self.eos_token_id: int = vocab.eos_ids[0]
        self.bos_token_id: int | None = vocab.bos_id
        self.special_token_ids: list[int] = sorted(vocab.special_ids)
        self._model: weakref.ref[Model] = weakref.ref(model)

    def bind(self, model: Model) -> None:
        self._model = weakref.ref(model)

    @property
    def model(self) -> Model | None:
        m = self._model()
        return None if m is None or m.closed else m

    def __call__(self, data: bytes) -> list[int]:
        m = self.model
        if m is None:
            raise ModelStateError("The model this grammar tokenizer belongs to was closed.")
        return m.tokenize(bytes(data))


class _VocabEntry:
    """Everything cached for one vocabulary: the LLTokenizer and the compiled-grammar LRU."""

    def __init__(self, model: Model) -> None:
        self.wrapper = _ModelTokenizer(model)
        self.vocab_size = model.vocab.size
        self.mask_words = (self.vocab_size + 31) // 32
        self.eos_ids: tuple[int, ...] = tuple(model.vocab.eos_ids)
        self.tokenizer = llg.LLTokenizer(llg.TokenizerWrapper(self.wrapper), eos_token=list(self.eos_ids))
        self.grammars: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self.lock = threading.Lock()

    def tokenize(self, text: str | bytes) -> list[int]:
        return self.wrapper(text.encode("utf-8") if isinstance(text, str) else text)


_entries: dict[int, _VocabEntry] = {}
_entries_lock = threading.Lock()
_cache_size = DEFAULT_CACHE_SIZE
_hits = 0
_misses = 0


def _entry_for(model: Model) -> _VocabEntry:
    if model.closed:
        raise ModelStateError("This model has been closed; load it again to use it.")
    vocab = model.vocab
    key = id(vocab)
    with _entries_lock:
        entry = _entries.get(key)
        if entry is not None:
            if entry.wrapper.model is not model:
                entry.wrapper.bind(model)
            return entry
    entry = _VocabEntry(model)  # outside the lock: ~0.15 s
    with _entries_lock:
        existing = _entries.get(key)
        if existing is not None:
            return existing
        _entries[key] = entry
        weakref.finalize(vocab, _entries.pop, key, None)
    return entry


def get_tokenizer(model: Model | None = None) -> llg.LLTokenizer:
    """The llguidance tokenizer for ``model``'s vocabulary (built once per vocabulary)."""
    return _entry_for(_resolve(model)).tokenizer


def _resolve(model: Model | None) -> Model:
    from ..runtime import Model, get_default_model

    if model is None:
        return get_default_model()
    if not isinstance(model, Model):
        raise InvalidInputError(f"model must be a loaded pocket_agent Model, got {type(model).__name__}.")
    return model


# --- cache statistics -------------------------------------------------------------------


@dataclass(frozen=True)
class CacheInfo:
    """Compiled-grammar cache counters over all vocabularies."""

    hits: int
    misses: int
    size: int
    maxsize: int
    vocabularies: int


def cache_info() -> CacheInfo:
    """Hits, misses and sizes of the compiled-grammar caches."""
    with _entries_lock:
        entries = list(_entries.values())
    return CacheInfo(_hits, _misses, sum(len(e.grammars) for e in entries), _cache_size, len(entries))


def clear_cache() -> None:
    """Drop every compiled grammar and remembered schema check (tokenizers stay); reset
    the counters."""
    global _hits, _misses
    with _entries_lock:
        entries = list(_entries.values())
        _hits = _misses = 0
    for e in entries:
        with e.lock:
            e.grammars.clear()
    with _spec_lock:
        _spec_memo.clear()
    forget_checked_schemas()


def set_cache_size(maxsize: int) -> None:
    """Keep at most ``maxsize`` compiled grammars per vocabulary (0 disables caching)."""
    global _cache_size
    if not isinstance(maxsize, int) or maxsize < 0:
        raise InvalidInputError(f"maxsize must be a non-negative integer, got {maxsize!r}.")
    _cache_size = maxsize
    with _entries_lock:
        entries = list(_entries.values())
    for e in entries:
        with e.lock:
            while len(e.grammars) > maxsize:
                e.grammars.popitem(last=False)


# --- output type -> grammar spec ------------------------------------------------------------


def _choice_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _choice_spec(options: Sequence[str], source: Any) -> GrammarSpec:
    opts = tuple(dict.fromkeys(options))
    if not opts:
        raise SchemaError("A choice needs at least one option.")
    lark = "start: " + " | ".join(json.dumps(o, ensure_ascii=False) for o in opts)
    return GrammarSpec("choice", llg.LLMatcher.grammar_from_lark(lark), choices=opts, source=source)


def _python_type_schema(tp: Any) -> Any:
    import pydantic
    from pydantic.errors import PydanticUserError

    try:
        if isinstance(tp, type) and issubclass(tp, pydantic.BaseModel):
            return tp.model_json_schema()
        return pydantic.TypeAdapter(tp).json_schema()
    except PydanticUserError as e:
        raise UnsupportedSchemaError(
            f"Pydantic cannot express {tp!r} as a JSON Schema: {e}", feature="python type", path="#"
        ) from None
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"Unsupported output type {tp!r}: {e}") from None


def _json_spec(
    schema: Any,
    *,
    whitespace: Whitespace,
    close: bool,
    accept_mode: bool,
    check: bool,
    source: Any,
) -> GrammarSpec:
    if isinstance(schema, bool):
        if not schema:
            raise SchemaError("The schema `false` accepts no JSON value.")
        schema = {}
    if not isinstance(schema, Mapping):
        raise SchemaError(f"A JSON Schema must be an object or a boolean, got {type(schema).__name__}.")
    schema = dict(schema)
    check_depth(schema)  # before anything recursive (deepcopy, json.dumps, jsonschema) runs
    if check:
        check_schema(schema)
    if close:
        schema = close_objects(schema)
    if whitespace not in ("compact", "flexible"):
        raise InvalidInputError(f"whitespace must be 'compact' or 'flexible', got {whitespace!r}.")
    if accept_mode:
        defaults: dict[str, Any] = {}
        overrides = {**_ACCEPT, **_STRICT}
    else:
        defaults = dict(_COMPACT if whitespace == "compact" else _FLEXIBLE)
        overrides = dict(_STRICT)
    try:
        # JSON text, not the dict: llguidance's dict conversion rejects ints beyond 64 bits.
        text = json.dumps(schema, ensure_ascii=False, allow_nan=False)
        grammar = llg.LLMatcher.grammar_from_json_schema(text, defaults=defaults, overrides=overrides)  # type: ignore[arg-type]
    except (TypeError, ValueError) as e:
        raise SchemaError(f"The schema is not JSON data: {e}") from None
    return GrammarSpec("json", grammar, schema=schema, whitespace=whitespace, source=source)


_spec_memo: OrderedDict[Any, GrammarSpec] = OrderedDict()
_spec_lock = threading.Lock()


def grammar_for(
    output_type: Any,
    *,
    whitespace: Whitespace = "compact",
    allow_extra: bool | None = None,
    check: bool = True,
    _accept_mode: bool = False,
) -> GrammarSpec:
    """Resolve an output type into a :class:`GrammarSpec` (no model needed).

    Output types:

    * ``None`` or ``str`` (the type): free text;
    * :class:`Regex`, :class:`Lark`, :class:`Choice`, :class:`JsonSchema`;
    * a ``dict`` (or ``bool``): a JSON Schema, compiled as written;
    * a list/tuple of strings, a ``typing.Literal`` or an ``enum.Enum`` class: a choice
      between their texts (non-string values as their JSON text, e.g. ``1``, ``true``);
    * a Pydantic model class or any type Pydantic can describe (``list[Model]``,
      ``dict[str, int]``, ``int``...): its JSON Schema, with objects closed.

    Args:
        whitespace: JSON layout, ``"compact"`` (default) or ``"flexible"``. A schema's own
            top-level ``x-guidance`` options take precedence.
        allow_extra: ``None`` closes Pydantic-derived objects (``additionalProperties:
            false`` wherever it is not set) and leaves JSON Schemas as written; ``False``
            closes every object; ``True`` closes none.
        check: validate JSON Schemas against their meta-schema (raises
            :class:`~pocket_agent.errors.SchemaError`).

    Raises:
        SchemaError: invalid schema, regex or choice list.
        UnsupportedSchemaError: the schema nests deeper than the engine reads, or Pydantic
            cannot describe the type.
        InvalidInputError: the output type is not one of the above (e.g. a bare string).
    """
    try:
        memo_key: Any = (output_type, whitespace, allow_extra, check, _accept_mode)
        hash(memo_key)
    except TypeError:
        memo_key = None
    if memo_key is not None and not isinstance(output_type, (dict, list)):
        with _spec_lock:
            hit = _spec_memo.get(memo_key)
            if hit is not None:
                _spec_memo.move_to_end(memo_key)
                return hit
    spec = _grammar_for(output_type, whitespace, allow_extra, check, _accept_mode)
    if memo_key is not None and not isinstance(output_type, (dict, list)):
        with _spec_lock:
            _spec_memo[memo_key] = spec
            while len(_spec_memo) > 256:
                _spec_memo.popitem(last=False)
    return spec


def _grammar_for(
    output_type: Any, whitespace: Whitespace, allow_extra: bool | None, check: bool, accept_mode: bool
) -> GrammarSpec:
    ot = output_type
    if ot is None or ot is str:
        return GrammarSpec("text", llg.LLMatcher.grammar_from_regex(FREE_TEXT_REGEX), source=ot)
    if isinstance(ot, GrammarSpec):
        return ot
    if isinstance(ot, Regex):
        return GrammarSpec("regex", llg.LLMatcher.grammar_from_regex(ot.pattern), source=ot)
    if isinstance(ot, Lark):
        return GrammarSpec("lark", llg.LLMatcher.grammar_from_lark(ot.grammar), source=ot)
    if isinstance(ot, Choice):
        return _choice_spec(ot.options, ot)
    if isinstance(ot, str):
        raise InvalidInputError(
            "A plain string is ambiguous as an output type: wrap it as Regex(...), Lark(...), "
            "JsonSchema(...) or Choice([...])."
        )
    if isinstance(ot, JsonSchema):
        try:
            obj = ot.as_object()
        except ValueError as e:
            raise SchemaError(f"JsonSchema text is not valid JSON: {e}") from None
        return _json_spec(
            obj, whitespace=whitespace, close=allow_extra is False, accept_mode=accept_mode, check=check, source=ot
        )
    if isinstance(ot, (Mapping, bool)):
        return _json_spec(
            ot, whitespace=whitespace, close=allow_extra is False, accept_mode=accept_mode, check=check, source=ot
        )
    if isinstance(ot, (list, tuple)):
        if all(isinstance(o, str) for o in ot):
            return _choice_spec(list(ot), ot)
        raise InvalidInputError("A list output type must hold the choice strings, e.g. ['yes', 'no'].")
    if typing.get_origin(ot) is Literal:
        return _choice_spec([_choice_text(v) for v in typing.get_args(ot)], ot)
    if isinstance(ot, type) and issubclass(ot, enum.Enum):
        return _choice_spec([_choice_text(m.value) for m in ot], ot)
    if isinstance(ot, type) or typing.get_origin(ot) is not None:
        schema = _python_type_schema(ot)
        return _json_spec(
            schema,
            whitespace=whitespace,
            close=allow_extra is not True,
            accept_mode=accept_mode,
            check=check,
            source=ot,
        )
    raise InvalidInputError(f"Unsupported output type: {ot!r} ({type(ot).__name__}).")


# --- compiled grammars ----------------------------------------------------------------------


class CompiledGrammar:
    """An output type compiled for one vocabulary; make matchers with :meth:`matcher`.

    Immutable and shareable: the prototype matcher is never advanced, only copied.
    """

    def __init__(self, spec: GrammarSpec, entry: _VocabEntry, proto: llg.LLMatcher, seconds: float) -> None:
        self.spec = spec
        self.compile_seconds = seconds
        self._entry = entry
        self._proto = proto
        self._lock = threading.Lock()

    @property
    def kind(self) -> str:
        """``"json"``, ``"regex"``, ``"choice"``, ``"lark"`` or ``"text"``."""
        return self.spec.kind

    @property
    def is_free_text(self) -> bool:
        """True when only special tokens are masked (a loop may skip masking)."""
        return self.spec.is_free_text

    @property
    def vocab_size(self) -> int:
        """Number of tokens the masks cover."""
        return self._entry.vocab_size

    @property
    def mask_words(self) -> int:
        """Length of a bitmask row in int32 words (``ceil(vocab_size / 32)``)."""
        return self._entry.mask_words

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """End-of-sequence tokens the matcher allows once the output is complete."""
        return self._entry.eos_ids

    @property
    def tokenizer(self) -> llg.LLTokenizer:
        """The llguidance tokenizer this grammar was compiled for."""
        return self._entry.tokenizer

    def new_llmatcher(self) -> llg.LLMatcher:
        """A fresh llguidance matcher (copy of the prototype)."""
        with self._lock:
            return self._proto.deep_copy()

    def matcher(self) -> GrammarMatcher:
        """A new :class:`GrammarMatcher` at the start of the output."""
        from .matcher import GrammarMatcher

        return GrammarMatcher(self)

    def tokenize(self, text: str | bytes) -> list[int]:
        """Tokenize with the model's own tokenizer (no BOS)."""
        return self._entry.tokenize(text)

    def accepts_tokens(self, tokens: Sequence[int]) -> bool:
        """Whether ``tokens`` form a complete output this grammar accepts."""
        m = self.new_llmatcher()
        toks = [int(t) for t in tokens]
        if any(not 0 <= t < self.vocab_size for t in toks):
            return False
        return m.try_consume_tokens(toks) == len(toks) and m.is_accepting()

    def accepts_text(self, text: str | bytes) -> bool:
        """Whether ``text`` (tokenized by the model) is a complete accepted output."""
        return self.accepts_tokens(self.tokenize(text))

    def __repr__(self) -> str:
        g = self.spec.grammar
        return f"<CompiledGrammar {self.kind} {g[:60]!r}{'...' if len(g) > 60 else ''}>"


def _compile_error(spec: GrammarSpec, message: str) -> SchemaError:
    if spec.kind == "json":
        return classify_error(message, spec.schema)
    text = message.replace("\n<non-verbose/>", "").strip()
    what = {"regex": "regex", "lark": "Lark grammar", "choice": "choice", "text": "grammar"}[spec.kind]
    if "not supported" in text:
        if "look-around" in text:
            feature = f"{spec.kind}: look-around"
        elif "backreference" in text:
            feature = f"{spec.kind}: back-references"
        else:
            feature = spec.kind
        if "JSON schema" in text and spec.kind == "lark":
            feature = "lark: %json schema"
        return UnsupportedSchemaError(f"Unsupported {what}: {text}", feature=feature, path=None)
    if "Unimplemented keys" in text or "Unknown format" in text:
        return UnsupportedSchemaError(f"Unsupported {what}: {text}", feature=f"{spec.kind}: %json schema", path=None)
    if "NoExtension" in text or "Unsatisfiable" in text:
        return SchemaError(f"The {what} accepts no output.")
    return SchemaError(f"Invalid {what}: {text}")


def compile_spec(spec: GrammarSpec, model: Model | None = None, *, cache: bool = True) -> CompiledGrammar:
    """Compile a :class:`GrammarSpec` for ``model``'s vocabulary (cached).

    ``cache=False`` neither reads nor fills the cache: for one-off grammars (e.g. one
    grounded in a single document) that would only push reusable ones out.
    """
    global _hits, _misses
    entry = _entry_for(_resolve(model))
    key = spec.grammar
    if cache:
        with entry.lock:
            hit = entry.grammars.get(key)
            if hit is not None:
                entry.grammars.move_to_end(key)
                _hits += 1
                return hit
            _misses += 1
    t0 = time.perf_counter()
    proto = llg.LLMatcher(entry.tokenizer, spec.grammar, log_level=0, limits=_LIMITS)
    if not proto.is_error():
        # The first mask reveals schemas that accept nothing (e.g. "$ref" cycles).
        scratch = np.empty(entry.mask_words, dtype=np.int32)
        proto.unsafe_compute_mask_ptr(scratch.ctypes.data, scratch.nbytes)
    if proto.is_error():
        raise _compile_error(spec, proto.get_error())
    compiled = CompiledGrammar(spec, entry, proto, time.perf_counter() - t0)
    with entry.lock:
        if cache and _cache_size > 0:
            entry.grammars[key] = compiled
            while len(entry.grammars) > _cache_size:
                entry.grammars.popitem(last=False)
    return compiled


def compile_grammar(
    output_type: Any,
    model: Model | None = None,
    *,
    whitespace: Whitespace = "compact",
    allow_extra: bool | None = None,
) -> CompiledGrammar:
    """Compile an output type into a constraint over ``model``'s vocabulary.

    See :func:`grammar_for` for the output types and options. ``model=None`` uses the
    process-wide default model. Results are cached per (grammar, vocabulary): compiling
    the same type again returns the same :class:`CompiledGrammar`.

    Raises:
        SchemaError: the schema/regex/grammar is invalid or accepts nothing.
        UnsupportedSchemaError: it uses a feature the engine cannot enforce; ``feature``
            and ``path`` (a JSON Pointer such as ``#/properties/a``) say which and where.
    """
    m = _resolve(model)
    spec = grammar_for(output_type, whitespace=whitespace, allow_extra=allow_extra, check=False)
    entry = _entry_for(m)
    with entry.lock:
        cached = spec.grammar in entry.grammars
    if not cached and spec.kind == "json":
        check_schema(spec.schema)
    return compile_spec(spec, m)


def accepts(schema: Any, text: str, model: Model | None = None) -> bool:
    """Whether the constraint compiled for ``schema`` accepts ``text`` as a complete output.

    ``schema`` is a JSON Schema dict or a Pydantic model (any output type works). The text
    is tokenized by the model's tokenizer and fed to the matcher. This is a check of the
    *content*: it compiles with flexible whitespace, allows ``\\uXXXX`` escapes and
    ignores whitespace around the JSON value, so any JSON layout of an accepted value
    passes (generation itself emits compact JSON, a subset). What the engine enforces
    beyond JSON Schema still applies: object properties must appear in schema order, and
    Pydantic models are closed (no extra keys).

    Raises:
        SchemaError, UnsupportedSchemaError: as :func:`compile_grammar`.
    """
    if not isinstance(text, str):
        raise InvalidInputError(f"text must be a str, got {type(text).__name__}.")
    m = _resolve(model)
    spec = grammar_for(schema, whitespace="flexible", check=False, _accept_mode=True)
    entry = _entry_for(m)
    with entry.lock:
        cached = spec.grammar in entry.grammars
    if not cached and spec.kind == "json":
        check_schema(spec.schema)
    compiled = compile_spec(spec, m)
    if spec.kind == "json":
        text = text.strip(" \t\r\n")
    return compiled.accepts_text(text)
