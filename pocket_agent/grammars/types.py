"""Wrapper types that say what an output-type string means, and the compiled grammar spec.

A bare ``str`` is ambiguous (a regex? a Lark grammar? a JSON Schema text?), so callers
wrap it: ``Regex("[0-9]{4}")``, ``Lark("start: ...")``, ``JsonSchema('{"type": ...}')``,
``Choice(["yes", "no"])``. Dicts are JSON Schemas, Pydantic models and other Python
types go through Pydantic, ``None`` (or ``str``) means free text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Whitespace = Literal["compact", "flexible"]
"""How JSON output may be laid out: ``"compact"`` allows exactly ``{"a":1,"b":[2,3]}``
(no whitespace, ``,`` and ``:`` separators; fewest tokens); ``"flexible"`` allows any
JSON whitespace between tokens (a model may then spend tokens on runs of whitespace)."""

GrammarKind = Literal["json", "regex", "choice", "lark", "text"]
"""The family an output type compiles to."""


@dataclass(frozen=True)
class Regex:
    """The output must match this regular expression completely (Rust ``regex`` syntax,
    no look-around or back-references).

    As in Python's ``re``, ``\\d``, ``\\w`` and ``\\s`` are Unicode-aware: ``\\d`` also
    matches digits such as ``١`` or ``🯸``, which a small model may pick. Write ``[0-9]``
    for ASCII digits.
    """

    pattern: str

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, str):
            raise TypeError(f"Regex pattern must be a str, got {type(self.pattern).__name__}")


@dataclass(frozen=True, init=False)
class Choice:
    """The output is exactly one of ``options`` (raw text, no quotes)."""

    options: tuple[str, ...]

    def __init__(self, options: Iterable[str]) -> None:
        if isinstance(options, str):
            raise TypeError("Choice takes a list of strings, not a single string")
        opts = tuple(options)
        for o in opts:
            if not isinstance(o, str):
                raise TypeError(f"Choice options must be strings, got {type(o).__name__}: {o!r}")
        object.__setattr__(self, "options", tuple(dict.fromkeys(opts)))


@dataclass(frozen=True)
class Lark:
    """A context-free grammar in llguidance's Lark dialect (``start`` is the start rule).

    See https://github.com/guidance-ai/llguidance/blob/main/docs/syntax.md; it also
    accepts ``%json {...}`` to embed a JSON Schema.
    """

    grammar: str

    def __post_init__(self) -> None:
        if not isinstance(self.grammar, str):
            raise TypeError(f"Lark grammar must be a str, got {type(self.grammar).__name__}")


@dataclass(frozen=True)
class JsonSchema:
    """A JSON Schema given as a dict (or as JSON text), compiled as written.

    Plain dicts passed as an output type mean the same thing; this wrapper exists for
    schemas held as text and to make intent explicit.
    """

    schema: Mapping[str, Any] | bool | str

    def as_object(self) -> Any:
        """The schema as a Python object (JSON text is parsed)."""
        if isinstance(self.schema, str):
            return json.loads(self.schema)
        return self.schema


@dataclass(frozen=True)
class GrammarSpec:
    """An output type resolved into an llguidance grammar, independent of any vocabulary.

    ``grammar`` is the llguidance grammar text (the canonical cache key), ``schema`` the
    exact JSON Schema compiled for JSON kinds (after closing objects), ``choices`` the
    options for choice kinds, and ``source`` the output type as the caller gave it.
    """

    kind: GrammarKind
    grammar: str
    schema: Any = None
    choices: tuple[str, ...] | None = None
    whitespace: Whitespace | None = None
    source: Any = field(default=None, compare=False, hash=False, repr=False)

    @property
    def is_free_text(self) -> bool:
        """True for the unconstrained-text grammar (only special tokens are masked)."""
        return self.kind == "text"
