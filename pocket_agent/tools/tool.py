"""Tool definitions: a name, a description, a JSON Schema for the arguments, and a callable.

Three ways in:

- ``@tool`` on a typed Python function: the name is the function's, the description its
  docstring summary plus per-argument docs (Google or NumPy ``Args``/``Parameters``), the
  schema comes from the signature through Pydantic;
- ``tool(SomePydanticModel)`` (optionally with ``fn=``): the model's fields are the
  arguments; without ``fn`` the tool returns the validated model;
- ``tool({"name": ..., "description": ..., "parameters": {...}}, fn=callable)``: an
  OpenAI-style (or BFCL) function spec, normalised to standard JSON Schema.

:meth:`Tool.validate` checks and converts arguments before any call.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, overload

from ..errors import InvalidInputError, SchemaError, ToolArgumentError
from .schema import build_arguments_model, model_parameters, object_schema, parse_docstring

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,127}$")


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidInputError(
            f"Invalid tool name {name!r}: use letters, digits, '_', '.', '-' (starting with a letter or '_')."
        )
    return name


async def _await(aw: Awaitable[Any]) -> Any:
    return await aw


def _snake(name: str) -> str:
    s = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name)
    return s.lower()


@dataclass(eq=False)
class Tool:
    """A function the model may call.

    ``parameters`` is the JSON Schema the arguments must match (objects closed), shown to
    the model and compiled into the tool-call grammar. ``confirm=True`` makes an
    :class:`~pocket_agent.tools.Agent` ask its confirmation callback before each call.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any] | None = field(default=None, repr=False)
    confirm: bool = False
    arguments_model: type[Any] | None = field(default=None, repr=False)
    returns_model: bool = field(default=False, repr=False)
    _validator: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_name(self.name)
        if not isinstance(self.description, str):
            raise InvalidInputError(f"Tool {self.name!r}: description must be a string.")
        if self.fn is not None and not callable(self.fn):
            raise InvalidInputError(f"Tool {self.name!r}: fn must be callable, got {type(self.fn).__name__}.")
        self.parameters = object_schema(self.parameters)

    # -- constructors --------------------------------------------------------------------

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        confirm: bool = False,
    ) -> Tool:
        """A tool from a typed Python function (see the module docs)."""
        if not callable(fn):
            raise InvalidInputError(f"tool() needs a function, got {type(fn).__name__}.")
        tool_name = _check_name(name or getattr(fn, "__name__", ""))
        summary, arg_docs = parse_docstring(getattr(fn, "__doc__", None))
        model, _ = build_arguments_model(fn, name=tool_name)
        try:
            params = model_parameters(model, arg_docs)
        except SchemaError:
            raise
        except Exception as exc:  # pydantic.errors.PydanticSchemaGenerationError / PydanticInvalidForJsonSchema
            raise SchemaError(f"Tool {tool_name!r}: its parameter types have no JSON Schema: {exc}") from exc
        return cls(
            name=tool_name,
            description=description if description is not None else summary,
            parameters=params,
            fn=fn,
            confirm=confirm,
            arguments_model=model,
        )

    @classmethod
    def from_model(
        cls,
        model: type[Any],
        *,
        fn: Callable[..., Any] | None = None,
        name: str | None = None,
        description: str | None = None,
        confirm: bool = False,
    ) -> Tool:
        """A tool whose arguments are the fields of a Pydantic model.

        With ``fn`` the validated model instance is passed to ``fn`` as its only argument;
        without it, calling the tool returns the instance (a structured "answer" tool).
        """
        from pydantic import BaseModel

        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise InvalidInputError(f"from_model needs a Pydantic model class, got {model!r}.")
        summary, arg_docs = parse_docstring(model.__doc__)
        tool_name = _check_name(name or _snake(model.__name__))
        return cls(
            name=tool_name,
            description=description if description is not None else summary,
            parameters=model_parameters(model, arg_docs),
            fn=fn,
            confirm=confirm,
            arguments_model=model,
            returns_model=True,
        )

    @classmethod
    def from_openai(
        cls,
        spec: Mapping[str, Any],
        fn: Callable[..., Any] | None = None,
        *,
        confirm: bool = False,
    ) -> Tool:
        """A tool from an OpenAI-style function spec (``{"type": "function", "function": {...}}``
        or the inner ``{"name", "description", "parameters"}``), BFCL specs included.

        The arguments are validated against the normalised schema with ``jsonschema``;
        ``fn`` (if given) is called with them as keyword arguments.
        """
        if not isinstance(spec, Mapping):
            raise InvalidInputError(f"A tool spec must be a dict, got {type(spec).__name__}.")
        inner = spec.get("function") if spec.get("type") == "function" else spec
        if not isinstance(inner, Mapping) or "name" not in inner:
            raise InvalidInputError("A tool spec needs a 'name' (and usually 'description' and 'parameters').")
        desc = inner.get("description") or ""
        if not isinstance(desc, str):
            raise InvalidInputError(f"Tool {inner['name']!r}: description must be a string.")
        return cls(
            name=inner["name"],
            description=desc,
            parameters=dict(inner.get("parameters") or {"type": "object", "properties": {}}),
            fn=fn,
            confirm=confirm,
        )

    # -- use -----------------------------------------------------------------------------

    def to_openai(self) -> dict[str, Any]:
        """The tool as an OpenAI-style spec (the form chat templates render)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def check_arguments(self, arguments: Any) -> None:
        """Raise :class:`ToolArgumentError` unless ``arguments`` match :attr:`parameters` (JSON Schema)."""
        if not isinstance(arguments, Mapping):
            raise ToolArgumentError(f"Arguments for {self.name!r} must be an object, got {type(arguments).__name__}.")
        validator = self._get_validator()
        errors = sorted(validator.iter_errors(dict(arguments)), key=lambda e: list(e.absolute_path))
        if errors:
            msgs = "; ".join(f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors[:5])
            raise ToolArgumentError(f"Invalid arguments for tool {self.name!r}: {msgs}")

    def _get_validator(self) -> Any:
        if self._validator is None:
            import jsonschema

            cls = jsonschema.validators.validator_for(self.parameters, default=jsonschema.Draft202012Validator)
            try:
                cls.check_schema(self.parameters)
            except jsonschema.exceptions.SchemaError as exc:
                raise SchemaError(f"Tool {self.name!r} has an invalid parameter schema: {exc.message}") from None
            self._validator = cls(self.parameters)
        return self._validator

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Check ``arguments`` against the schema and convert them to what the function takes.

        Function and Pydantic tools convert through Pydantic (nested models, enums, dates,
        tuples...); spec tools convert BFCL ``tuple`` values to tuples. Raises
        :class:`ToolArgumentError` naming the offending arguments.
        """
        self.check_arguments(arguments)
        if self.arguments_model is None:
            return dict(arguments)
        from pydantic import ValidationError

        try:
            inst = self.arguments_model.model_validate(dict(arguments))
        except ValidationError as exc:
            msgs = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in exc.errors(include_url=False)[:5]
            )
            raise ToolArgumentError(f"Invalid arguments for tool {self.name!r}: {msgs}") from None
        if self.returns_model:
            return {"__model__": inst}
        return {k: getattr(inst, k) for k in inst.model_fields_set}

    def invoke(self, arguments: Mapping[str, Any]) -> Any:
        """Validate ``arguments`` and run the tool; exceptions from the tool propagate."""
        return self.call_validated(self.validate(arguments))

    def call_validated(self, kwargs: Mapping[str, Any]) -> Any:
        """Run the tool with arguments already returned by :meth:`validate`."""
        if self.returns_model:
            inst = kwargs["__model__"]
            return inst if self.fn is None else self.fn(inst)
        if self.fn is None:
            raise InvalidInputError(f"Tool {self.name!r} has no function to run; pass fn= when creating it.")
        result = self.fn(**kwargs)
        if inspect.isawaitable(result):
            # async tools run to completion on a private event loop
            return asyncio.run(_await(result))
        return result

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (as if undecorated)."""
        if self.fn is None:
            if self.returns_model and self.arguments_model is not None and not args:
                return self.arguments_model(**kwargs)
            raise InvalidInputError(f"Tool {self.name!r} has no function to run.")
        return self.fn(*args, **kwargs)


ToolLike = Any
"""Anything :func:`as_tool` accepts: a :class:`Tool`, a typed function, a Pydantic model
class, or an OpenAI-style spec dict (only with a function paired through ``tool(spec, fn=...)``
or on its own for evaluation)."""


@overload
def tool(obj: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    obj: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    confirm: bool = False,
    fn: Callable[..., Any] | None = None,
) -> Callable[[Any], Tool]: ...


@overload
def tool(
    obj: Mapping[str, Any] | type[Any],
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    confirm: bool = False,
    fn: Callable[..., Any] | None = None,
) -> Tool: ...


def tool(
    obj: Any = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    confirm: bool = False,
    fn: Callable[..., Any] | None = None,
) -> Any:
    """Make a :class:`Tool`; usable as ``@tool``, ``@tool(confirm=True)``, ``tool(Model)``
    or ``tool(spec_dict, fn=callable)``.

    Args:
        obj: a typed function, a Pydantic model class, or an OpenAI-style spec dict.
        name: override the tool name (default: the function / snake-cased model name).
        description: override the description (default: from the docstring / spec).
        confirm: ask the agent's confirmation callback before every call.
        fn: the callable for a Pydantic model or a spec dict.
    """
    if obj is None:

        def decorate(target: Any) -> Tool:
            return as_tool(target, name=name, description=description, confirm=confirm, fn=fn)

        return decorate
    return as_tool(obj, name=name, description=description, confirm=confirm, fn=fn)


def as_tool(
    obj: Any,
    *,
    name: str | None = None,
    description: str | None = None,
    confirm: bool = False,
    fn: Callable[..., Any] | None = None,
) -> Tool:
    """Turn a function, Pydantic model class, spec dict or :class:`Tool` into a :class:`Tool`."""
    if isinstance(obj, Tool):
        return obj
    if isinstance(obj, Mapping):
        t = Tool.from_openai(obj, fn, confirm=confirm)
        if name is not None:
            t.name = _check_name(name)
        if description is not None:
            t.description = description
        return t
    try:
        from pydantic import BaseModel

        is_model = isinstance(obj, type) and issubclass(obj, BaseModel)
    except ImportError:  # pragma: no cover - pydantic is a dependency
        is_model = False
    if is_model:
        return Tool.from_model(obj, fn=fn, name=name, description=description, confirm=confirm)
    if callable(obj):
        if fn is not None:
            raise InvalidInputError("fn= is only for Pydantic models and spec dicts; a function is its own fn.")
        return Tool.from_function(obj, name=name, description=description, confirm=confirm)
    raise InvalidInputError(
        f"Cannot make a tool from {type(obj).__name__}: give a typed function, a Pydantic model class, "
        f"or an OpenAI-style spec dict."
    )
