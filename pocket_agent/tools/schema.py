"""JSON Schemas for tool parameters: from Python signatures (through Pydantic), from
OpenAI-style / BFCL function specs, plus docstring parsing.

Everything a tool's ``parameters`` holds passes through :func:`normalize_schema`, which
maps non-standard type names (BFCL's ``"dict"``, ``"float"``, ``"tuple"``, ``"any"``,
Java/JS names such as ``"long"`` or ``"String"``) to JSON Schema, drops keys JSON Schema
does not know in keyword positions, and closes objects that list their properties
(``additionalProperties: false``), so a model can only produce the declared keys.
"""

from __future__ import annotations

import copy
import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import SchemaError

# Non-standard type names found in real tool specs, mapped to JSON Schema types.
# ``None`` means "any JSON value" (the ``type`` keyword is dropped).
TYPE_ALIASES: dict[str, str | None] = {
    "dict": "object",
    "object": "object",
    "map": "object",
    "hashmap": "object",
    "hashtable": "object",
    "float": "number",
    "double": "number",
    "number": "number",
    "decimal": "number",
    "bigdecimal": "number",
    "int": "integer",
    "integer": "integer",
    "long": "integer",
    "short": "integer",
    "byte": "integer",
    "str": "string",
    "string": "string",
    "char": "string",
    "character": "string",
    "bool": "boolean",
    "boolean": "boolean",
    "list": "array",
    "array": "array",
    "arraylist": "array",
    "tuple": "array",
    "set": "array",
    "null": "null",
    "none": "null",
    "any": None,
}

# String formats the grammar engine (llguidance) enforces; any other format is dropped
# (JSON Schema treats ``format`` as an annotation unless a validator opts in).
KNOWN_FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid", "uri"})

# Keys that carry schemas (so their values are walked) and plain keywords we keep.
_SCHEMA_ONE = ("items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else")
_SCHEMA_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAP = ("properties", "$defs", "definitions", "patternProperties")
_KEEP = frozenset(
    {
        "type",
        "description",
        "enum",
        "const",
        "default",
        "required",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minLength",
        "maxLength",
        "pattern",
        "format",
        "minItems",
        "maxItems",
        "uniqueItems",
        "minProperties",
        "maxProperties",
        "$ref",
        "title",
        "examples",
        "x-grounded",  # the grounding opt-in/out (pocket_agent.grammars.grounding)
        "x-date-order",  # how a format: date argument reads 05/02/18 (same module)
        *_SCHEMA_ONE,
        *_SCHEMA_LIST,
        *_SCHEMA_MAP,
    }
)


def _json_type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _matches_type(value: Any, types: list[str]) -> bool:
    t = _json_type_of(value)
    return t in types or (t == "integer" and "number" in types)


def _map_type(raw: Any, where: str) -> tuple[list[str] | None, bool]:
    """JSON types for a ``type`` value and whether it was a BFCL ``tuple``."""
    names = raw if isinstance(raw, list) else [raw]
    out: list[str] = []
    is_tuple = False
    for n in names:
        if not isinstance(n, str):
            raise SchemaError(f"Invalid parameter schema at {where}: 'type' must be a string, got {n!r}.")
        key = n.strip().lower()
        if key not in TYPE_ALIASES:
            raise SchemaError(
                f"Invalid parameter schema at {where}: unknown type {n!r}; use a JSON Schema type "
                f"(string, number, integer, boolean, array, object, null)."
            )
        mapped = TYPE_ALIASES[key]
        is_tuple = is_tuple or key == "tuple"
        if mapped is None:
            return None, is_tuple
        if mapped not in out:
            out.append(mapped)
    return out, is_tuple


