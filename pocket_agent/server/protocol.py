"""The OpenAI wire format: request models that validate what clients send, and the
response / chunk / error bodies the server writes.

Nothing here touches a model. Requests are validated strictly (``"10"`` is not an
integer) so that a wrong type is a 400 naming the field, never a 500.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

DEFAULT_MAX_TOKENS = 512
"""Output budget of a chat completion that gives neither ``max_tokens`` nor ``max_completion_tokens``."""


class APIError(Exception):
    """An error the server answers with, in OpenAI's shape:
    ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """The JSON body of the error response."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# --- requests -------------------------------------------------------------------------------


class ApiModel(BaseModel):
    # Unknown fields are ignored (clients send vendor extensions); known fields are strict.
    model_config = ConfigDict(extra="ignore", strict=True)


class ContentPart(ApiModel):
    type: str
    text: str | None = None


class FunctionCall(ApiModel):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(ApiModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(ApiModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None


class FunctionSpec(ApiModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolSpec(ApiModel):
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(ApiModel):
    name: str


class NamedToolChoice(ApiModel):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(ApiModel):
    name: str = "response"
    description: str | None = None
    # "schema" shadows a BaseModel attribute; the alias keeps the wire name.
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(ApiModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(ApiModel):
    include_usage: bool = False


class ChatCompletionRequest(ApiModel):
    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = Field(default=None, ge=0)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    n: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None


class ExtractRequest(ApiModel):
    text: str = Field(min_length=1)
    schema_: dict[str, Any] = Field(alias="schema")
    instructions: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)


class DecideRequest(ApiModel):
    question: str = Field(min_length=1)
    options: list[str] = Field(min_length=2)
    context: str | None = None
    method: Literal["auto", "cloze", "letter", "pointer"] = "auto"


_ModelT = TypeVar("_ModelT", bound=ApiModel)


def validation_error(exc: ValidationError) -> APIError:
    """A 400 naming the first invalid field (``param`` is its dotted path)."""
    err = exc.errors(include_url=False)[0]
    loc = [str(p) for p in err.get("loc", ()) if not str(p).startswith(("function-", "tagged-union"))]
    # Union members show up in the location as type names (``str``, ``list[...]``); drop them.
    loc = [p for p in loc if not (p in {"str", "int", "bool", "float", "dict[str,any]"} or "[" in p)]
    param = ".".join(loc) or None
    if err.get("type") == "json_invalid":
        return APIError(400, f"The request body is not valid JSON: {err.get('msg')}.", code="invalid_json")
    where = f" at {param}" if param else ""
    return APIError(400, f"Invalid request{where}: {err.get('msg')}.", param=param, code="invalid_value")


def parse_request(model_cls: type[_ModelT], body: bytes) -> _ModelT:
    """Validate a JSON body into ``model_cls`` or raise a 400 :class:`APIError`."""
    try:
        return model_cls.model_validate_json(body, strict=True)
    except ValidationError as exc:
        raise validation_error(exc) from None


# --- what the engine is asked to do -----------------------------------------------------------


@dataclass(frozen=True)
class ChatJob:
    """A chat completion request reduced to what the model needs."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    tool_choice: str
    parallel_tool_calls: bool
    response_schema: dict[str, Any] | bool | None
    max_tokens: int
    max_tokens_given: bool
    temperature: float
    top_p: float
    seed: int | None
    stop: list[str]


