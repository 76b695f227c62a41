"""JSON Schema helpers: walking subschemas, closing objects, checking, and turning
llguidance's compile errors into typed errors that name the feature and its JSON path.

Paths are JSON Pointers into the schema as compiled, written as URI fragments:
``#/properties/address/properties/zip``.
"""

from __future__ import annotations

import copy
import json
import re
import sys
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..errors import SchemaError, UnsupportedSchemaError

MAX_SCHEMA_DEPTH = 124
"""Deepest JSON nesting of a schema document that llguidance parses (its JSON reader stops
at 128 levels and the grammar envelope uses 3; measured with llguidance 1.9.1)."""

# Keywords whose value is a single subschema, a list of subschemas, or a map of them.
_ONE = (
    "additionalProperties",
    "additionalItems",
    "unevaluatedProperties",
    "unevaluatedItems",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "contentSchema",
)
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")

Pointer = tuple[str, ...]


def format_pointer(tokens: Pointer) -> str:
    """``("properties", "a/b")`` -> ``"#/properties/a~1b"`` (RFC 6901 escaping)."""
    return "#" + "".join("/" + t.replace("~", "~0").replace("/", "~1") for t in tokens)


def iter_subschemas(schema: Any) -> Iterator[tuple[Pointer, dict[str, Any]]]:
    """Every object subschema of ``schema`` with its pointer, in document order (pre-order).

    Iterative, so arbitrarily deep schemas do not hit Python's recursion limit.
    """
    stack: list[tuple[Pointer, Any]] = [((), schema)]
    while stack:
        ptr, node = stack.pop()
        if not isinstance(node, dict):
            continue
        yield ptr, node
        children: list[tuple[Pointer, Any]] = []
        for key, value in node.items():
            if key in _ONE:
                children.append(((*ptr, key), value))
            elif key == "items":
                if isinstance(value, list):
                    children.extend(((*ptr, key, str(i)), v) for i, v in enumerate(value))
                else:
                    children.append(((*ptr, key), value))
            elif key in _LIST and isinstance(value, list):
                children.extend(((*ptr, key, str(i)), v) for i, v in enumerate(value))
            elif key in _MAP and isinstance(value, dict):
                children.extend(((*ptr, key, str(k)), v) for k, v in value.items())
            elif key == "dependencies" and isinstance(value, dict):
                children.extend(((*ptr, key, str(k)), v) for k, v in value.items() if isinstance(v, dict))
        stack.extend(reversed(children))


def find_subschema(schema: Any, predicate: Callable[[dict[str, Any]], bool]) -> str | None:
    """Pointer of the first subschema (document order) for which ``predicate`` holds."""
    for ptr, node in iter_subschemas(schema):
        try:
            if predicate(node):
                return format_pointer(ptr)
        except (TypeError, AttributeError):
            continue
    return None


def json_depth(doc: Any) -> tuple[int, Pointer]:
    """Nesting depth of a JSON document (a scalar is 0, ``{}`` is 1) and the pointer of
    the deepest container."""
    best: tuple[int, Pointer] = (0, ())
    stack: list[tuple[Any, int, Pointer]] = [(doc, 1, ())]
    while stack:
        node, depth, ptr = stack.pop()
        if isinstance(node, dict):
            items: list[tuple[str, Any]] = [(str(k), v) for k, v in node.items()]
        elif isinstance(node, list):
            items = [(str(i), v) for i, v in enumerate(node)]
        else:
            continue
        if depth > best[0]:
            best = (depth, ptr)
        stack.extend((v, depth + 1, (*ptr, k)) for k, v in items)
    return best


def check_depth(schema: Any) -> None:
    """Raise :class:`UnsupportedSchemaError` when the schema nests deeper than llguidance reads."""
    depth, ptr = json_depth(schema)
    if depth > MAX_SCHEMA_DEPTH:
        raise UnsupportedSchemaError(
            f"The schema nests {depth} levels deep; the grammar engine reads at most {MAX_SCHEMA_DEPTH}. "
            f"Move repeated structure into $defs and use $ref (recursive $ref has no depth limit).",
            feature="schema nesting depth",
            path=format_pointer(ptr),
        )


