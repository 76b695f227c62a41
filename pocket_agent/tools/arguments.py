"""Argument grounding after a turn of calls is written: each grounded string argument and each
number argument is set to the value of the request that the model scores highest as a whole
value (the grammar only guarantees that it is *a* span or printed number of the request, and a
small model stops a span early or drops a number's sign).

The value choices themselves are :mod:`pocket_agent.grounding`'s, shared with extraction.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from ..grammars.grounding import is_grounded
from ..grounding import choose_numbers, choose_spans, cjk_words, comma_names, json_members, value_extensions
from .format import CALL_CLOSE, CALL_OPEN
from .tool import Tool

if TYPE_CHECKING:
    from ..runtime import Model


def ground_arguments(
    model: Model, tools: Mapping[str, Tool], ids: list[int], tokens: list[int], text: str, request: str
) -> str:
    """``text`` (a turn of calls generated after the prompt ``ids`` as ``tokens``) with its
    arguments' spans and numbers chosen as whole values of ``request`` (the user's message)."""
    text = choose_argument_spans(model, tools, ids, tokens, text, request)
    return choose_argument_numbers(model, tools, ids, tokens, text, request)


def choose_argument_spans(
    model: Model, tools: Mapping[str, Tool], ids: list[int], tokens: list[int], text: str, request: str
) -> str:
    """``text`` with each grounded string argument that stops at a comma before a name of the
    request, starts after one (:func:`~pocket_agent.grounding.comma_names`), or stops inside an
    expression or brackets (:func:`~pocket_agent.grounding.value_extensions`) set to the whole
    value: the expression it is part of, or among the names the span the model scores highest
    as a whole value (:func:`~pocket_agent.grounding.choose_spans`). The model writes ``1250``
    for ``Compute 1250 / 4`` and ``Riga`` for ``Riga, Latvia``. The chosen value is always a
    span of the request."""
    edits: list[tuple[int, int, str, list[str]]] = []  # value span in text, value, longer options
    for tool, base, end in call_arguments(text, tools):
        props = tool.parameters.get("properties") or {}
        members = list(json_members(text[base:end]))
        for key, value, a, b in members:
            node = props.get(key)
            if not isinstance(value, str) or not isinstance(node, Mapping) or not is_grounded(node):
                continue
            limit = node.get("maxLength")
            apart = without_other_values(value, [v for k, v, _, _ in members if k != key])
            if apart != value:  # one printed word fills one argument: "12 EUR" is amount 12 and "EUR"
                edits.append((base + a, base + b, value, [apart, value]))
                continue
            fits = [o for o in value_extensions(value, request) if not isinstance(limit, int) or len(o) <= limit]
            # a value cut inside an expression or brackets is never a whole value: no choice to score
            others = comma_names(value, request) + cjk_words(value, request)
            options = fits or [o for o in others if not isinstance(limit, int) or len(o) <= limit]
            if options:
                edits.append((base + a, base + b, value, options if not fits else [*fits[:1], value]))
    for start, end, value, options in reversed(edits):  # right to left: earlier spans stay valid
        if options[-1] == value:
            chosen = options[0]
        else:
            chosen, _ = choose_spans(model, prefix_ids(model, ids, tokens, text[: start + 1]), value, options)
        if chosen != value:
            text = text[:start] + json.dumps(chosen, ensure_ascii=False) + text[end:]
    return text


def without_other_values(value: str, others: list[object]) -> str:
    """``value`` without a leading or trailing word that is another argument's value of the same
    call (a number equal to a number argument, or a string argument's whole text): the request's
    words fill one argument each. Unchanged when nothing would be left."""
    words = value.split(" ")
    numbers = {float(o) for o in others if isinstance(o, int | float) and not isinstance(o, bool)}
    texts = {o for o in others if isinstance(o, str) and o}

    def taken(word: str) -> bool:
        if word in texts:
            return True
        try:
            return float(word.replace(",", "")) in numbers
        except ValueError:
            return False

    while len(words) > 1 and taken(words[0]):
        words = words[1:]
    while len(words) > 1 and taken(words[-1]):
        words = words[:-1]
    return " ".join(words)


def choose_argument_numbers(
    model: Model, tools: Mapping[str, Tool], ids: list[int], tokens: list[int], text: str, request: str
) -> str:
    """``text`` with each number argument the model cut short or wrote without its sign (``200``
    for "$200,000", ``2`` for "x = -2") set to the printed number it completes that scores
    highest as the whole value (:func:`~pocket_agent.grounding.choose_numbers`). Other numbers
    the request does not print are kept: a call may rightly hold a constant the model knows."""
    for tool, base, end in reversed(list(call_arguments(text, tools))):  # right to left
        raw = text[base:end]
        prompt = prefix_ids(model, ids, tokens, text[:base])
        chosen, _ = choose_numbers(model, prompt, raw, tool.parameters, request, units=True, completions=True)
        if chosen != raw:
            text = text[:base] + chosen + text[end:]
    return text


def call_arguments(text: str, tools: Mapping[str, Tool]) -> Iterator[tuple[Tool, int, int]]:
    """For each call in ``text`` (a turn of calls) to a registered tool whose arguments are an
    object: the tool and where its arguments' JSON starts and ends in ``text``."""
    pos = 0
    while (open_at := text.find(CALL_OPEN, pos)) >= 0 and (close_at := text.find(CALL_CLOSE, open_at)) >= 0:
        body = open_at + len(CALL_OPEN)
        members = {key: (value, a, b) for key, value, a, b in json_members(text[body:close_at])}
        name, args = members.get("name"), members.get("arguments")
        tool = tools.get(name[0]) if name is not None and isinstance(name[0], str) else None
        if tool is not None and args is not None and isinstance(args[0], dict):
            yield tool, body + args[1], body + args[2]
        pos = close_at + len(CALL_CLOSE)


def prefix_ids(model: Model, ids: list[int], tokens: list[int], prefix: str) -> list[int]:
    """The prompt ``ids`` and the output tokens that spell ``prefix`` (the rest of it tokenized)."""
    k, done = 0, ""
    while k < len(tokens):
        longer = model.decode(tokens[: k + 1])
        if not prefix.startswith(longer):
            break
        k, done = k + 1, longer
    rest = prefix[len(done) :]
    return [*ids, *tokens[:k], *(model.tokenize(rest) if rest else [])]
