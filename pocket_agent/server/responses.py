"""OpenAI's Responses API (``POST /v1/responses``) over the chat-completions machinery.

A Responses request is translated into the chat completion request it means (``instructions``
and the ``input`` items become messages, ``text.format`` becomes ``response_format``, function
``tools`` and ``tool_choice`` keep their meaning), which :func:`~.protocol.chat_job` checks and
:class:`~.engine.ChatTurn` answers as it answers ``/v1/chat/completions``: a ``json_schema``
format is grounded extraction there (:mod:`.structured`), a forced call likewise. The
:class:`~.protocol.Reply` is then written back as a ``response`` object: a ``message`` item with
the text, a ``function_call`` item per call. ``stream=True`` gives the Responses events
(``response.created`` ... ``response.output_text.delta`` ... ``response.completed``).

Nothing is stored: ``previous_response_id`` and ``conversation`` are refused; send the whole
conversation in ``input``, with earlier ``function_call`` and ``function_call_output`` items.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import Field, ValidationError

from .app import Job, Routes, api_error
from .engine import ChatTurn
from .protocol import (
    APIError,
    ApiModel,
    ChatCompletionRequest,
    Reply,
    chat_job,
    new_id,
    parse_request,
    validation_error,
)

# --- requests -------------------------------------------------------------------------------


class InputPart(ApiModel):
    """A content part of an input item (``input_text``, an assistant's ``output_text``...)."""

    type: str
    text: str | None = None


class InputItem(ApiModel):
    """One ``input`` item: a message (the default), a ``function_call`` or a ``function_call_output``."""

    type: str = "message"
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: str | list[InputPart] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[InputPart] | None = None


class FunctionTool(ApiModel):
    """A ``tools`` entry; only ``function`` tools are served."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(ApiModel):
    """``text.format``: plain text, any JSON object, or an object of a JSON Schema."""

    type: Literal["text", "json_object", "json_schema"]
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(ApiModel):
    """``text``: the output's format."""

    format: TextFormat | None = None


class ToolChoiceIn(ApiModel):
    """A ``tool_choice`` object: ``{"type": "function", "name": ...}``."""

    type: str
    name: str | None = None


class ResponsesRequest(ApiModel):
    """The body of ``POST /v1/responses`` (unknown fields are ignored)."""

    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    text: TextConfig | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | ToolChoiceIn | None = None
    parallel_tool_calls: bool | None = None
    stream: bool = False
    store: bool | None = None
    metadata: dict[str, str] | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    top_logprobs: int | None = None
    user: str | None = None


# --- a Responses request as a chat request ----------------------------------------------------


@dataclass
class Translation:
    """The chat request a Responses request means, and for each of its messages the request
    field it came from (so that an error names the field the client sent)."""

    chat: dict[str, Any]
    origins: list[str] = field(default_factory=list)


def _part_text(parts: str | list[InputPart] | None, where: str) -> str | None:
    if parts is None or isinstance(parts, str):
        return parts
    texts = []
    for j, part in enumerate(parts):
        if part.type not in ("input_text", "output_text", "text") or part.text is None:
            raise APIError(
                400,
                f"{where}[{j}] is a {part.type!r} part; this server reads text parts only.",
                param=f"{where}.{j}.type",
                code="unsupported_content",
            )
        texts.append(part.text)
    return "".join(texts)


def _input_messages(items: list[InputItem], out: Translation) -> None:
    """Append the chat messages of ``input`` items: consecutive ``function_call`` items are one
    assistant turn of calls, a ``function_call_output`` is the tool message answering one."""
    for i, item in enumerate(items):
        where = f"input.{i}"
        if item.type == "message":
            if item.role is None:
                raise APIError(400, f"{where} is a message without a role.", param=f"{where}.role")
            text = _part_text(item.content, f"{where}.content")
            out.chat["messages"].append({"role": item.role, "content": text if text is not None else ""})
            out.origins.append(where)
        elif item.type == "function_call":
            if not item.name or not item.call_id:
                raise APIError(400, f"{where}: a function_call needs name and call_id.", param=where)
            function = {"name": item.name, "arguments": item.arguments or "{}"}
            call = {"id": item.call_id, "type": "function", "function": function}
            last = out.chat["messages"][-1] if out.chat["messages"] else None
            if last is not None and last["role"] == "assistant":  # one assistant turn: its text and calls
                last.setdefault("tool_calls", []).append(call)
            else:
                out.chat["messages"].append({"role": "assistant", "content": None, "tool_calls": [call]})
                out.origins.append(where)
        elif item.type == "function_call_output":
            if not item.call_id:
                raise APIError(400, f"{where}: a function_call_output needs call_id.", param=f"{where}.call_id")
            text = _part_text(item.output, f"{where}.output") or ""
            out.chat["messages"].append({"role": "tool", "tool_call_id": item.call_id, "content": text})
            out.origins.append(where)
        else:
            raise APIError(
                400,
                f"{where} is a {item.type!r} item; this server reads message, function_call and "
                f"function_call_output items.",
                param=f"{where}.type",
                code="unsupported_value",
            )


def _tools(req: ResponsesRequest, chat: dict[str, Any]) -> None:
    specs = []
    for i, t in enumerate(req.tools or []):
        if t.type != "function":
            raise APIError(
                400,
                f"tools.{i} is a {t.type!r} tool; this server runs no hosted tools, only function tools.",
                param=f"tools.{i}.type",
                code="unsupported_value",
            )
        if not t.name:
            raise APIError(400, f"tools.{i} has no name.", param=f"tools.{i}.name")
        fn = {"name": t.name, "description": t.description, "parameters": t.parameters, "strict": t.strict}
        specs.append({"type": "function", "function": {k: v for k, v in fn.items() if v is not None}})
    if specs:
        chat["tools"] = specs
    choice = req.tool_choice
    if isinstance(choice, ToolChoiceIn):
        if choice.type != "function" or not choice.name:
            raise APIError(
                400,
                'tool_choice takes "auto", "none", "required" or {"type": "function", "name": ...}.',
                param="tool_choice",
                code="unsupported_value",
            )
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None:
        chat["tool_choice"] = choice


def translate(req: ResponsesRequest) -> Translation:
    """The chat completion request (as a dict) that ``req`` means; 400 for what has no
    counterpart here (stored responses, hosted tools, non-text input)."""
    for name in ("previous_response_id", "conversation"):
        if getattr(req, name) is not None:
            raise APIError(
                400,
                f"{name} is not supported: this server stores no responses. Send the whole conversation in input.",
                param=name,
                code="unsupported",
            )
    if req.top_logprobs:
        raise APIError(400, "logprobs are not supported by this server.", param="top_logprobs", code="unsupported")
    out = Translation(chat={"messages": []})
    if req.instructions is not None and req.instructions.strip():
        out.chat["messages"].append({"role": "system", "content": req.instructions})
        out.origins.append("instructions")
    if isinstance(req.input, str):
        out.chat["messages"].append({"role": "user", "content": req.input})
        out.origins.append("input")
    else:
        _input_messages(req.input, out)
    if not out.chat["messages"]:
        raise APIError(400, "input is empty; give a string or at least one message.", param="input")
    fmt = req.text.format if req.text is not None else None
    if fmt is not None and fmt.type == "json_object":
        out.chat["response_format"] = {"type": "json_object"}
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.schema_ is None:
            raise APIError(400, "text.format json_schema needs schema.", param="text.format.schema")
        js = {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict}
        out.chat["response_format"] = {"type": "json_schema", "json_schema": js}
    _tools(req, out.chat)
    for key, value in (
        ("max_completion_tokens", req.max_output_tokens),
        ("temperature", req.temperature),
        ("top_p", req.top_p),
        ("parallel_tool_calls", req.parallel_tool_calls),
    ):
        if value is not None:
            out.chat[key] = value
    return out


_PARAMS = [
    ("response_format.json_schema.schema", "text.format.schema"),
    ("response_format", "text.format"),
    ("max_completion_tokens", "max_output_tokens"),
    ("max_tokens", "max_output_tokens"),
]


def renamed(err: APIError, origins: list[str]) -> APIError:
    """``err`` with a chat request's field (``param`` and the message) named as the Responses
    request calls it: ``messages.2`` -> ``input.1``, ``tools.0.function.parameters`` ->
    ``tools.0.parameters``, ``response_format`` -> ``text.format``."""
    param = err.param
    if param is None:
        return err
    head, _, rest = param.partition(".")
    if head == "messages":
        index, _, tail = rest.partition(".")
        if index.isdigit() and int(index) < len(origins):
            new = origins[int(index)] + (f".{tail}" if tail else "")
        else:
            new = "input"
    elif head == "tools" and ".function." in param:
        new = param.replace(".function.", ".", 1)
    else:
        new = next((param.replace(old, to, 1) for old, to in _PARAMS if param.startswith(old)), param)
    if new == param:
        return err
    message = err.message.replace(param, new).replace("max_tokens", "max_output_tokens")
    return APIError(err.status, message, type=err.type, param=new, code=err.code, headers=err.headers)


# --- the reply as a response object ------------------------------------------------------------


@dataclass
class ResponseShape:
    """What a response object repeats of its request, and its ids."""

    req: ResponsesRequest
    model: str
    id: str = field(default_factory=lambda: new_id("resp_"))
    created_at: int = field(default_factory=lambda: int(time.time()))
    message_id: str = field(default_factory=lambda: new_id("msg_"))

    def body(self, status: str, output: list[dict[str, Any]], reply: Reply | None = None) -> dict[str, Any]:
        """A ``response`` object in ``status`` with ``output`` (and usage from ``reply``)."""
        req = self.req
        fmt = req.text.format if req.text is not None and req.text.format is not None else None
        choice = req.tool_choice
        body: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": None,
            "store": False,
            "temperature": 0.0 if req.temperature is None else req.temperature,
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
            "tool_choice": choice.model_dump(exclude_none=True)
            if isinstance(choice, ToolChoiceIn)
            else choice or "auto",
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
            "truncation": "disabled",
            "metadata": req.metadata or {},
            "user": req.user,
            "usage": None,
        }
        if status in ("completed", "incomplete"):
            body["completed_at"] = int(time.time())
        if reply is not None:
            body["usage"] = {
                "input_tokens": reply.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": reply.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": reply.prompt_tokens + reply.completion_tokens,
            }
        return body

    def message(self, text: str, status: str) -> dict[str, Any]:
        """The assistant ``message`` output item holding ``text``."""
        content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant", "content": content}


