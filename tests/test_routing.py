"""Routing under tool_choice="auto", grounded arguments and repeat detection, on the default model.

The tests check what the library guarantees (a scored decision with probabilities for
every option, arguments that are spans of the request), not what a 135M model gets right.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from pocket_agent.errors import InvalidInputError
from pocket_agent.grammars.grounding import normalize_space
from pocket_agent.runtime import Model
from pocket_agent.tools import Agent, Tool, tool
from pocket_agent.tools.format import ToolCall
from pocket_agent.tools.routing import ANSWER, call_key, call_text, call_tokens, decide_route, neutral_messages
from pocket_agent.training.tools import turn_ids


@tool
def get_weather(city: str, unit: str = "celsius") -> str:
    """Current weather in a city.

    Args:
        city: the city name
        unit: temperature unit
    """
    return f"sunny in {city}"


def _spec_tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> Tool:
    """A tool from an OpenAI-style spec with an object of ``properties``."""
    parameters = {"type": "object", "properties": properties, "required": required}
    return Tool.from_openai({"name": name, "description": description, "parameters": parameters})


def _unit_enum_tool() -> Tool:
    return _spec_tool(
        "get_weather",
        "Current weather in a city.",
        {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "detailed": {"type": "boolean"},
        },
        ["city"],
    )


def test_decision_is_calibrated_against_the_neutral_question() -> None:
    q = {ANSWER: math.log(0.99), "t": math.log(0.001)}
    n = {ANSWER: math.log(0.999), "t": math.log(0.00001)}
    r = decide_route(q, n, bias=0.0)
    assert r.choice == "t" and r.calls  # the question raised the call 100x
    assert abs(sum(r.scores.values()) - 1.0) < 1e-9
    assert decide_route(q, q, bias=-1.0).choice == ANSWER
    msgs = neutral_messages([{"role": "system", "content": "s"}, {"role": "user", "content": "weather?"}])
    assert msgs[-1]["content"] == "N/A" and msgs[0]["content"] == "s"


def test_call_key_ignores_only_choice_valued_arguments() -> None:
    tools = {"get_weather": _unit_enum_tool()}

    def body(args: dict[str, object]) -> str:
        return json.dumps({"name": "get_weather", "arguments": args})

    a = call_key(body({"city": "Riga", "unit": "celsius"}), tools)
    assert a == call_key(body({"city": "Riga", "unit": "fahrenheit", "detailed": True}), tools)
    assert a != call_key(body({"city": "Oslo", "unit": "celsius"}), tools)
    assert call_key("not json", tools) is None


@pytest.mark.parametrize("name", ["get_weather", "math.factorial", "calc_área"])
def test_a_call_is_scored_on_the_tokens_the_model_writes(smollm: Model, name: str) -> None:
    """Routing scores the tokens a call is written with, cut at a token boundary: the prefix
    tokenized alone ends in a lone '"' where a call writes '":' (an artefact worth e^-13 on
    a tuned model)."""
    toks = call_tokens(smollm, name)
    written = turn_ids(smollm, [ToolCall(name=name, arguments={"x": 1})])
    assert written[: len(toks)] == toks
    assert call_text(name).encode().startswith(smollm.detokenize(toks))
    assert smollm.decode(toks).endswith('"arguments":')


def test_step_carries_routing_scores_and_grounded_arguments(smollm: Model) -> None:
    agent = Agent([get_weather], model=smollm, max_tokens=96)
    task = "What is the weather in Riga today?"
    step = agent.step(task)
    r = step.routing
    assert r is not None and set(r.scores) == {ANSWER, "get_weather"}
    assert abs(sum(r.scores.values()) - 1.0) < 1e-6 and 0.0 <= r.confidence <= 1.0
    assert step.call_probability == pytest.approx(r.call_probability)
    assert r.calls == bool(step.tool_calls)
    # the same decision again: deterministic
    assert agent.route([{"role": "user", "content": task}]).scores == pytest.approx(r.scores)
    forced = Agent([get_weather], model=smollm, max_tokens=96, tool_choice="required").step(task)
    assert forced.routing is None and forced.tool_calls
    for call in forced.tool_calls:
        assert call.arguments["city"] in normalize_space(task)
    sampled = Agent([get_weather], model=smollm, max_tokens=96, routing="sample").step(task)
    assert sampled.routing is None
    with pytest.raises(InvalidInputError):
        Agent([get_weather], model=smollm, routing="vibes")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        Agent([get_weather], model=smollm, grounded="maybe")  # type: ignore[arg-type]


def test_a_call_changing_only_an_enum_ends_the_turn(smollm: Model) -> None:
    agent = Agent([_unit_enum_tool()], model=smollm, max_tokens=160, tool_choice="required")
    step = agent.step("Weather in Riga please, in celsius and in fahrenheit.")
    keys = [call_key(json.dumps({"name": c.name, "arguments": c.arguments}), agent.tools) for c in step.tool_calls]
    assert step.tool_calls and len(keys) == len(set(keys))


def test_after_tool_results_the_agent_answers_from_them(smollm: Model) -> None:
    """The first turn is calibrated (a call wins with the fitted bias); the turn after the
    results compares plain scores, so the run ends with an answer instead of calling until
    max_steps. The answer never echoes the tool tags (the grammar forbids them)."""
    agent = Agent([get_weather], model=smollm, max_tokens=64)
    result = agent.run("What is the weather in Riga today?")
    first, last = result.steps[0], result.steps[-1]
    assert first.tool_calls and first.routing is not None and first.routing.calls
    assert last.is_final and len(result.steps) <= 3
    assert last.routing is not None and last.routing.logits == pytest.approx(last.routing.raw)
    assert "<tool_" not in last.text and "</tool_" not in last.text


@pytest.mark.parametrize(
    ("value", "text", "expected"),
    [
        ("Riga", "Im at Riga, Latvia, Can you tell me the current temperature?", ["Riga, Latvia"]),
        ("MG", "Qual a temperatura atual em Divinópolis, MG? fahrenheit", ["Divinópolis, MG"]),
        ("London", "I'm at London, UK in fahr", ["London, UK"]),  # lower-case words end a name
        ("Bangkok", "in Bangkok, Thailand. I prefer", ["Bangkok, Thailand"]),  # so does punctuation
        ("Boston", "weather today in Boston in fahrenheit?", []),
        ("apples", "I like apples, pears and plums", []),  # not a name
        ("Rome", "Flights from Paris, Rome", ["Paris, Rome"]),
        ("Oslo", "no such city here", []),
    ],
)
def test_comma_names_are_the_spans_a_value_may_grow_to(value: str, text: str, expected: list[str]) -> None:
    from pocket_agent.grounding import comma_names

    assert comma_names(value, text) == expected


def test_a_city_cut_at_its_comma_is_chosen_among_spans_by_the_model(smollm: Model) -> None:
    from pocket_agent.grounding import choose_spans

    agent = Agent([_unit_enum_tool()], model=smollm, max_tokens=96, tool_choice="required")
    task = "Im at Riga, Latvia, Can you tell me the current temperature?"
    step = agent.step(task)
    assert step.tool_calls
    for call in step.tool_calls:
        assert call.arguments["city"] in normalize_space(task)  # still a span of the request
    # the choice is the better-scored whole value: scoring the two again agrees with it
    ids = agent.prompt_ids([{"role": "user", "content": task}])
    prefix = [*ids, *smollm.tokenize('<tool_call>\n{"name": "get_weather", "arguments": {"city": "')]
    chosen, probability = choose_spans(smollm, prefix, "Riga", ["Riga, Latvia"])
    assert chosen in {"Riga", "Riga, Latvia"} and 0.0 < probability <= 1.0
    assert choose_spans(smollm, prefix, "Riga", []) == ("Riga", pytest.approx(math.nan, nan_ok=True))


def _primes_tool() -> Tool:
    return _spec_tool(
        "prime_numbers_in_range",
        "Find all prime numbers within a specific range.",
        {
            "start": {"type": "integer", "description": "The start of the range."},
            "end": {"type": "integer", "description": "The end of the range."},
            "return_format": {"type": "string", "description": "The format of the result."},
        },
        ["start", "end"],
    )


def test_a_tool_needing_a_number_nobody_stated_is_not_offered() -> None:
    from pocket_agent.tools.routing import needs_unstated_number, source_text

    primes = _primes_tool()
    assert needs_unstated_number(primes, "Find the fastest route from New York to Boston.")
    assert not needs_unstated_number(primes, "primes between ten and fifty")
    assert not needs_unstated_number(primes, "primes between 10 and 50")
    assert not needs_unstated_number(_unit_enum_tool(), "weather?")  # no number parameter
    opted_out = _spec_tool("lookup", "", {"id": {"type": "integer", "x-grounded": False}}, ["id"])
    assert not needs_unstated_number(opted_out, "look up my order")
    msgs = [{"role": "user", "content": "a"}, {"role": "tool", "content": "42"}, {"role": "assistant", "content": "7"}]
    assert source_text(msgs) == "a\n42"
    # never chosen, whatever its score; with nothing left, the answer
    q = {ANSWER: math.log(0.01), "t": math.log(0.99), "u": math.log(0.5)}
    r = decide_route(q, {}, bias=5.0, unstated=["t"])
    assert r.choice == "u" and r.scores["t"] == 0.0 and r.unstated == ("t",)
    only = decide_route({ANSWER: -math.inf, "t": 0.0}, {}, bias=0.0, unstated=["t"])
    assert only.choice == ANSWER and only.scores[ANSWER] == 1.0


def test_the_agent_answers_a_request_that_states_no_number_its_tool_needs(smollm: Model) -> None:
    agent = Agent([_primes_tool()], model=smollm, max_tokens=48)
    step = agent.step("Find the fastest route from New York to Boston.")
    assert step.routing is not None and step.routing.unstated == ("prime_numbers_in_range",)
    assert step.is_final and not step.tool_calls
    asked = agent.route([{"role": "user", "content": "List the primes between 10 and 50."}])
    assert asked.unstated == () and asked.scores["prime_numbers_in_range"] > 0.0


def test_a_tool_whose_number_needs_a_unit_the_request_never_states_is_not_offered(smollm: Model) -> None:
    """ "10 meters" cannot be a weight in kilograms: the BMI tool is left out of the choice
    for a triangle's area, and offered again once a weight is stated."""
    from pocket_agent.tools.routing import needs_unstated_number

    bmi = _spec_tool(
        "determine_body_mass_index",
        "Calculate body mass index given weight and height.",
        {
            "weight": {"type": "number", "description": "Weight of the individual in kilograms."},
            "height": {"type": "number", "description": "Height of the individual in meters."},
        },
        ["weight", "height"],
    )
    triangle = "Calculate the area of a triangle given the base is 10 meters and height is 5 meters."
    assert needs_unstated_number(bmi, triangle)
    assert not needs_unstated_number(bmi, "My BMI? I weigh 70 kg and I am 1.75 m tall.")
    assert not needs_unstated_number(bmi, "My BMI? I weigh 70 and I am 1.75 m tall.")
    step = Agent([bmi], model=smollm, max_tokens=48).step(triangle)
    assert step.routing is not None and step.routing.unstated == ("determine_body_mass_index",)
    assert step.is_final and not step.tool_calls


