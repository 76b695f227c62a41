"""Train a tools adapter: a LoRA that teaches the model when and how to call tools.

Every example is a conversation, the tools it offers and the assistant turn that should
follow: tool calls or a final answer. The prompt is exactly the one an
:class:`~pocket_agent.tools.Agent` over those tools evaluates (``Agent.prompt_ids``), and
the answer is the turn as the agent's turn grammar writes it: each call as
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (``json.dumps`` layout,
arguments in the order of the tool's schema, as the grammar enforces), calls separated by
a newline. Unlike an extraction object, whose grammar ends by itself at the closing brace,
a turn ends when the model writes an end-of-turn token (the grammar would take another call
or more text), so the answer ends with the token the chat template closes an assistant turn
with: the adapter also learns how many calls to make and where an answer stops.

The GGUF LoRA it writes is applied with ``model.load_lora(path)``; every agent on that model
then uses it (grammars and routing unchanged).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import InvalidInputError, SchemaError, ToolArgumentError
from ..runtime import Model, resolve_model
from ..runtime.prompt import encode_chat, encode_pieces
from ..tools.agent import Agent
from ..tools.format import CALL_CLOSE, CALL_OPEN, RESPONSE_CLOSE, RESPONSE_OPEN, ToolCall
from ..tools.tool import Tool
from ._progress import Progress
from ._sft import SftExample, SftTraining
from .extract import AdapterResult, train_lora_adapter

Turn = list[ToolCall] | str
"""An assistant turn: the calls it makes, or its final answer text."""


def tool_examples(
    model: Model,
    rows: Iterable[Mapping[str, Any]],
    *,
    instructions: str | None = None,
) -> list[SftExample]:
    """Token ids of ``{messages, tools, output}`` rows: the agent's prompt and the turn it should write.

    ``messages`` are OpenAI-style chat messages (the last one from the user or a tool);
    ``tools`` are OpenAI-style specs (``{"type": "function", "function": {...}}`` or the inner
    ``{"name", "description", "parameters"}``); ``output`` is ``{"tool_calls": [{"name": ...,
    "arguments": {...}}, ...]}`` or ``{"content": "final answer"}``. ``instructions`` are the
    agent's system instructions. Raises :class:`InvalidInputError` naming the row and what is
    wrong with it.
    """
    end = end_of_turn_id(model)
    out = []
    for i, row in enumerate(rows):
        agent, messages, turn = _read_row(model, row, i, instructions)
        prompt = agent.prompt_ids(messages)
        answer = turn_ids(model, turn) + ([end] if end is not None else [])
        out.append(SftExample(prompt=prompt, answer=answer))
    return out


def train_tools_adapter(
    rows: Iterable[Mapping[str, Any]],
    model: Model | str | os.PathLike[str] | None = None,
    *,
    training: SftTraining | None = None,
    instructions: str | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    resume: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
    metadata: Mapping[str, object] | None = None,
) -> AdapterResult:
    """Train a LoRA that makes an :class:`~pocket_agent.tools.Agent` on ``model`` write the right turns.

    ``rows`` are ``{"messages", "tools", "output"}`` examples (see :func:`tool_examples`);
    ``instructions`` the agent's instructions the adapter is trained under (default none);
    ``checkpoint`` is the Hugging Face folder of the same weights (default: the GGUF converted
    once into the cache); ``resume`` is a folder the training state is saved in after every
    validation check and resumed from by a later call with the same data and settings.
    Returns an :class:`AdapterResult` (task ``"tools"``); ``result.save("tools.gguf")`` writes
    the LoRA and ``model.load_lora("tools.gguf")`` applies it.
    """
    t0 = time.perf_counter()
    training = training or SftTraining()
    m = resolve_model(model)
    data = list(rows)
    sft = tool_examples(m, data, instructions=instructions)
    return train_lora_adapter(
        m,
        sft,
        "tools",
        _details(data),
        training=training,
        checkpoint=checkpoint,
        resume=resume,
        progress=progress,
        metadata=metadata,
        started=t0,
    )


def turn_text(turn: Turn) -> str:
    """The text of an assistant turn as the agent's turn grammar writes it (end token excluded)."""
    if isinstance(turn, str):
        return turn
    return "\n".join(f"{CALL_OPEN}\n{call.to_json()}\n{CALL_CLOSE}" for call in turn)


def turn_ids(model: Model, turn: Turn) -> list[int]:
    """Token ids of :func:`turn_text`: call markers as the model's special tokens when its
    vocabulary has them (as the grammar matches them), everything else as plain text."""
    if isinstance(turn, str):
        return model.tokenize(turn)
    pieces: list[tuple[str, bool]] = []
    for n, call in enumerate(turn):
        if n:
            pieces.append(("\n", True))
        pieces += [(CALL_OPEN, False), (f"\n{call.to_json()}\n", True), (CALL_CLOSE, False)]
    return encode_pieces(model, pieces, add_bos=False)


def end_of_turn_id(model: Model) -> int | None:
    """The end-of-generation token the chat template closes an assistant turn with
    (``<|im_end|>`` for ChatML), else the model's first one; None if it has none."""
    eos = model.vocab.eos_ids
    if not eos:
        return None
    user = [{"role": "user", "content": "Hi"}]
    try:
        prompt = encode_chat(model, user)
        full = encode_chat(model, [*user, {"role": "assistant", "content": "Hello"}], add_generation_prompt=False)
    except InvalidInputError:
        return eos[0]
    if full[: len(prompt)] == prompt:
        for tid in full[len(prompt) :]:
            if tid in eos:
                return tid
    return eos[0]


# --- reading rows ---------------------------------------------------------------------------