def reply_status(reply: Reply) -> str:
    """``incomplete`` when the reply ran out of ``max_output_tokens``, else ``completed``."""
    return "incomplete" if reply.finish_reason == "length" else "completed"


def call_items(reply: Reply, status: str = "completed") -> list[dict[str, Any]]:
    """The ``function_call`` output items of the reply's tool calls."""
    return [
        {
            "type": "function_call",
            "id": "fc_" + c.id.removeprefix("call_"),
            "call_id": c.id,
            "name": c.name,
            "arguments": c.arguments,
            "status": status,
        }
        for c in reply.tool_calls
    ]


def response_body(reply: Reply, shape: ResponseShape) -> dict[str, Any]:
    """The finished ``response`` object of a reply."""
    status = reply_status(reply)
    output = [shape.message(reply.content, status)] if reply.content is not None else []
    return shape.body(status, output + call_items(reply), reply)


# --- streaming ------------------------------------------------------------------------------------


class _EventWriter:
    """Numbers the Responses stream's events and writes each as one server-sent event."""

    def __init__(self) -> None:
        self.sequence = 0

    def __call__(self, type: str, **fields: Any) -> str:
        data = {"type": type, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {type}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _message_done(shape: ResponseShape, text: str, status: str, ev: _EventWriter) -> list[str]:
    ids = {"item_id": shape.message_id, "output_index": 0, "content_index": 0}
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return [
        ev("response.output_text.done", text=text, logprobs=[], **ids),
        ev("response.content_part.done", part=part, **ids),
        ev("response.output_item.done", output_index=0, item=shape.message(text, status)),
    ]


def _calls_done(reply: Reply, first_index: int, ev: _EventWriter) -> list[str]:
    events = []
    for k, item in enumerate(call_items(reply)):
        index = first_index + k
        events.append(ev("response.output_item.added", output_index=index, item={**item, "arguments": ""}))
        ids = {"item_id": item["id"], "output_index": index}
        events.append(ev("response.function_call_arguments.delta", delta=item["arguments"], **ids))
        events.append(ev("response.function_call_arguments.done", arguments=item["arguments"], **ids))
        events.append(ev("response.output_item.done", output_index=index, item=item))
    return events


async def stream_events(job: Job, shape: ResponseShape, origins: list[str]) -> AsyncIterator[str]:
    """The Responses event stream of one turn. Starlette cancels it when the client
    disconnects; ``finally`` then stops the generation at the next token."""
    ev = _EventWriter()
    text: str | None = None  # the message item's text, once it is open
    try:
        yield ev("response.created", response=shape.body("in_progress", []))
        yield ev("response.in_progress", response=shape.body("in_progress", []))
        while True:
            event = await job.next(None)
            if event.kind == "content" and event.text:
                if text is None:
                    text = ""
                    item = {**shape.message("", "in_progress"), "content": []}
                    yield ev("response.output_item.added", output_index=0, item=item)
                    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                    yield ev(
                        "response.content_part.added",
                        item_id=shape.message_id,
                        output_index=0,
                        content_index=0,
                        part=part,
                    )
                text += event.text
                ids = {"item_id": shape.message_id, "output_index": 0, "content_index": 0}
                yield ev("response.output_text.delta", delta=event.text, logprobs=[], **ids)
            elif event.kind == "done":
                reply: Reply = event.value
                status = reply_status(reply)
                for line in _message_done(shape, text, status, ev) if text is not None else []:
                    yield line
                for line in _calls_done(reply, 0 if text is None else 1, ev):
                    yield line
                final = response_body(reply, shape)
                yield ev("response.completed" if status == "completed" else "response.incomplete", response=final)
                return
    except Exception as exc:
        err = renamed(api_error(exc), origins)
        yield ev("error", code=err.code, message=err.message, param=err.param)
        failed = shape.body("failed", [])
        failed["error"] = {"code": err.code or err.type, "message": err.message}
        yield ev("response.failed", response=failed)
    finally:
        job.cancel("disconnect")


# --- the route ----------------------------------------------------------------------------------


def add_responses_route(app: FastAPI, routes: Routes) -> None:
    """Add ``POST /v1/responses`` to ``app``: a chat turn (:class:`~.engine.ChatTurn`) run through
    the same key check, body limit, queue and deadline as ``/v1/chat/completions``."""

    @app.post("/v1/responses")
    async def create_response(request: Request) -> Response:
        routes.authorize(request)
        req = parse_request(ResponsesRequest, await routes.read(request))
        tr = translate(req)
        try:
            try:
                chat = ChatCompletionRequest.model_validate(tr.chat, strict=True)
            except ValidationError as exc:
                raise validation_error(exc) from None
            turn = ChatTurn(routes.model, chat_job(chat), call_threshold=routes.config.call_threshold)
            job = await routes.start(request, turn.events)
        except APIError as exc:
            raise renamed(exc, tr.origins) from None
        shape = ResponseShape(req, routes.config.model_name)
        if not req.stream:
            try:
                reply: Reply = await routes.result(job, request)
            except APIError as exc:
                raise renamed(exc, tr.origins) from None
            return JSONResponse(response_body(reply, shape))
        return StreamingResponse(
            stream_events(job, shape, tr.origins),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
