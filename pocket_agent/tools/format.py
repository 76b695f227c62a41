"""The tool-call format: how tools are shown to the model, the one grammar that constrains
each assistant turn, and how the model's output is read back.

The format is the Qwen / ChatML ("Hermes") convention that MNN-Pocket models are tuned on:

- tools are presented through the chat template's ``tools`` variable when the template has
  one; otherwise a ``# Tools ... <tools>...</tools>`` block with the same wording is
  appended to the system message;
- a call is ``<tool_call>\\n{"name": "...", "arguments": {...}}\\n</tool_call>``; several
  calls in one turn follow each other, separated by a newline;
- results come back as ``tool`` messages (wrapped in ``<tool_response>`` tags when the
  template does not do it itself).

Each assistant turn is constrained by one grammar: either a final answer (free text that
never contains ``<tool_call>``, or JSON for the agent's output schema) or one or more calls
whose ``name`` is a registered tool and whose ``arguments`` match that tool's schema exactly
(closed objects, JSON laid out with ``", "`` and ``": "`` separators and no other
whitespace, exactly as ``json.dumps`` writes it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ..errors import InvalidInputError, ToolArgumentError
from ..grammars.schema import cap_lengths
from ..runtime.prompt import PromptData, render_pieces
from .answer import stated_pattern
from .tool import Tool

if TYPE_CHECKING:
    from ..runtime import ChatTemplate, Model

ToolChoice = Literal["auto", "required", "none"] | str
"""``"auto"``: the model may answer or call tools; ``"required"``: it must call at least one
tool; ``"none"``: it must answer; a tool name: it must call that tool."""

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
RESPONSE_OPEN = "<tool_response>"
RESPONSE_CLOSE = "</tool_response>"
DEFAULT_SYSTEM = "You are a helpful assistant."

JSON_LAYOUT: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""How argument JSON is laid out: the separators ``json.dumps`` uses, no other whitespace."""

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for: a registered tool's ``name`` and its ``arguments``."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str = ""

    def to_json(self) -> str:
        """The call as the model writes it: ``{"name": ..., "arguments": {...}}``."""
        return json.dumps({"name": self.name, "arguments": self.arguments}, ensure_ascii=False)

    def to_message(self) -> dict[str, Any]:
        """The call as an entry of an assistant message's ``tool_calls`` (OpenAI style)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def check_tool_choice(tool_choice: Any, tools: Mapping[str, Tool]) -> str:
    """Validate ``tool_choice`` against the registered tools."""
    if not isinstance(tool_choice, str):
        raise InvalidInputError(f"tool_choice must be 'auto', 'required', 'none' or a tool name, got {tool_choice!r}.")
    if tool_choice in ("auto", "none"):
        return tool_choice
    if tool_choice == "required":
        if not tools:
            raise InvalidInputError("tool_choice='required' needs at least one tool.")
        return tool_choice
    if tool_choice not in tools:
        raise InvalidInputError(
            f"tool_choice={tool_choice!r} is neither 'auto', 'required', 'none' nor a registered tool "
            f"({', '.join(sorted(tools)) or 'no tools'})."
        )
    return tool_choice


# --- grammar ------------------------------------------------------------------------------


def _lark_str(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _marker(model: Model | None, text: str) -> str:
    """A Lark item for a marker: its special token when the vocabulary has one, else the literal."""
    if model is not None:
        data = text.encode("utf-8")
        vocab = model.vocab
        for tid in vocab.special_ids:
            if vocab.token_bytes[tid] == data:
                return f"<[{tid}]>"
    return _lark_str(text)


def _json_rule(schema: Mapping[str, Any]) -> str:
    doc = dict(schema)
    doc["x-guidance"] = {**JSON_LAYOUT, **dict(doc.get("x-guidance") or {})}
    return "%json " + json.dumps(doc, ensure_ascii=False)


def output_schema(output: Any) -> dict[str, Any] | None:
    """The closed JSON Schema for an agent's ``output`` type (``None``/``str`` -> free text)."""
    if output is None or output is str:
        return None
    from ..grammars.schema import close_objects

    if isinstance(output, Mapping):
        return dict(output)
    try:
        from pydantic import BaseModel, TypeAdapter

        if isinstance(output, type) and issubclass(output, BaseModel):
            raw = output.model_json_schema()
        else:
            raw = TypeAdapter(output).json_schema()
    except Exception as exc:  # pydantic's schema-generation errors
        raise InvalidInputError(f"output must be a Pydantic model, a type or a JSON Schema dict: {exc}") from exc
    closed: dict[str, Any] = close_objects(raw)
    return closed


