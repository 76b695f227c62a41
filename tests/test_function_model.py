"""A function model: ``ScriptedModel(scores=...)`` (pydantic-ai's ``FunctionModel`` idea), whose
next-token logits are a Python function of the prompt and of the bytes the turn holds so far.

Grammars mask those logits, scored routing and argument grounding read them as probabilities, and
the server maps what comes out to the OpenAI protocol: the paths the real-model tests cover, here
in milliseconds and with a model whose preferences the test chooses (the lowest-id token, the
highest, random ones), so a constraint that leaks shows at once.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any, Literal

import jsonschema
import numpy as np
import openai
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field
from test_grammars_property import SCHEMAS

from pocket_agent import Agent, extract, generate, tool
from pocket_agent.errors import InvalidInputError
from pocket_agent.grammars import Choice, Regex
from pocket_agent.runtime.scripted import N_VOCAB, SPECIALS, ScriptedModel
from pocket_agent.server.app import ServerConfig, create_app
from pocket_agent.tools.routing import ANSWER, CALL_BIAS, call_tokens

END = 256 + SPECIALS.index("<|im_end|>")


def lowest(prompt: str, produced: bytes) -> np.ndarray:
    """Always the lowest-id token the grammar allows (greedy decoding takes the top logit)."""
    return -np.arange(N_VOCAB, dtype=np.float32)


def highest(prompt: str, produced: bytes) -> np.ndarray:
    """Always the highest-id token allowed: the end tokens, then 4-byte UTF-8 lead bytes."""
    return np.arange(N_VOCAB, dtype=np.float32)


def toward(target: str, produced: bytes) -> np.ndarray:
    """Logits that write ``target`` and then end the turn; every other token stays possible."""
    row = np.full(N_VOCAB, -10.0, dtype=np.float32)
    goal = target.encode()
    on_plan = goal.startswith(produced) and len(produced) < len(goal)
    row[goal[len(produced)] if on_plan else END] = 10.0
    return row


def test_a_function_model_checks_its_arguments_and_its_logits() -> None:
    assert ScriptedModel(scores=lowest).capabilities.probabilities
    assert not ScriptedModel(["x"]).capabilities.probabilities
    with pytest.raises(InvalidInputError):
        ScriptedModel()
    with pytest.raises(InvalidInputError):
        ScriptedModel(["x"], scores=lowest)
    with pytest.raises(InvalidInputError, match="259 logits"):
        generate("hi", model=ScriptedModel(scores=lambda prompt, produced: np.zeros(3)), max_tokens=2)
    with pytest.raises(InvalidInputError, match="NaN"):
        generate("hi", model=ScriptedModel(scores=lambda prompt, produced: np.full(N_VOCAB, np.nan)), max_tokens=2)
    seen: list[tuple[str, bytes]] = []

    def spy(prompt: str, produced: bytes) -> np.ndarray:
        seen.append((prompt, produced))
        return toward("ok", produced)

    assert generate("hi", model=ScriptedModel(scores=spy)).text == "ok"
    assert [p for _, p in seen] == [b"", b"o", b"ok"]
    assert seen[0][0].endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


class Booking(BaseModel):
    city: str = Field(max_length=12)
    nights: int = Field(ge=1, le=14)
    room: Literal["single", "double", "suite"]
    breakfast: bool
    guests: list[str] = Field(max_length=2)
    note: str | None = Field(default=None, max_length=5)


OUTPUTS: list[tuple[Any, Any]] = [
    (Choice(["yes", "no", "maybe"]), lambda text: text in ("yes", "no", "maybe")),
    (Regex(r"[A-Z]{2}-[0-9]{3}"), lambda text: re.fullmatch(r"[A-Z]{2}-[0-9]{3}", text)),
    (Booking, lambda text: Booking.model_validate_json(text)),
    (
        {
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 7}},
            "required": ["n"],
            "additionalProperties": False,
        },
        lambda text: json.loads(text)["n"] in range(3, 8),
    ),
]


@pytest.mark.parametrize("prefers", [lowest, highest], ids=["lowest-id", "highest-id"])
@pytest.mark.parametrize(("output_type", "valid"), OUTPUTS, ids=["choice", "regex", "pydantic", "bounded-int"])
def test_constrained_output_is_valid_whatever_the_model_prefers(prefers: Any, output_type: Any, valid: Any) -> None:
    out = generate("Book me a room.", model=ScriptedModel(scores=prefers), output_type=output_type, max_tokens=200)
    assert out.finish_reason == "grammar", out
    assert valid(out.text), out.text


def test_the_grammar_not_the_model_makes_the_output_valid() -> None:
    free = generate("Book me a room.", model=ScriptedModel(scores=lowest), max_tokens=8)
    assert free.text == "\x00" * 8  # unconstrained, the lowest-id model writes NUL bytes
    booked = extract("Two nights in Riga, double room, breakfast.", Booking, model=ScriptedModel(scores=lowest))
    assert isinstance(booked, Booking) and 1 <= booked.nights <= 14


@settings(
    max_examples=int(os.environ.get("POCKET_AGENT_HYPOTHESIS_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
@given(schema=SCHEMAS, seed=st.integers(0, 2**32 - 1))
def test_a_random_model_writes_json_its_schema_accepts(schema: dict[str, Any], seed: int) -> None:
    """Random logits (closing tokens favoured, so outputs end) on generated schemas: whatever
    the grammar lets through must be valid JSON for the schema."""
    rng = np.random.default_rng(seed)
    closers = [*b'"]}', END]

    def scores(prompt: str, produced: bytes) -> np.ndarray:
        row = rng.normal(0.0, 2.0, N_VOCAB).astype(np.float32)
        row[closers] += 4.0
        return row

    out = generate("Any JSON.", model=ScriptedModel(scores=scores), output_type=schema, max_tokens=400)
    assert out.finish_reason == "grammar"
    jsonschema.validate(json.loads(out.text), schema)


@tool
def convert(amount: int, unit: Literal["km", "mi"], exact: bool = False) -> str:
    """Convert a distance.

    Args:
        amount: how far
        unit: the unit to convert to
        exact: whether to give every digit
    """
    return f"{amount} {unit}"


@tool
def get_weather(city: str) -> str:
    """Current weather in a city.

    Args:
        city: the city name
    """
    return f"sunny in {city}"


@pytest.mark.parametrize("prefers", [lowest, highest], ids=["lowest-id", "highest-id"])
@pytest.mark.parametrize("tool_choice", ["required", "convert", "get_weather"])
def test_tool_calls_stay_schema_valid_and_grounded(prefers: Any, tool_choice: str) -> None:
    tools = {t.name: t for t in (convert, get_weather)}
    request = "Convert 12 km, and the weather in Riga"
    step = Agent(list(tools.values()), model=ScriptedModel(scores=prefers), tool_choice=tool_choice).step(request)
    assert step.tool_calls and not step.is_final
    for call in step.tool_calls:
        assert tool_choice in ("required", call.name)
        jsonschema.validate(call.arguments, tools[call.name].parameters)
        if call.name == "get_weather":
            assert call.arguments["city"] in request  # grounded: a span of the request
    assert step.text.startswith('<tool_call>\n{"name": "') and step.text.endswith("\n</tool_call>")


CALL = "<tool_call>\n" + json.dumps({"name": "get_weather", "arguments": {"city": "Riga"}}) + "\n</tool_call>"
ANSWER_TEXT = "It is sunny in Riga."


def weather_assistant(prompt: str, produced: bytes) -> np.ndarray:
    """Calls get_weather when asked about the weather, answers from the tool's result, greets
    otherwise; knows nothing (flat logits) after the content-free question routing calibrates with."""
    if "<tool_response>" in prompt:
        return toward(ANSWER_TEXT, produced)
    question = prompt.rsplit("<|im_start|>user\n", 1)[-1].split("<|im_end|>", 1)[0]
    if question == "N/A":
        return np.zeros(N_VOCAB, dtype=np.float32)
    return toward(CALL if "weather" in question else "Hello! Ask me about the weather.", produced)


def test_scored_routing_follows_the_question_and_the_loop_stops_at_the_answer() -> None:
    model = ScriptedModel(scores=weather_assistant)
    agent = Agent([get_weather], model=model, max_tokens=96)
    result = agent.run("What is the weather in Riga today?")
    first, last = result.steps[0], result.steps[-1]
    assert len(result.steps) == 2 and result.final == ANSWER_TEXT == last.text
    assert [c.arguments for c in first.tool_calls] == [{"city": "Riga"}]
    assert first.results[0].output == "sunny in Riga"
    r = first.routing
    assert r is not None and r.choice == "get_weather" and r.calls
    assert set(r.scores) == {ANSWER, "get_weather"} and math.isclose(sum(r.scores.values()), 1.0)
    # calibration: the call's log-probability after the question (~0: the model writes it) less
    # its log-probability after the neutral question (flat logits: the first token one of those
    # the turn may start with, each later one of N_VOCAB), plus the bias
    n_call = len(call_tokens(model, "get_weather"))
    n_first = len(agent.turn_grammars.start_token_sets()[0])
    neutral = -math.log(n_first) - (n_call - 1) * math.log(N_VOCAB)
    assert r.raw["get_weather"] > -1e-3
    assert r.logits["get_weather"] == pytest.approx(r.raw["get_weather"] - neutral + CALL_BIAS)
    assert any(p.endswith("user\nN/A<|im_end|>\n<|im_start|>assistant\n") for p in model.prompts)
    assert last.is_final and not last.tool_calls and last.routing is not None and last.routing.choice == ANSWER

    hello = Agent([get_weather], model=model, max_tokens=96).step("Hello there, who are you?")
    assert hello.is_final and not hello.tool_calls and hello.text == "Hello! Ask me about the weather."
    assert hello.routing is not None and hello.routing.choice == ANSWER and hello.routing.scores[ANSWER] > 0.99


WEATHER_SPEC = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "the city name"}},
            "required": ["city"],
        },
    },
}


def test_server_maps_calls_answers_streams_and_usage_to_the_openai_protocol() -> None:
    """The server app in-process on the function model, spoken to with the official client."""
    app = create_app(ScriptedModel(scores=weather_assistant), ServerConfig(model_name="scripted"))
    with TestClient(app) as http:
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0)
        messages: list[Any] = [{"role": "user", "content": "What is the weather in Riga today?"}]
        called = client.chat.completions.create(model="any", messages=messages, tools=[WEATHER_SPEC])
        choice = called.choices[0]
        assert called.model == "scripted" and choice.finish_reason == "tool_calls"
        assert choice.message.content is None and choice.message.tool_calls
        call = choice.message.tool_calls[0]
        assert call.type == "function" and call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Riga"}

        messages += [
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "sunny in Riga"},
        ]
        answered = client.chat.completions.create(model="any", messages=messages, tools=[WEATHER_SPEC])
        assert answered.choices[0].finish_reason == "stop"
        assert answered.choices[0].message.content == ANSWER_TEXT and not answered.choices[0].message.tool_calls
        usage = answered.usage
        assert usage is not None and usage.completion_tokens == len(ANSWER_TEXT.encode())  # one byte, one token
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens > 2 * usage.completion_tokens

        chunks = list(
            client.chat.completions.create(
                model="any",
                messages=messages,
                tools=[WEATHER_SPEC],
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ANSWER_TEXT
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
        assert chunks[-1].usage == usage  # the same counts as the answer that was not streamed

        extracted = http.post(
            "/v1/extract",
            json={
                "text": "Invoice INV-2041, total 31.50 EUR",
                "schema": {"type": "object", "properties": {"total": {"type": "number"}}, "required": ["total"]},
            },
        )
        assert extracted.status_code == 200
        body = extracted.json()
        assert body["object"] == "extraction" and body["model"] == "scripted"
        assert body["value"]["total"] in (2041, 31.5)  # grounded: a number the text prints