def normalize_schema(schema: Mapping[str, Any], *, close: bool = True, where: str = "#") -> dict[str, Any]:
    """A JSON Schema for ``schema`` written in the loose dialects of real tool specs.

    - BFCL/Java/JS type names are mapped (``dict`` -> ``object``, ``float`` -> ``number``,
      ``tuple`` -> ``array``, ``any`` -> no type constraint, ...);
    - keys that are not JSON Schema keywords (``optional``, ``x-...``) are dropped; string
      formats the grammar engine does not know are dropped;
    - an ``enum`` whose values contradict the declared type keeps the enum and drops the type;
    - ``required`` names that are not declared properties are dropped;
    - with ``close=True``, objects that declare ``properties`` and say nothing about extra keys
      get ``additionalProperties: false``.
    """
    if not isinstance(schema, Mapping):
        raise SchemaError(f"Invalid parameter schema at {where}: expected an object, got {type(schema).__name__}.")
    out: dict[str, Any] = {}
    types: list[str] | None = None
    if "type" in schema:
        types, _ = _map_type(schema["type"], where)
    for key, value in schema.items():
        if key == "type" or key not in _KEEP:
            continue
        if key in _SCHEMA_MAP:
            if not isinstance(value, Mapping):
                raise SchemaError(f"Invalid parameter schema at {where}/{key}: expected an object.")
            out[key] = {
                str(k): normalize_schema(v, close=close, where=f"{where}/{key}/{k}")
                if isinstance(v, Mapping)
                else bool(v)
                for k, v in value.items()
            }
        elif key in _SCHEMA_LIST:
            if not isinstance(value, list):
                raise SchemaError(f"Invalid parameter schema at {where}/{key}: expected a list.")
            out[key] = [
                normalize_schema(v, close=close, where=f"{where}/{key}/{i}") if isinstance(v, Mapping) else v
                for i, v in enumerate(value)
            ]
        elif key in _SCHEMA_ONE:
            if isinstance(value, Mapping):
                out[key] = normalize_schema(value, close=close, where=f"{where}/{key}")
            elif isinstance(value, list) and key == "items":
                out["prefixItems"] = [
                    normalize_schema(v, close=close, where=f"{where}/items/{i}") for i, v in enumerate(value)
                ]
            elif isinstance(value, bool):
                out[key] = value
        elif key == "format":
            if isinstance(value, str) and value in KNOWN_FORMATS:
                out[key] = value
        elif key == "required":
            if isinstance(value, list):
                out[key] = [str(v) for v in value]
        elif key == "title":
            continue
        else:
            out[key] = copy.deepcopy(value)
    if types is not None:
        enum = out.get("enum")
        if isinstance(enum, list) and enum and not all(_matches_type(v, types) for v in enum):
            types = None
        elif "const" in out and not _matches_type(out["const"], types):
            types = None
    if types is not None:
        out = {"type": types[0] if len(types) == 1 else types, **out}
    if "required" in out:
        props = out.get("properties")
        names = list(dict.fromkeys(out["required"]))
        out["required"] = [n for n in names if props is None or n in props]
        if not out["required"]:
            del out["required"]
    if close and "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def object_schema(schema: Mapping[str, Any] | None, *, close: bool = True) -> dict[str, Any]:
    """``normalize_schema`` for a tool's top-level parameters, which must describe an object."""
    if schema is None:
        return {"type": "object", "properties": {}, "additionalProperties": False}
    out = normalize_schema(schema, close=close)
    t = out.get("type")
    if t is None and "properties" in out:
        out = {"type": "object", **out}
        t = "object"
    if t != "object":
        raise SchemaError(f"Tool parameters must be an object schema, got type {t!r}.")
    if "properties" not in out:
        out["properties"] = {}
        if close and "additionalProperties" not in out:
            out["additionalProperties"] = False
    return out


# --- docstrings -----------------------------------------------------------------------