def build_grammar(
    tools: Sequence[Tool],
    *,
    tool_choice: str = "auto",
    output: Any = None,
    max_calls: int | None = None,
    max_string_chars: int | None = None,
    max_array_items: int | None = None,
    model: Model | None = None,
    ground_text: str | None = None,
    ground_numbers: bool = False,
    answer_facts: Sequence[str] = (),
) -> str:
    """The Lark grammar (llguidance dialect) for one assistant turn.

    ``tool_choice`` picks the branches: ``auto`` allows an answer or calls, ``required``
    only calls, ``none`` only an answer, a tool name only calls of that tool. ``output``
    (a Pydantic model, type or JSON Schema) makes the answer JSON of that schema instead of
    free text. ``max_calls`` bounds the calls in one turn (``None``: no bound, 1: no
    parallel calls). ``max_string_chars`` and ``max_array_items`` bound argument strings
    and arrays (see :func:`cap_lengths`): the grammar then closes a string or array that runs
    on, and every call it admits still matches the tool's schema. With ``model``, call markers
    that are special tokens in its vocabulary are matched as those tokens. With
    ``ground_text`` (the user's request), plain string arguments must be verbatim spans of
    it, and with ``ground_numbers`` numbers must be numbers it prints (see
    :mod:`pocket_agent.grammars.grounding`; a tool parameter opts out with
    ``"x-grounded": false``). With ``answer_facts`` a free-text answer is one paragraph that
    states each of them (:func:`~pocket_agent.tools.answer.stated_pattern`).
    """
    by_name = {t.name: t for t in tools}
    choice = check_tool_choice(tool_choice, by_name)
    if choice == "none" or not tools:
        allowed: list[Tool] = []
    elif choice in ("auto", "required"):
        allowed = list(tools)
    else:
        allowed = [by_name[choice]]
    want_answer = choice in ("auto", "none") or not tools
    lines: list[str] = ["%llguidance {}"]
    branches = []
    if want_answer:
        branches.append("answer")
    if allowed:
        branches.append("calls")
    lines.append("start: " + " | ".join(branches))
    if want_answer:
        schema = output_schema(output)
        if schema is None:
            # Free text, non-empty, that never spells a tool call (a call must be a call) nor
            # a tool response tag (a small model answering after results likes to echo them).
            tags = "|".join(re.escape(t).replace("/", "\\/") for t in (CALL_OPEN, RESPONSE_OPEN, RESPONSE_CLOSE))
            lines.append("answer: TEXT")
            first = "[^<]" if tools else "."  # with tools, "<" opens a call, never an answer
            stated = f" & {stated_pattern(answer_facts)}" if answer_facts else ""
            lines.append(f"TEXT: /(?s:{first}.*)/ & ~/(?s:.*({tags}).*)/{stated}")
        else:
            lines.append("answer: " + _json_rule(schema))
    if allowed:
        if max_calls is None:
            lines.append('calls: call ("\\n" call)*')
        elif max_calls <= 1:
            lines.append("calls: call")
        else:
            lines.append(f'calls: call ("\\n" call){{0,{max_calls - 1}}}')
        open_m, close_m = _marker(model, CALL_OPEN), _marker(model, CALL_CLOSE)
        alts = " | ".join(f"fn_{i}" for i in range(len(allowed)))
        lines.append(f'call: {open_m} "\\n" ({alts}) "\\n" {close_m}')
        for i, t in enumerate(allowed):
            head = '{"name": ' + json.dumps(t.name, ensure_ascii=False) + ', "arguments": '
            lines.append(f'fn_{i}: {_lark_str(head)} args_{i} "}}"')
            params = t.parameters
            if max_string_chars is not None or max_array_items is not None:
                params = cap_lengths(params, max_chars=max_string_chars, max_items=max_array_items)
            grounded = None
            if ground_text:
                from ..grammars.grounding import Layout, grounded_rules

                layout = Layout(JSON_LAYOUT["item_separator"], JSON_LAYOUT["key_separator"])
                grounded = grounded_rules(params, ground_text, prefix=f"a{i}", numbers=ground_numbers, layout=layout)
            if grounded is None:
                lines.append(f"args_{i}: {_json_rule(params)}")
            else:
                lines.append(f"args_{i}: {grounded[0]}")
                lines.extend(grounded[1])
    return "\n".join(lines) + "\n"


