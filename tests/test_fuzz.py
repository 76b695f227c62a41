"""Random and hostile input at every public entry point, on the tiny fixture model.

Each call must return a valid result or raise a ``pocket_agent`` error: never another
exception, never a dead interpreter. The number of inputs tried is printed and checked.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import hypothesis.strategies as st
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from pydantic import BaseModel, Field

from pocket_agent import (
    Agent,
    Choice,
    Limits,
    Regex,
    Sampling,
    ToolCall,
    decide,
    decide_many,
    extract,
    extract_many,
    extract_stream,
    generate,
    tool,
)
from pocket_agent.errors import PocketAgentError
from pocket_agent.runtime import Model

TRIED: Counter[str] = Counter()
SMALL = Limits(max_tokens=12, max_string_chars=12, max_steps=2)
# The suite draws the same inputs on every run, so a commit passes or fails on its own merits;
# POCKET_AGENT_FUZZ=N draws N fresh random inputs per test instead (how new bugs are found).
_EXPLORE = int(os.environ.get("POCKET_AGENT_FUZZ", "0") or 0)
FUZZ = settings(
    max_examples=_EXPLORE or 80,
    derandomize=not _EXPLORE,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

CONTROL = ["<|im_end|>", "<|im_start|>system\n", "<|endoftext|>", "<tool_call>", "</tool_call>", "\x00", "\ufffd"]
hostile_text = st.one_of(
    st.text(max_size=200),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=60),
    st.lists(st.sampled_from([*CONTROL, "a", " ", "\n", "{", '"', "9.00"]), max_size=30).map("".join),
    st.just(""),
    st.just("   \n\t "),
    st.integers(min_value=1, max_value=3).map(lambda k: "word " * (2000 * k)),  # larger than the context
)
junk = st.one_of(
    st.none(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.binary(max_size=20),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.booleans(),
)
any_text = st.one_of(hostile_text, junk)


def json_schemas() -> st.SearchStrategy[Any]:
    leaf = st.one_of(
        st.fixed_dictionaries({"type": st.sampled_from(["string", "number", "integer", "boolean", "null", "nope"])}),
        st.fixed_dictionaries({"enum": st.lists(st.one_of(st.text(max_size=5), st.integers()), max_size=3)}),
        st.fixed_dictionaries({"type": st.just("string"), "pattern": st.sampled_from(["^[a-z]+$", "(", "\\d{2}"])}),
        st.fixed_dictionaries(
            {"type": st.just("number"), "minimum": st.floats(allow_nan=True), "maximum": st.floats(allow_nan=True)}
        ),
        st.just({"$ref": "#/$defs/missing"}),
        st.just({"not": {"type": "string"}}),
        st.just(True),
    )
    schema = st.recursive(
        leaf,
        lambda inner: st.one_of(
            st.fixed_dictionaries(
                {"type": st.just("object"), "properties": st.dictionaries(st.text(max_size=6), inner, max_size=3)}
            ),
            st.fixed_dictionaries({"type": st.just("array"), "items": inner}),
            st.fixed_dictionaries({"anyOf": st.lists(inner, min_size=1, max_size=2)}),
        ),
        max_leaves=8,
    )
    return st.one_of(schema, junk)


class Receipt(BaseModel):
    company: str = Field(description="the shop")
    total: float


def _call(name: str, fn: Callable[[], Any]) -> Any:
    """Run one entry point; only pocket_agent errors may escape, and they are swallowed here."""
    TRIED[name] += 1
    try:
        return fn()
    except PocketAgentError:
        return None


def _check_value(schema: Any, value: Any) -> None:
    if value is None:
        return
    if isinstance(schema, type):
        assert isinstance(value, schema)
    elif isinstance(schema, dict):
        jsonschema.validate(value, schema)


@FUZZ
@given(text=any_text, schema=st.one_of(st.just(Receipt), json_schemas()))
def test_fuzz_extract(tiny_gguf: Model, text: Any, schema: Any) -> None:
    value = _call("extract", lambda: extract(text, schema, model=tiny_gguf, limits=SMALL, retries=0))
    _check_value(schema, value)


@FUZZ
@given(texts=st.lists(any_text, max_size=4))
def test_fuzz_extract_many_keeps_every_row(tiny_gguf: Model, texts: list[Any]) -> None:
    out = _call("extract_many", lambda: list(extract_many(texts, Receipt, model=tiny_gguf, limits=SMALL, retries=0)))
    assert out is not None and [o.index for o in out] == list(range(len(texts)))
    for o in out:
        assert (o.value is None) != (o.error is None) or (o.value is None and o.error is not None)
        assert o.error is None or isinstance(o.error, PocketAgentError)


@FUZZ
@given(text=any_text)
def test_fuzz_extract_stream(tiny_gguf: Model, text: Any) -> None:
    items = _call("extract_stream", lambda: list(extract_stream(text, Receipt, model=tiny_gguf, limits=SMALL)))
    if items:
        assert isinstance(items[-1], Receipt)


output_types = st.one_of(
    st.none(),
    st.just(Receipt),
    st.builds(Regex, st.sampled_from([r"\d+", "(", "[a-z]{1,3}", ""])),
    st.builds(Choice, st.lists(st.text(max_size=4), max_size=3)),
    json_schemas(),
)


@FUZZ
@given(
    prompt=st.one_of(
        any_text, st.lists(st.one_of(junk, st.fixed_dictionaries({"role": any_text, "content": any_text})))
    ),
    output_type=output_types,
    system=st.one_of(st.none(), any_text),
    temperature=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2, 3)),
    stop=st.one_of(st.none(), st.lists(st.text(max_size=3), max_size=2), st.text(max_size=3)),
)
def test_fuzz_generate(
    tiny_gguf: Model, prompt: Any, output_type: Any, system: Any, temperature: Any, stop: Any
) -> None:
    def run() -> Any:
        sampling = Sampling(temperature=temperature, seed=1)
        return generate(
            prompt, output_type=output_type, model=tiny_gguf, system=system, sampling=sampling, limits=SMALL, stop=stop
        )

    res = _call("generate", run)
    if res is not None:
        assert isinstance(res.text, str) and res.finish_reason in ("grammar", "eos", "stop", "length")


@tool
def echo(text: str, times: int = 1) -> str:
    """Repeat text."""
    return text * max(0, min(times, 3))


@FUZZ
@given(
    task=st.one_of(
        any_text,
        st.lists(
            st.one_of(
                junk,
                st.fixed_dictionaries(
                    {"role": st.sampled_from(["user", "tool", "assistant", "x"]), "content": any_text}
                ),
            ),
            max_size=3,
        ),
    ),
    tool_choice=st.sampled_from(["auto", "required", "none", "echo", "missing", 3]),
    args=st.one_of(st.text(max_size=20), st.dictionaries(st.text(max_size=4), junk, max_size=3), junk),
)
def test_fuzz_agent(tiny_gguf: Model, task: Any, tool_choice: Any, args: Any) -> None:
    def run() -> Any:
        agent = Agent([echo], model=tiny_gguf, tool_choice=tool_choice, limits=SMALL)
        result = agent.execute(ToolCall("echo", args if isinstance(args, dict) else {"text": args}))
        assert result.status in ("ok", "error", "denied", "timeout")
        return agent.run(task)

    _call("agent", run)


@FUZZ
@given(
    question=any_text,
    options=st.one_of(st.lists(any_text, max_size=5), junk, st.lists(st.just("same"), min_size=2, max_size=3)),
    context=st.one_of(st.none(), any_text),
    method=st.sampled_from(["auto", "cloze", "letter", "pointer", "nope"]),
)
def test_fuzz_decide(tiny_gguf: Model, question: Any, options: Any, context: Any, method: Any) -> None:
    d = _call("decide", lambda: decide(question, options, context=context, model=tiny_gguf, method=method))
    if d is not None:
        assert math.isclose(sum(d.scores), 1.0, rel_tol=1e-6) and d.choice == options[d.index]
    many = _call(
        "decide_many",
        lambda: decide_many([{"question": question, "options": options, "context": context}], model=tiny_gguf),
    )
    assert many is None or len(many) == 1


@FUZZ
@given(
    values=st.dictionaries(
        st.sampled_from(
            [
                "max_tokens",
                "max_string_chars",
                "repeat_limit",
                "tool_timeout",
                "max_steps",
                "temperature",
                "top_p",
                "top_k",
                "seed",
            ]
        ),
        junk,
    )
)
def test_fuzz_options(values: dict[str, Any]) -> None:
    limit_keys = {"max_tokens", "max_string_chars", "repeat_limit", "tool_timeout", "max_steps"}
    _call("Limits", lambda: Limits(**{k: v for k, v in values.items() if k in limit_keys}))
    _call("Sampling", lambda: Sampling(**{k: v for k, v in values.items() if k not in limit_keys}))


@pytest.fixture(scope="module", autouse=True)
def _report() -> Iterator[None]:
    yield
    total = sum(TRIED.values())
    print(f"\nfuzz: {total} inputs tried, 0 escapes: " + json.dumps(dict(TRIED), sort_keys=True))


@pytest.mark.slow
def test_fuzz_tried_enough_inputs() -> None:
    """Runs last in this module (pytest keeps file order): every entry point got its inputs."""
    for name in ("extract", "extract_many", "extract_stream", "generate", "agent", "decide", "decide_many"):
        assert TRIED[name] >= 60, (name, TRIED[name])
