"""Constrained output: compile an output type into a token constraint for a model.

Output types: a Pydantic model (or any type Pydantic describes), a JSON Schema ``dict``,
:class:`Regex`, :class:`Choice` (or a ``Literal`` / ``Enum`` / list of strings),
:class:`Lark`, :class:`JsonSchema`, and ``None`` for free text. Compilation uses
llguidance over the model's exact vocabulary and tokenizer and is cached per (grammar,
vocabulary). A :class:`GrammarMatcher` gives next-token bitmasks, forced tokens for
fast-forward, rollback; :func:`apply_mask` applies a bitmask to a logits row.

Unsupported schema features raise :class:`~pocket_agent.errors.UnsupportedSchemaError`
(with ``feature`` and ``path``) at compile time; there is no fallback to unconstrained
output.
"""

from ..errors import ConstraintError, SchemaError, TokenRejectedError, UnsupportedSchemaError
from .compiler import (
    DEFAULT_CACHE_SIZE,
    CacheInfo,
    CompiledGrammar,
    accepts,
    cache_info,
    clear_cache,
    compile_grammar,
    compile_spec,
    get_tokenizer,
    grammar_for,
    set_cache_size,
)
from .mask import allowed_tokens, apply_mask, count_allowed, is_allowed, new_bitmask
from .matcher import GrammarMatcher
from .schema import MAX_SCHEMA_DEPTH, close_objects
from .types import Choice, GrammarKind, GrammarSpec, JsonSchema, Lark, Regex, Whitespace

__all__ = [
    "DEFAULT_CACHE_SIZE",
    "MAX_SCHEMA_DEPTH",
    "CacheInfo",
    "Choice",
    "CompiledGrammar",
    "ConstraintError",
    "GrammarKind",
    "GrammarMatcher",
    "GrammarSpec",
    "JsonSchema",
    "Lark",
    "Regex",
    "SchemaError",
    "TokenRejectedError",
    "UnsupportedSchemaError",
    "Whitespace",
    "accepts",
    "allowed_tokens",
    "apply_mask",
    "cache_info",
    "clear_cache",
    "close_objects",
    "compile_grammar",
    "compile_spec",
    "count_allowed",
    "get_tokenizer",
    "grammar_for",
    "is_allowed",
    "new_bitmask",
    "set_cache_size",
]