# --- reading the model's output -----------------------------------------------------------


@dataclass(frozen=True)
class ParsedTurn:
    """An assistant turn read back: the calls it makes, or its final answer text."""

    calls: list[ToolCall]
    text: str

    @property
    def is_final(self) -> bool:
        """True when the turn is an answer, not calls."""
        return not self.calls


def parse_turn(text: str, tools: Mapping[str, Tool] | None = None, *, call_id_prefix: str = "call_") -> ParsedTurn:
    """Split an assistant turn into tool calls, or return it as a final answer.

    A turn that starts with ``<tool_call>`` must consist of well-formed calls only;
    anything else raises :class:`ToolArgumentError`. With ``tools`` each call's name must be
    registered and its arguments must match the tool's schema.
    """
    body = text.strip()
    if not body.startswith(CALL_OPEN):
        return ParsedTurn(calls=[], text=text)
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    pos = 0
    while pos < len(body):
        if not body.startswith(CALL_OPEN, pos):
            raise ToolArgumentError(f"Expected {CALL_OPEN} at offset {pos} of the model output: {body[pos:][:80]!r}")
        pos += len(CALL_OPEN)
        while pos < len(body) and body[pos] in " \t\r\n":
            pos += 1
        try:
            obj, end = decoder.raw_decode(body, pos)
        except json.JSONDecodeError as exc:
            raise ToolArgumentError(f"A tool call is not valid JSON: {exc}") from None
        pos = end
        while pos < len(body) and body[pos] in " \t\r\n":
            pos += 1
        if not body.startswith(CALL_CLOSE, pos):
            raise ToolArgumentError(f"A tool call is not closed with {CALL_CLOSE}.")
        pos += len(CALL_CLOSE)
        while pos < len(body) and body[pos] in " \t\r\n":
            pos += 1
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise ToolArgumentError(f"A tool call must be an object with a 'name' string, got {obj!r}.")
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models double-encode the arguments
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                raise ToolArgumentError(f"Arguments of {obj['name']!r} are not a JSON object.") from None
        if not isinstance(args, dict):
            raise ToolArgumentError(f"Arguments of {obj['name']!r} must be a JSON object, got {args!r}.")
        calls.append(ToolCall(name=obj["name"], arguments=args, id=f"{call_id_prefix}{len(calls)}"))
    if tools is not None:
        for c in calls:
            t = tools.get(c.name)
            if t is None:
                raise ToolArgumentError(f"The model called {c.name!r}, which is not a registered tool.")
            t.check_arguments(c.arguments)
    return ParsedTurn(calls=calls, text="")


# --- prompts --------------------------------------------------------------------------------


def tools_system_block(specs: Sequence[Mapping[str, Any]], data: PromptData) -> str:
    """The Qwen-style tools block for templates that have no ``tools`` variable (the specs as data)."""
    body = "".join("\n" + data.slot(json.dumps(s, ensure_ascii=False)) for s in specs)
    return TOOLS_PREAMBLE + body + TOOLS_POSTAMBLE


