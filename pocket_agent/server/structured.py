"""Structured output through the chat API is extraction.

A client that asks for a JSON object of a schema (``response_format`` with a ``json_schema``,
strict or not) or forces a single tool call (a named ``tool_choice``, or ``"required"`` with one
tool: what instructor's TOOLS mode, pydantic-ai's default output and langchain's
``function_calling`` send) wants the values of its schema from the user's message. So the last
user message is the document, the system messages are the instructions, and the object is what
:func:`pocket_agent.extract` gives for them on the same model: grounded values, nulls where the
text says nothing, only the declared properties even where the schema leaves objects open.
The object arrives whole, in one piece, when it is complete: its values are chosen after
decoding (numbers, spans, nulls), so the text decoded token by token is not yet the answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import OutputBudgetExceeded
from ..extraction import build_messages, extract_stream
from ..generate import render_prompt
from ..runtime import Model
from .protocol import CallOut, ChatJob, Reply, new_id


@dataclass(frozen=True)
class StructuredRoute:
    """What a request asks for: an object of ``schema`` from ``document``, as the answer's content
    (``tool`` None) or as the arguments of one call to ``tool``."""

    schema: dict[str, Any]
    document: str
    instructions: str | None
    tool: str | None = None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def _is_object_schema(schema: Any) -> bool:
    return isinstance(schema, Mapping) and isinstance(schema.get("properties"), Mapping) and bool(schema["properties"])


def structured_route(job: ChatJob) -> StructuredRoute | None:
    """The extraction a chat request asks for, or ``None`` when it is a conversation turn."""
    users = [m for m in job.messages if m.get("role") == "user" and _text(m.get("content")).strip()]
    if not users:
        return None
    document = _text(users[-1].get("content"))
    system = [_text(m.get("content")) for m in job.messages if m.get("role") in ("system", "developer")]
    instructions = "\n\n".join(s for s in system if s.strip()) or None
    if job.tools and job.tool_choice != "none":
        names = [t["function"]["name"] for t in job.tools]
        forced = job.tool_choice if job.tool_choice in names else None
        if forced is None and job.tool_choice == "required" and len(names) == 1:
            forced = names[0]
        if forced is None:
            return None
        params = next(t["function"].get("parameters") for t in job.tools if t["function"]["name"] == forced)
        if not _is_object_schema(params):
            return None
        return StructuredRoute(dict(params), document, instructions, tool=forced)
    if _is_object_schema(job.response_schema):
        return StructuredRoute(dict(job.response_schema), document, instructions)  # type: ignore[arg-type]
    return None


def structured_reply(
    model: Model, route: StructuredRoute, max_tokens: int | None, check: Callable[[], None] = lambda: None
) -> Reply:
    """Run the extraction and shape it as the chat reply the request asked for; ``check`` runs
    each time a field completes (a client that went away stops the work there)."""
    messages = build_messages(route.document, route.schema, instructions=route.instructions)
    prompt_tokens = len(render_prompt(model, messages))
    stream = extract_stream(
        route.document, route.schema, model=model, instructions=route.instructions, max_tokens=max_tokens
    )
    value: Any = None
    try:
        for value in stream:  # noqa: B007 - partial dicts as fields complete, then the validated object
            check()
    except OutputBudgetExceeded as exc:
        return Reply(exc.partial if route.tool is None else None, [], "length", prompt_tokens, exc.tokens)
    finally:
        stream.close()  # type: ignore[attr-defined]
    text = json.dumps(value, ensure_ascii=False)
    completion_tokens = len(model.tokenize(text))
    if route.tool is None:
        return Reply(text, [], "stop", prompt_tokens, completion_tokens)
    call = CallOut(id=new_id("call_"), name=route.tool, arguments=text)
    return Reply(None, [call], "tool_calls", prompt_tokens, completion_tokens)