_GOOGLE_SECTIONS = re.compile(
    r"^(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Returns|Return|Yields|Raises|Examples?|"
    r"Notes?|Attributes|See Also|References|Warnings?|Todo)\s*:\s*$",
    re.IGNORECASE,
)
_NUMPY_UNDERLINE = re.compile(r"^\s*-{3,}\s*$")
_ARG_SECTIONS = {"args", "arguments", "parameters", "params", "keyword args", "keyword arguments", "attributes"}
_GOOGLE_ARG = re.compile(r"^\*{0,2}(\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")
_NUMPY_ARG = re.compile(r"^\*{0,2}(\w+)\s*(?::\s*(.*))?$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a docstring into its description and per-argument docs.

    Understands Google style (``Args:`` with ``name (type): text`` entries and indented
    continuation lines) and NumPy style (``Parameters`` underlined with dashes, ``name : type``
    followed by indented text). The description is the text before the first section, with
    its lines joined.
    """
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    args: dict[str, str] = {}
    i = 0
    section: str | None = None
    numpy_style = False
    current: str | None = None
    arg_indent: int | None = None
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        # NumPy section header: a title line followed by dashes.
        if stripped and _NUMPY_UNDERLINE.match(nxt) and not line.startswith(" "):
            section = stripped.lower()
            numpy_style = True
            current, arg_indent = None, None
            i += 2
            continue
        m = _GOOGLE_SECTIONS.match(stripped)
        if m and not line.startswith(" "):
            section = m.group(1).lower()
            numpy_style = False
            current, arg_indent = None, None
            i += 1
            continue
        if section is None:
            description.append(stripped)
        elif section in _ARG_SECTIONS and stripped:
            indent = len(line) - len(line.lstrip())
            if arg_indent is None:
                arg_indent = indent
            if indent <= arg_indent:
                gm = None if numpy_style else _GOOGLE_ARG.match(stripped)
                nm = _NUMPY_ARG.match(stripped) if numpy_style else None
                if gm:
                    current = gm.group(1)
                    args[current] = gm.group(3).strip()
                elif nm:
                    current = nm.group(1)
                    args[current] = ""
                else:
                    current = None
            elif current is not None:
                args[current] = (args[current] + " " + stripped).strip()
        i += 1
    text = " ".join(part for part in _paragraphs(description))
    return text.strip(), {k: " ".join(v.split()) for k, v in args.items()}


def _paragraphs(lines: list[str]) -> list[str]:
    out: list[str] = []
    buf: list[str] = []
    for ln in lines:
        if ln:
            buf.append(ln)
        elif buf:
            out.append(" ".join(buf))
            buf = []
    if buf:
        out.append(" ".join(buf))
    return out


# --- Pydantic models and function signatures -----------------------------------------------


def _strip_titles(schema: Any) -> Any:
    """Drop Pydantic's auto-generated ``title`` keywords (not property names called ``title``)."""
    if isinstance(schema, list):
        return [_strip_titles(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for k, v in schema.items():
        if k == "title" and isinstance(v, str):
            continue
        if k in _SCHEMA_MAP and isinstance(v, dict):
            out[k] = {name: _strip_titles(sub) for name, sub in v.items()}
        elif k in ("enum", "const", "default", "examples", "required"):
            out[k] = v
        else:
            out[k] = _strip_titles(v)
    return out


def model_parameters(model: type[Any], arg_docs: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The closed JSON Schema of a Pydantic model's fields, without generated titles.

    ``arg_docs`` (from a docstring) describe properties that have no description yet.
    """
    raw = model.model_json_schema()
    schema = _strip_titles(raw)
    schema.pop("description", None)
    out = object_schema(schema, close=True)
    for pname, doc in (arg_docs or {}).items():
        prop = out["properties"].get(pname)
        if doc and isinstance(prop, dict) and "description" not in prop:
            prop["description"] = doc
    return out


def build_arguments_model(fn: Callable[..., Any], *, name: str) -> tuple[type[Any], list[str]]:
    """A Pydantic model with one field per parameter of ``fn`` (extra keys forbidden).

    Returns the model and the parameter names in order. ``*args``/``**kwargs`` and
    parameters without a type hint are rejected: a tool's schema must say what it takes.
    """
    import typing

    from pydantic import ConfigDict, create_model

    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:  # NameError from unresolved forward references, etc.
        raise SchemaError(f"Cannot read the type hints of tool {name!r}: {exc}") from exc
    sig = inspect.signature(fn)
    fields: dict[str, Any] = {}
    order: list[str] = []
    for pname, param in sig.parameters.items():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise SchemaError(
                f"Tool {name!r} takes *{pname}; tools need named, typed parameters so the model can see them."
            )
        if pname in ("self", "cls") and not order:
            continue
        if pname not in hints:
            raise SchemaError(f"Parameter {pname!r} of tool {name!r} has no type hint; annotate it (e.g. `x: int`).")
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (hints[pname], default)
        order.append(pname)
    model = create_model(  # type: ignore[call-overload]
        f"{_camel(name)}Arguments",
        __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=False),
        **fields,
    )
    return model, order


def _camel(name: str) -> str:
    parts = re.split(r"[^0-9A-Za-z]+", name)
    return "".join(p[:1].upper() + p[1:] for p in parts if p) or "Tool"