def _calls_text(calls: Sequence[Mapping[str, Any]], data: PromptData) -> str:
    """Tool calls written out in the call format: the markers are template text, the call
    JSON is data (a call read back from a client's history may hold anything)."""
    parts = []
    for c in calls:
        fn = c.get("function", c)
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        body = json.dumps({"name": fn.get("name"), "arguments": args}, ensure_ascii=False)
        parts.append(f"{CALL_OPEN}\n{data.slot(body)}\n{CALL_CLOSE}")
    return "\n".join(parts)


def render_messages(
    model: Model,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Tool],
    *,
    instructions: str | None = None,
    show_tools: bool = True,
    template: ChatTemplate | None = None,
) -> list[tuple[str, bool]]:
    """Render a tool conversation with the model's chat template.

    Returns the prompt as ``(text, is_data)`` pieces (see
    :func:`pocket_agent.runtime.prompt.render_pieces`): message contents, tool results,
    call arguments and tool specs are data, tokenized as plain text, so none of them can
    inject control tokens. ``template`` overrides the model's own chat template.
    """
    template = template or model.chat_template
    data = PromptData()
    specs = [t.to_openai() for t in tools] if show_tools else []
    msgs: list[dict[str, Any]] = [dict(m) for m in messages]
    system_parts = []
    if instructions:
        system_parts.append(instructions)
    if msgs and msgs[0].get("role") == "system":
        first = msgs.pop(0)
        if first.get("content"):
            system_parts.append(str(first["content"]))
    native = template.supports_tools
    for m in msgs:
        content = m.get("content")
        if m.get("role") == "tool":
            text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
            if not native:
                m["content"] = f"{RESPONSE_OPEN}\n{data.slot(text)}\n{RESPONSE_CLOSE}"
            else:
                m["content"] = text
        elif m.get("role") == "assistant" and m.get("tool_calls") and not native:
            calls = _calls_text(m["tool_calls"], data)
            m["content"] = (data.slot(content) + "\n" + calls) if isinstance(content, str) and content else calls
            del m["tool_calls"]
        if m.get("content") is None:
            m["content"] = ""
    if native:
        if system_parts:
            msgs.insert(0, {"role": "system", "content": "\n\n".join(system_parts)})
        return render_pieces(template, msgs, tools=specs or None, data=data)
    system = data.slot("\n\n".join(system_parts) if system_parts else DEFAULT_SYSTEM)
    if specs:
        system = system + "\n\n" + tools_system_block(specs, data)
    msgs.insert(0, {"role": "system", "content": system})
    try:
        return render_pieces(template, msgs, data=data)
    except InvalidInputError:
        # Templates that only know user/assistant: results go back as user turns.
        for m in msgs:
            if m.get("role") == "tool":
                m["role"] = "user"
        return render_pieces(template, msgs, data=data)


def as_messages(task_or_messages: str | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A task (the user's request) or a conversation as a checked list of OpenAI-style messages."""
    if isinstance(task_or_messages, str):
        if not task_or_messages.strip():
            raise InvalidInputError("The task is empty; say what the agent should do.")
        return [{"role": "user", "content": task_or_messages}]
    if isinstance(task_or_messages, Sequence) and not isinstance(task_or_messages, bytes):
        msgs: list[dict[str, Any]] = []
        for i, m in enumerate(task_or_messages):
            if not isinstance(m, Mapping):
                raise InvalidInputError(f"messages[{i}] must be a dict with 'role' and 'content'.")
            msgs.append(dict(m))
        if not msgs:
            raise InvalidInputError("messages is empty; give at least one message.")
        for i, m in enumerate(msgs):
            if not isinstance(m.get("role"), str):
                raise InvalidInputError(f"messages[{i}] needs a 'role'.")
        return msgs
    raise InvalidInputError(f"task must be a string or a list of messages, got {type(task_or_messages).__name__}.")