def check_schema(schema: Any) -> None:
    """Raise :class:`SchemaError` if ``schema`` is not a valid JSON Schema (its own ``$schema``
    draft, else 2020-12), :class:`UnsupportedSchemaError` if it nests too deeply."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise SchemaError(f"A JSON Schema must be an object or a boolean, got {type(schema).__name__}.")
    check_depth(schema)
    try:
        key = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        raise SchemaError("The schema is not JSON data (it holds values JSON cannot represent).") from None
    with _checked_lock:
        if key in _checked:
            _checked.move_to_end(key)
            return
    _check_schema_uncached(schema)
    with _checked_lock:
        _checked[key] = None
        while len(_checked) > 512:
            _checked.popitem(last=False)


# Meta-schema validation costs ~1-50 ms (2020-12 resolves $dynamicRef); remember successes.
_checked: OrderedDict[str, None] = OrderedDict()
_checked_lock = threading.Lock()


def forget_checked_schemas() -> None:
    """Forget which schemas passed :func:`check_schema` (they are checked again)."""
    with _checked_lock:
        _checked.clear()


def _check_schema_uncached(schema: dict[str, Any]) -> None:
    import jsonschema
    from jsonschema import exceptions as js_exc

    old_limit = sys.getrecursionlimit()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            # jsonschema recurses ~10 frames per nesting level; check_depth bounds the levels.
            if old_limit < 4000:
                sys.setrecursionlimit(4000)
            cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
            cls.check_schema(schema)
        except js_exc.SchemaError as e:
            where = format_pointer(tuple(str(p) for p in e.path))
            raise SchemaError(f"Invalid JSON Schema at {where}: {e.message}") from None
        except RecursionError:
            raise UnsupportedSchemaError(
                "The schema is nested too deeply to check.", feature="schema nesting depth", path="#"
            ) from None
        finally:
            if sys.getrecursionlimit() != old_limit:
                sys.setrecursionlimit(old_limit)


def _is_object_schema(node: dict[str, Any]) -> bool:
    t = node.get("type")
    return "properties" in node or t == "object" or (isinstance(t, list) and "object" in t)


def close_objects(schema: Any) -> Any:
    """A copy of ``schema`` where every object subschema without an explicit
    ``additionalProperties`` (or ``unevaluatedProperties``) gets ``additionalProperties: false``,
    unless it requires a key its ``properties`` do not declare (closing would then accept
    nothing). Every instance the copy accepts is an instance of ``schema``.
    """
    out = copy.deepcopy(schema)
    for _, node in iter_subschemas(out):
        if _is_object_schema(node) and "additionalProperties" not in node and "unevaluatedProperties" not in node:
            props, need = node.get("properties"), node.get("required")
            declared: Mapping[str, Any] = props if isinstance(props, Mapping) else {}
            required: list[Any] = need if isinstance(need, list) else []
            if all(k in declared for k in required) and not node.get("minProperties"):
                node["additionalProperties"] = False
    return out


def cap_lengths(
    schema: Mapping[str, Any], *, max_chars: int | None = None, max_items: int | None = None
) -> dict[str, Any]:
    """A copy of ``schema`` whose free strings hold at most ``max_chars`` characters and whose
    arrays hold at most ``max_items`` items.

    Strings with an ``enum``, ``const``, ``pattern`` or ``format`` are left alone; an existing
    smaller ``maxLength``/``maxItems`` is kept; a bound below the schema's own minimum is not
    applied. The result accepts a subset of what ``schema`` accepts.
    """
    out = copy.deepcopy(dict(schema))

    def has(node: dict[str, Any], kind: str) -> bool:
        t = node.get("type")
        return t == kind or (isinstance(t, list) and kind in t)

    for _, node in iter_subschemas(out):
        if max_chars is not None and has(node, "string"):
            if not any(k in node for k in ("enum", "const", "pattern", "format")):
                if int(node.get("minLength", 0)) <= max_chars and int(node.get("maxLength", max_chars + 1)) > max_chars:
                    node["maxLength"] = max_chars
        if max_items is not None and has(node, "array") and "enum" not in node and "const" not in node:
            low = max(int(node.get("minItems", 0)), len(node.get("prefixItems") or []))
            if low <= max_items and int(node.get("maxItems", max_items + 1)) > max_items:
                node["maxItems"] = max_items
    return out


# --- llguidance error messages -> typed errors ------------------------------------------

_UNIMPLEMENTED = re.compile(r"Unimplemented keys: \[(.*?)\]")
_FORMAT = re.compile(r"Unknown format: (.+)")
_CIRCULAR = re.compile(r"circular references with sibling keys are not supported: \S*?(#\S*)")
_PATTERN_PROPS = re.compile(r"patternProperty regexes /(.*)/ and /(.*)/ are not disjoint")
_POINTER = re.compile(r"Pointer '([^']*)' does not exist")
_RESOURCE = re.compile(r"Resource '([^']*)' is not present in a registry")
_RANGE = re.compile(r"Failed to generate regex for (\w+) range")
_REGEX_ERR = re.compile(r"regex parse error:\n\s*(.*)\n(?:.*\n)*?error: (.*)")


def _first_line(msg: str) -> str:
    return msg.strip().splitlines()[0] if msg.strip() else msg


def classify_error(message: str, schema: Any) -> SchemaError:
    """Turn an llguidance compile error for ``schema`` into :class:`UnsupportedSchemaError`
    (feature + path) or :class:`SchemaError` (the schema is wrong or accepts nothing)."""
    msg = message.replace("\n<non-verbose/>", "").strip()
    first = _first_line(msg)

    def unsupported(feature: str, path: str | None, detail: str | None = None) -> UnsupportedSchemaError:
        where = f" at {path}" if path else ""
        text = detail or first
        return UnsupportedSchemaError(
            f"Unsupported JSON Schema feature {feature!r}{where}: {text}. "
            f"Remove or rewrite it; constrained decoding cannot enforce it.",
            feature=feature,
            path=path,
        )

    if m := _UNIMPLEMENTED.search(msg):
        try:
            keys = [str(k) for k in json.loads("[" + m.group(1) + "]")]
        except ValueError:
            keys = [k.strip(' "') for k in m.group(1).split(",")]
        path = find_subschema(schema, lambda n: any(k in n for k in keys))
        names = ", ".join(repr(k) for k in keys)
        return unsupported(", ".join(keys), path, f"the grammar engine does not implement {names}")
    if "oneOf constraints are not supported" in msg:
        path = find_subschema(schema, lambda n: "oneOf" in n)
        return unsupported(
            "oneOf",
            path,
            "oneOf whose branches may overlap cannot be enforced exactly (use anyOf if overlap is fine)",
        )
    if m := _FORMAT.search(msg):
        name = m.group(1).strip()
        path = find_subschema(schema, lambda n: n.get("format") == name)
        return unsupported(f"format:{name}", path, f"string format {name!r} is not known to the grammar engine")
    if m := _CIRCULAR.search(msg):
        return unsupported("$ref (circular, with sibling keywords)", m.group(1), first)
    if m := _PATTERN_PROPS.search(msg):
        rx = m.group(1)
        path = find_subschema(schema, lambda n: rx in (n.get("patternProperties") or {}))
        if path is None:
            path = find_subschema(schema, lambda n: "patternProperties" in n)
        return unsupported("patternProperties (overlapping)", path, first)
    if "min/maxProperties" in msg:
        path = find_subschema(schema, lambda n: "minProperties" in n or "maxProperties" in n)
        return unsupported("minProperties/maxProperties", path, first)
    if "intersection stack level exceeded" in msg:
        path = find_subschema(schema, lambda n: "allOf" in n)
        return unsupported("allOf (nested intersections too deep)", path, first)
    if m := _POINTER.search(msg):
        ptr = m.group(1)
        path = find_subschema(schema, lambda n: isinstance(n.get("$ref"), str) and n["$ref"].endswith(ptr))
        where = f" at {path}" if path else ""
        return SchemaError(f"Invalid JSON Schema{where}: $ref target {ptr!r} does not exist.")
    if m := _RESOURCE.search(msg):
        res = m.group(1)
        path = find_subschema(schema, lambda n: isinstance(n.get("$ref"), str) and n["$ref"].startswith(res))
        return unsupported("$ref (remote)", path, f"remote reference {res!r} is not fetched; inline it under $defs")
    if m := _REGEX_ERR.search(msg):
        rx, why = m.group(1).strip(), m.group(2).strip()
        path = find_subschema(
            schema, lambda n: n.get("pattern") == rx or rx in (n.get("patternProperties") or {})
        ) or find_subschema(schema, lambda n: "pattern" in n or "patternProperties" in n)
        return unsupported("pattern", path, f"regex {rx!r}: {why}")
    if m := _RANGE.search(msg):
        kind = m.group(1)
        path = find_subschema(
            schema,
            lambda n: (
                any(k in n for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"))
                and (n.get("type") == kind or kind not in ("integer", "number"))
            ),
        ) or find_subschema(schema, lambda n: any(k in n for k in ("minimum", "maximum")))
        return unsupported("minimum/maximum (range)", path, f"cannot build a grammar for this {kind} range: {first}")
    if "recursion limit exceeded" in msg:
        depth, ptr = json_depth(schema)
        return unsupported("schema nesting depth", format_pointer(ptr), f"the schema nests {depth} levels deep")
    if "Unsatisfiable" in msg or "NoExtension" in msg:
        detail = first if "Unsatisfiable" in msg else "no JSON value satisfies it (e.g. a $ref cycle)"
        return SchemaError(f"The schema accepts no JSON value: {detail}.")
    if any(s in msg for s in ("too many", "TooComplex", "limit", "too large", "fuel")):
        return unsupported("schema size/complexity", "#", first)
    return unsupported("unknown", None, first)
