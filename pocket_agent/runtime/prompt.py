"""Chat prompts to token ids, with control tokens only from the template.

A chat template mixes the template's own text (``<|im_start|>user\\n`` ...), where special
tokens must be parsed into control tokens, with content from users, documents, options, tool
specs and tool results, which is data: a document that contains ``<|im_end|>`` must stay
those characters, never end the turn. :func:`encode_chat` renders the template with each
piece of content replaced by a placeholder, then tokenizes the template's text with special
tokens parsed and every piece of content as plain text.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import InvalidInputError

if TYPE_CHECKING:
    from .base import Model
    from .chat_template import ChatTemplate


class PromptData:
    """Content slots for one rendering: each slot is a placeholder string in the template's
    output that stands for one piece of content (tokenized later as plain text).

    The placeholders carry a random nonce, so content can never forge one.
    """

    def __init__(self) -> None:
        self._nonce = secrets.token_hex(6)
        self._pattern = re.compile("\ue000" + self._nonce + r":(\d+)\ue001")
        self._items: list[str] = []

    def slot(self, text: str) -> str:
        """A placeholder for ``text`` (tokenized as plain text)."""
        self._items.append(text)
        return f"\ue000{self._nonce}:{len(self._items) - 1}\ue001"

    def json_slot(self, text: str) -> str:
        """A placeholder for ``text`` inside a JSON string literal: it becomes the JSON-escaped text."""
        return self.slot(json.dumps(text, ensure_ascii=False)[1:-1])

    def holds_slots(self, text: str) -> bool:
        """Whether ``text`` was built with this object's placeholders."""
        return self._pattern.search(text) is not None

    def pieces(self, rendered: str) -> list[tuple[str, bool]]:
        """``rendered`` cut into ``(text, is_data)`` pieces, placeholders replaced by their content."""
        out: list[tuple[str, bool]] = []
        pos = 0
        for m in self._pattern.finditer(rendered):
            if m.start() > pos:
                out.append((rendered[pos : m.start()], False))
            out.append((self._items[int(m.group(1))], True))
            pos = m.end()
        if pos < len(rendered):
            out.append((rendered[pos:], False))
        return out


def _data_messages(messages: Sequence[Mapping[str, Any]], data: PromptData) -> list[dict[str, Any]]:
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message:
            raise InvalidInputError(f"messages[{i}] must be a dict with a 'role' key, got {message!r}.")
        m = dict(message)
        content = m.get("content")
        if isinstance(content, str) and content and not data.holds_slots(content):
            m["content"] = data.slot(content)
        calls = m.get("tool_calls")
        if isinstance(calls, Sequence) and not isinstance(calls, str):
            m["tool_calls"] = [_data_call(c, data) for c in calls]
        out.append(m)
    return out


def _data_call(call: Any, data: PromptData) -> Any:
    if not isinstance(call, Mapping):
        return call
    c = dict(call)
    fn = c.get("function")
    target = dict(fn) if isinstance(fn, Mapping) else c
    name = target.get("name")
    if isinstance(name, str):
        target["name"] = data.slot(name)
    args = target.get("arguments")
    if args is not None and not (isinstance(args, str) and data.holds_slots(args)):
        text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        target["arguments"] = data.slot(text)
    if isinstance(fn, Mapping):
        c["function"] = target
    return c


def _data_json(value: Any, data: PromptData) -> Any:
    """Every string inside a JSON value (keys included) as a JSON-escaped slot."""
    if isinstance(value, str):
        return data.json_slot(value)
    if isinstance(value, Mapping):
        return {data.json_slot(str(k)): _data_json(v, data) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_data_json(v, data) for v in value]
    return value


def render_pieces(
    template: ChatTemplate,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
    data: PromptData | None = None,
) -> list[tuple[str, bool]]:
    """Render ``messages`` and cut the result into ``(text, is_data)`` pieces.

    Message contents, tool-call names and arguments, and every string of the tool specs
    become data pieces. A content string built with ``data``'s own placeholders (how a
    caller mixes template markup into a message) is kept as it is.
    """
    data = data or PromptData()
    msgs = _data_messages(messages, data)
    specs = [_data_json(dict(t), data) for t in tools] if tools else None
    rendered = template.render(msgs, add_generation_prompt=add_generation_prompt, tools=specs)
    return data.pieces(rendered)


def encode_pieces(model: Model, pieces: Sequence[tuple[str, bool]], *, add_bos: bool = True) -> list[int]:
    """Token ids of rendered pieces: template text with special tokens parsed, data as plain
    text; a BOS first when the model wants one."""
    ids: list[int] = []
    for text, is_data in pieces:
        if text:
            ids.extend(model.tokenize(text, special=not is_data))
    vocab = model.vocab
    if add_bos and vocab.add_bos and vocab.bos_id is not None and (not ids or ids[0] != vocab.bos_id):
        ids = [vocab.bos_id, *ids]
    return ids


def encode_chat(
    model: Model,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
    template: ChatTemplate | None = None,
    data: PromptData | None = None,
) -> list[int]:
    """Token ids of a chat prompt whose control tokens all come from the template.

    ``template`` overrides the model's own chat template.
    """
    pieces = render_pieces(
        template or model.chat_template,
        messages,
        add_generation_prompt=add_generation_prompt,
        tools=tools,
        data=data,
    )
    return encode_pieces(model, pieces)


__all__ = ["PromptData", "encode_chat", "encode_pieces", "render_pieces"]