def test_completes() -> None:
    from pocket_agent.grounding import completes

    assert completes("200", "200000") and completes("2", "-2") and completes("3.0", "35")
    assert not completes("2800", "5") and not completes("", "5") and not completes("12", "2")


def test_a_cut_off_number_argument_is_completed_from_the_request(smollm: Model) -> None:
    """No number argument is a printed number cut short or missing its sign: the model's
    ``200`` for "$200,000" is re-chosen by score among the numbers it completes."""
    from pocket_agent.grammars.grounding import number_options
    from pocket_agent.grounding import completes

    depreciation = _spec_tool(
        "finance.property_depreciation",
        "Calculates the depreciated value of a property given its initial cost and rate.",
        {
            "initial_cost": {"type": "integer", "description": "The initial cost of the property."},
            "depreciation_rate": {"type": "integer", "description": "The annual depreciation rate in %."},
            "years": {"type": "integer", "description": "The number of years."},
        },
        ["initial_cost", "depreciation_rate", "years"],
    )
    agent = Agent([depreciation], model=smollm, max_tokens=96, tool_choice="required")
    task = (
        "Calculate the depreciated value of a property costing $200,000 with an annual depreciation rate of 3% "
        "for 5 years."
    )
    printed = number_options(task, units=True)
    step = agent.step(task)
    assert step.tool_calls
    for call in step.tool_calls:
        for value in call.arguments.values():
            assert float(value) in {float(o) for o in printed} or not any(completes(str(value), o) for o in printed)