def _read_row(
    model: Model, row: Mapping[str, Any], i: int, instructions: str | None
) -> tuple[Agent[Any], list[dict[str, Any]], Turn]:
    """The agent, messages and expected turn of ``examples[i]``, checked."""
    where = f"examples[{i}]"
    if not isinstance(row, Mapping):
        raise InvalidInputError(f"{where} must be {{'messages': [...], 'tools': [...], 'output': {{...}}}}.")
    messages = _messages(row.get("messages"), where)
    tools = _tools(row.get("tools"), where)
    try:
        agent = Agent(tools=tools, model=model, instructions=instructions)
    except InvalidInputError as exc:
        raise InvalidInputError(f"{where}.tools: {exc}") from exc
    turn = _turn(row.get("output"), agent, where)
    return agent, messages, turn


def _messages(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)) or not value:
        raise InvalidInputError(f"{where} has no messages: give 'messages', a non-empty list of chat messages.")
    out = []
    for j, m in enumerate(value):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise InvalidInputError(f"{where}.messages[{j}] must be a dict with a 'role' and a 'content'.")
        out.append(dict(m))
    if out[-1]["role"] not in ("user", "tool"):
        raise InvalidInputError(
            f"{where}.messages must end with a user or tool message (the turn to learn comes next), "
            f"not {out[-1]['role']!r}."
        )
    return out


def _tools(value: Any, where: str) -> list[Tool]:
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)) or not value:
        raise InvalidInputError(f"{where} has no tools: give 'tools', a non-empty list of OpenAI-style tool specs.")
    out = []
    for j, spec in enumerate(value):
        if not isinstance(spec, Mapping):
            raise InvalidInputError(f"{where}.tools[{j}] must be a tool spec dict.")
        try:
            out.append(Tool.from_openai(spec))
        except (InvalidInputError, SchemaError) as exc:
            raise InvalidInputError(f"{where}.tools[{j}]: {exc}") from exc
    return out


def _turn(output: Any, agent: Agent[Any], where: str) -> Turn:
    if not isinstance(output, Mapping) or ("tool_calls" in output) == ("content" in output):
        raise InvalidInputError(
            f"{where}.output must be {{'tool_calls': [{{'name': ..., 'arguments': {{...}}}}]}} "
            "or {'content': 'final answer'}."
        )
    if "content" in output:
        return _answer(output["content"], where)
    calls = output["tool_calls"]
    if not isinstance(calls, Sequence) or isinstance(calls, (str, bytes)) or not calls:
        raise InvalidInputError(f"{where}.output.tool_calls must be a non-empty list of calls.")
    if len(calls) > agent.max_parallel_calls:
        raise InvalidInputError(
            f"{where}.output has {len(calls)} calls; an agent turn makes at most {agent.max_parallel_calls}."
        )
    return [_call(c, agent.tools, f"{where}.output.tool_calls[{j}]") for j, c in enumerate(calls)]


def _answer(content: Any, where: str) -> str:
    if not isinstance(content, str) or not content.strip():
        raise InvalidInputError(f"{where}.output.content must be a non-empty string.")
    if content.startswith("<") or any(tag in content for tag in (CALL_OPEN, RESPONSE_OPEN, RESPONSE_CLOSE)):
        raise InvalidInputError(
            f"{where}.output.content cannot start with '<' nor contain {CALL_OPEN}, {RESPONSE_OPEN} or "
            f"{RESPONSE_CLOSE}: the agent's answer grammar never writes them."
        )
    return content


def _call(entry: Any, tools: Mapping[str, Tool], where: str) -> ToolCall:
    fn = entry.get("function", entry) if isinstance(entry, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise InvalidInputError(f"{where} must be {{'name': tool name, 'arguments': {{...}}}}.")
    name = fn["name"]
    tool = tools.get(name)
    if tool is None:
        raise InvalidInputError(f"{where} calls {name!r}, which is not one of the row's tools ({', '.join(tools)}).")
    args = fn.get("arguments", {})
    if isinstance(args, str):  # OpenAI messages carry the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass
    if not isinstance(args, Mapping):
        raise InvalidInputError(f"{where}: the arguments of {name!r} must be an object, got {args!r}.")
    try:
        tool.check_arguments(args)
    except (ToolArgumentError, SchemaError) as exc:
        raise InvalidInputError(f"{where}: {exc}") from exc
    return ToolCall(name=name, arguments=in_schema_order(dict(args), tool.parameters))


def in_schema_order(value: Any, schema: Mapping[str, Any]) -> Any:
    """``value`` with object keys in the order of the schema's ``properties`` (the order the
    JSON grammar writes them in), recursively through properties and array items."""
    if isinstance(value, dict):
        props = schema.get("properties")
        if not isinstance(props, Mapping):
            return value
        known = [k for k in props if k in value]
        ordered = {k: in_schema_order(value[k], props[k]) if isinstance(props[k], Mapping) else value[k] for k in known}
        return {**ordered, **{k: v for k, v in value.items() if k not in ordered}}
    items = schema.get("items")
    if isinstance(value, list) and isinstance(items, Mapping):
        return [in_schema_order(v, items) for v in value]
    return value


def _details(rows: list[Mapping[str, Any]]) -> dict[str, object]:
    """What the tools adapter's metadata records about its data."""
    names: set[str] = set()
    calls = 0
    for row in rows:
        for spec in row["tools"]:
            names.add(str((spec["function"] if spec.get("type") == "function" else spec)["name"]))
        calls += "tool_calls" in row["output"]
    return {
        "examples": len(rows),
        "call_examples": calls,
        "answer_examples": len(rows) - calls,
        "tool_names": len(names),
    }


__all__ = [
    "end_of_turn_id",
    "in_schema_order",
    "tool_examples",
    "train_tools_adapter",
    "turn_ids",
    "turn_text",
]
