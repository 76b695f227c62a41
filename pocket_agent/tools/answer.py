"""The final answer after tool results.

A small model that has the right tool result in front of it still often answers with unrelated
text. So an answer that follows tool results is constrained to *state* them: the turn's grammar
requires each result's facts (:func:`result_facts`: the value itself, or the values of a
structured result that the request does not already say) early in a one-paragraph answer
(:func:`stated_pattern`). Where the latest results are failures, the answer is not generated:
:func:`failure_answer` says plainly which tool failed and why, so nothing is invented.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, TypeAdapter, ValidationError

from ..errors import GenerationError
from ..grammars.grounding import HAN_CHARS

AnswerMode = Literal["stated", "free", "result"]
ANSWER_MODES: tuple[str, ...] = ("stated", "free", "result")

ERROR_PREFIX = "Error: "
MAX_FACT_CHARS = 80  # a longer result is summarised by the model, not copied
MAX_FACTS = 2
LEAD_CHARS = 60  # the answer states the first fact within this many characters
TAIL_CHARS = 60  # what the answer may add after the last fact, up to the end of that sentence
_REGEX_META = set("\\.+*?()|[]{}^$/")
_PLAIN = "[^\\n`{}<>\\[\\]]"  # prose: no code, markup or JSON around the facts
_EDGE = "[^\\n`{}<>\\[\\]A-Za-z0-9_]"  # the character next to a fact: not part of a word or number
_CJK = re.compile(f"[{HAN_CHARS}]")


def trailing_tool_messages(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The tool messages at the end of ``messages`` (the results the next turn answers from)."""
    out: list[Mapping[str, Any]] = []
    for m in reversed(messages):
        if m.get("role") != "tool":
            break
        out.insert(0, m)
    return out


def is_error(content: Any) -> bool:
    """Whether a tool message's content reports a failure, denial or timeout."""
    return isinstance(content, str) and content.startswith(ERROR_PREFIX)


def _scalar_text(value: Any) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.10g}" if math.isfinite(value) else None
    if isinstance(value, str):
        text = " ".join(value.split())
        return text if 0 < len(text) <= MAX_FACT_CHARS else None
    return None


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, Mapping):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


def facts_of(content: str, request: str = "") -> list[str]:
    """What an answer must say of one tool result: the value itself (a number as the tool
    gave it, a short text), or for a structured result up to two of its values that the request
    does not already say. Empty when there is nothing short to state."""
    try:
        value = json.loads(content)
    except ValueError:
        value = content
    if isinstance(value, (Mapping, list)):
        said = request.casefold()
        facts = []
        for leaf in _leaves(value):
            text = _scalar_text(leaf)
            if text is not None and text.casefold() not in said and text not in facts:
                facts.append(text)
        return facts[:MAX_FACTS]
    text = _scalar_text(value)
    return [text] if text is not None else []


def result_facts(messages: Sequence[Mapping[str, Any]], request: str = "") -> list[str]:
    """The facts of the successful results at the end of ``messages``, in call order (at most
    :data:`MAX_FACTS`)."""
    facts: list[str] = []
    for m in trailing_tool_messages(messages):
        content = m.get("content")
        if isinstance(content, str) and not is_error(content):
            facts.extend(f for f in facts_of(content, request) if f not in facts)
    return facts[:MAX_FACTS]


def _regex_literal(text: str) -> str:
    return "".join("\\" + c if c in _REGEX_META else c for c in text)


def stated_pattern(facts: Sequence[str]) -> str:
    """A Lark regex for a one-paragraph answer that states every fact (in any order), each within
    :data:`LEAD_CHARS` characters of the start or the previous one, and ends with the sentence
    of the last one (within :data:`TAIL_CHARS` characters). One
    regex with the orders as alternatives: intersecting one regex per fact made llguidance's
    lexer construct too many expressions."""
    # a fact stands apart from the words around it: "It92.59" or "21805.56" does not state 1805.56
    gap = f"({_PLAIN}{{0,{LEAD_CHARS - 1}}}{_EDGE})?"
    orders = "|".join(gap.join(_regex_literal(f) for f in order) for order in itertools.permutations(facts))
    prose = f"{_PLAIN[:-1]}.!?。！？]"
    tail = f"({_EDGE[:-1]}.!?。！？]{prose}{{0,{TAIL_CHARS - 1}}})?[.!?。！？]?"
    return f"/{gap}({orders}){tail}/"


def failure_answer(messages: Sequence[Mapping[str, Any]], request: str = "") -> str:
    """A plain answer saying which tools failed and why (in Chinese for a Chinese request)."""
    failed = []
    for m in trailing_tool_messages(messages):
        content = m.get("content")
        if is_error(content):
            reason = str(content)[len(ERROR_PREFIX) :].strip()
            failed.append((str(m.get("name") or "the tool"), reason))
    if not failed:
        failed = [("the tool", "no result")]
    if _CJK.search(request):
        parts = "；".join(f"{name} 调用失败（{reason}）" for name, reason in failed)
        return f"抱歉，无法完成：{parts}。"
    parts = "; ".join(f"{name} failed ({reason})" for name, reason in failed)
    return f"Sorry, I could not complete that: {parts}."


def final_value(text: str, output: Any, schema: Mapping[str, Any] | None) -> Any:
    """A final answer's value: the text, or with an ``output`` type the validated object."""
    if schema is None:
        return text.strip()
    data = json.loads(text)
    try:
        if isinstance(output, type) and issubclass(output, BaseModel):
            return output.model_validate(data)
        if output is not None and not isinstance(output, Mapping):
            return TypeAdapter(output).validate_python(data)
    except ValidationError as exc:
        raise GenerationError(f"The final answer does not validate against the output type: {exc}") from exc
    return data