@pytest.mark.parametrize(
    ("text", "several"),
    [
        ("What is the capital of Brazil?", False),
        ("Calculate the volume of a cone of radius 4.5", False),
        ("What are the capital and the population of Brazil?", True),
        ("Weather in Boston, Seattle", True),
        ("ROI for $2000 with a gain of $500. Do the same for $5000.", True),
        ("上海和北京的天气", True),
        ("上海的天气", False),
    ],
)
def test_asks_for_several(text: str, several: bool) -> None:
    from pocket_agent.tools.routing import asks_for_several

    assert asks_for_several(text) == several


def test_a_request_that_joins_nothing_gets_one_call(smollm: Model) -> None:
    def country_tool(name: str, what: str) -> Tool:
        country = {"country": {"type": "string", "description": "Name of the country."}}
        return _spec_tool(name, f"Fetch the {what} of a specified country.", country, ["country"])

    agent = Agent(
        [country_tool("country_info.capital", "capital"), country_tool("country_info.population", "population")],
        model=smollm,
        max_tokens=96,
        tool_choice="required",
    )
    one = '<tool_call>\n{"name": "country_info.capital", "arguments": {"country": "Brazil"}}\n</tool_call>'
    two = one + "\n" + one.replace("capital", "population")
    alone = [{"role": "user", "content": "What is the capital of Brazil?"}]
    joined = [{"role": "user", "content": "What are the capital and the population of Brazil?"}]
    assert agent.turn_grammar("required", alone).accepts_text(one)
    assert not agent.turn_grammar("required", alone).accepts_text(two)
    assert agent.turn_grammar("required", joined).accepts_text(two)
    assert len(agent.step(alone).tool_calls) == 1