def _text_of(content: str | list[ContentPart] | None, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for i, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise APIError(
                400,
                f"{where}.content[{i}] is a {part.type!r} part; this server reads text parts only.",
                param=f"{where}.content.{i}.type",
                code="unsupported_content",
            )
        parts.append(part.text)
    return "".join(parts)


def _arguments(args: str | dict[str, Any], where: str) -> dict[str, Any]:
    if isinstance(args, dict):
        return args
    try:
        value = json.loads(args) if args.strip() else {}
    except ValueError:
        raise APIError(
            400, f"{where} is not a JSON object: {args[:80]!r}.", param=where, code="invalid_value"
        ) from None
    if not isinstance(value, dict):
        raise APIError(400, f"{where} must encode a JSON object.", param=where, code="invalid_value")
    return value


def to_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """OpenAI messages as the plain dicts :class:`pocket_agent.Agent` reads.

    ``developer`` becomes ``system``; text parts are joined; assistant ``tool_calls`` keep
    their ids and get their arguments as objects; a ``tool`` message keeps its
    ``tool_call_id`` and gets the called function's ``name`` from the call it answers.
    """
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for i, m in enumerate(messages):
        where = f"messages.{i}"
        role = "system" if m.role == "developer" else m.role
        msg: dict[str, Any] = {"role": role, "content": _text_of(m.content, where)}
        if m.role == "assistant" and m.tool_calls:
            calls = []
            for j, c in enumerate(m.tool_calls):
                args = _arguments(c.function.arguments, f"{where}.tool_calls.{j}.function.arguments")
                cid = c.id or f"call_{i}_{j}"
                names[cid] = c.function.name
                calls.append({"id": cid, "type": "function", "function": {"name": c.function.name, "arguments": args}})
            msg["tool_calls"] = calls
        elif m.tool_calls:
            raise APIError(400, f"{where}: only assistant messages carry tool_calls.", param=f"{where}.tool_calls")
        if m.role == "tool":
            if not m.tool_call_id:
                raise APIError(400, f"{where}: a tool message needs tool_call_id.", param=f"{where}.tool_call_id")
            msg["tool_call_id"] = m.tool_call_id
            name = m.name or names.get(m.tool_call_id)
            if name:
                msg["name"] = name
        elif m.role != "assistant" and not msg["content"].strip():
            raise APIError(400, f"{where} has empty content.", param=f"{where}.content", code="invalid_value")
        out.append(msg)
    if all(m["role"] == "system" for m in out):
        raise APIError(400, "messages holds only system messages; add a user message.", param="messages")
    return out


def chat_job(req: ChatCompletionRequest) -> ChatJob:
    """Check what the model cannot honour and reduce the request to a :class:`ChatJob`."""
    if req.n not in (None, 1):
        raise APIError(400, "n > 1 is not supported; send one request per choice.", param="n", code="unsupported")
    if req.logprobs or req.top_logprobs:
        raise APIError(400, "logprobs are not supported by this server.", param="logprobs", code="unsupported")
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(req, name):
            raise APIError(400, f"{name} is not supported (leave it 0 or unset).", param=name, code="unsupported")
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stop) > 4 or any(not s for s in stop):
        raise APIError(400, "stop takes at most 4 non-empty strings.", param="stop", code="invalid_value")
    tools = [t.model_dump(mode="json", exclude_none=True) for t in req.tools or []]
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise APIError(400, "Two tools have the same name; tool names must be unique.", param="tools")
    choice: str
    if req.tool_choice is None:
        choice = "auto"
    elif isinstance(req.tool_choice, str):
        choice = req.tool_choice
    else:
        choice = req.tool_choice.function.name
        if choice not in names:
            raise APIError(
                400,
                f"tool_choice names {choice!r}, which is not in tools ({', '.join(names) or 'none given'}).",
                param="tool_choice",
                code="invalid_value",
            )
    if choice == "required" and not tools:
        raise APIError(400, "tool_choice='required' needs at least one tool.", param="tool_choice")
    schema: dict[str, Any] | bool | None = None
    rf = req.response_format
    if rf is not None and rf.type == "json_object":
        schema = {"type": "object"}
    elif rf is not None and rf.type == "json_schema":
        if rf.json_schema is None or rf.json_schema.schema_ is None:
            raise APIError(
                400,
                "response_format json_schema needs json_schema.schema.",
                param="response_format.json_schema.schema",
            )
        schema = rf.json_schema.schema_
    max_tokens = req.max_completion_tokens or req.max_tokens or DEFAULT_MAX_TOKENS
    return ChatJob(
        messages=to_messages(req.messages),
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=req.parallel_tool_calls is not False,
        response_schema=schema,
        max_tokens=max_tokens,
        max_tokens_given=bool(req.max_completion_tokens or req.max_tokens),
        temperature=0.0 if req.temperature is None else float(req.temperature),
        top_p=1.0 if req.top_p is None else float(req.top_p),
        seed=req.seed,
        stop=stop,
    )


# --- responses ------------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    """A fresh OpenAI-style id (``chatcmpl-...``, ``call_...``)."""
    return f"{prefix}{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class CallOut:
    """One tool call of a reply: its id, the function's name and its arguments as JSON text."""

    id: str
    name: str
    arguments: str

    def message(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Reply:
    """The model's next turn: an answer (``content``) or tool calls, why it ended, and usage."""

    content: str | None
    tool_calls: list[CallOut]
    finish_reason: Literal["stop", "length", "tool_calls"]
    prompt_tokens: int
    completion_tokens: int

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


def completion_body(reply: Reply, *, id: str, model: str) -> dict[str, Any]:
    """A ``chat.completion`` object."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None}
    if reply.tool_calls:
        message["tool_calls"] = [c.message() for c in reply.tool_calls]
    return {
        "id": id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason, "logprobs": None}],
        "usage": reply.usage(),
    }


def chunk_body(
    *,
    id: str,
    model: str,
    created: int,
    delta: dict[str, Any] | None = None,
    finish_reason: str | None = None,
    usage: dict[str, int] | None = None,
    empty_choices: bool = False,
) -> dict[str, Any]:
    """A ``chat.completion.chunk`` object."""
    body: dict[str, Any] = {
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": []
        if empty_choices
        else [{"index": 0, "delta": delta or {}, "finish_reason": finish_reason, "logprobs": None}],
    }
    if usage is not None:
        body["usage"] = usage
    return body


def sse(data: Mapping[str, Any] | str) -> str:
    """One server-sent event line: ``data: <json>`` and a blank line."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n"
