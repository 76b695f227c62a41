"""The loops on a scripted model: agent turns, extraction retries, stop strings and streaming
in milliseconds, with no model weights (the real-model tests cover what only a model shows)."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, field_validator

from pocket_agent import Agent, Limits, ToolCall, extract, extract_stream, generate, tool
from pocket_agent.errors import ExtractionError, MaxStepsExceeded
from pocket_agent.runtime import ScriptedModel


@tool
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


def call(name: str, **arguments: object) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def test_agent_runs_a_call_then_answers() -> None:
    model = ScriptedModel([call("add", a=1, b=2), "The sum is 3."])
    result = Agent([add], model=model).run("What is 1 + 2?")
    assert result.final == "The sum is 3."
    assert [c.name for c in result.steps[0].tool_calls] == ["add"]
    assert result.steps[0].results[0].output == 3.0
    assert result.usage.requests == 2 and result.usage.tool_calls == 1
    assert "<tool_response>\n3.0\n</tool_response>" in model.prompts[-1]


def test_agent_tool_choice_none_never_calls_and_max_steps_stops_a_loop() -> None:
    model = ScriptedModel([call("add", a=1, b=2)])
    step = Agent([add], model=model, tool_choice="none").step("add them")
    assert step.is_final and not step.tool_calls
    looping = ScriptedModel([call("add", a=1, b=1)])
    with pytest.raises(MaxStepsExceeded) as info:
        Agent([add], model=looping, limits=Limits(max_steps=3)).run("keep adding")
    assert len(info.value.steps) == 3


def test_raising_tool_becomes_an_error_observation_and_the_loop_goes_on() -> None:
    @tool
    def fetch_page(url: str) -> str:
        """Download a web page."""
        raise ConnectionError(f"cannot reach {url}")

    model = ScriptedModel([call("fetch_page", url="https://example.com"), "I could not fetch it."])
    result = Agent([fetch_page], model=model).run("Fetch https://example.com please.")
    res = result.steps[0].results[0]
    assert res.status == "error" and res.content.startswith("Error: ConnectionError: cannot reach")
    assert len(result.steps) == 2 and result.final == "I could not fetch it."
    assert "cannot reach https://example.com" in model.prompts[-1]  # the second turn saw the error


def test_max_steps_error_carries_steps_and_messages() -> None:
    calls: list[str] = []

    @tool
    def lookup(word: str) -> str:
        """Look a word up in the dictionary."""
        calls.append(word)
        return f"{word}: a word"

    agent = Agent([lookup], model=ScriptedModel([call("lookup", word="pocket")]), limits=Limits(max_steps=1))
    with pytest.raises(MaxStepsExceeded) as info:
        agent.run("Define the word 'pocket'.")
    exc = info.value
    assert len(exc.steps) == 1 and exc.steps[0].tool_calls and exc.steps[0].results
    assert calls == ["pocket"]  # the call ran before the budget of steps ended
    assert [m["role"] for m in exc.messages][-1] == "tool"


def test_confirmation_callback_can_deny() -> None:
    ran: list[int] = []
    asked: list[ToolCall] = []

    @tool(confirm=True)
    def delete_file(path: str) -> str:
        """Delete a file."""
        ran.append(1)
        return "deleted"

    def deny(c: ToolCall) -> bool:
        asked.append(c)
        return False

    model = ScriptedModel([call("delete_file", path="notes.txt"), "Not deleted."])
    result = Agent([delete_file], model=model, confirm=deny).run("Delete notes.txt")
    assert asked and asked[0].arguments == {"path": "notes.txt"}
    res = result.steps[0].results[0]
    assert res.status == "denied" and "denied" in res.content and not ran
    # without any callback a confirm=True tool never runs
    res2 = Agent([delete_file], model=model).execute(ToolCall("delete_file", {"path": "a.txt"}))
    assert res2.status == "denied" and "no confirmation callback" in res2.content
    approved = Agent([delete_file], model=model, confirm=lambda c: True)
    assert approved.execute(ToolCall("delete_file", {"path": "a.txt"})).output == "deleted"
    assert ran == [1]


def test_step_executes_nothing() -> None:
    ran: list[int] = []

    @tool
    def send_email(to: str, body: str) -> str:
        """Send an email."""
        ran.append(1)
        return "sent"

    model = ScriptedModel([call("send_email", to="bob@example.com", body="the build is green.")])
    agent = Agent([send_email], model=model)
    step = agent.step("Email bob@example.com that the build is green.")
    assert step.tool_calls and not step.results and not ran
    assert step.tool_calls[0].arguments == {"to": "bob@example.com", "body": "the build is green."}
    res = agent.execute(step.tool_calls[0])  # the caller decides, then executes through the agent's rules
    assert res.ok and ran == [1]


def test_parallel_calls_in_one_turn_and_a_verbatim_repeat_ends_the_turn() -> None:
    two = call("add", a=1, b=2) + "\n" + call("add", a=3, b=4)
    step = Agent([add], model=ScriptedModel([two])).step("add both pairs")
    assert [c.arguments for c in step.tool_calls] == [{"a": 1, "b": 2}, {"a": 3, "b": 4}]
    again = call("add", a=1, b=2) + "\n" + call("add", a=1, b=2)
    step = Agent([add], model=ScriptedModel([again])).step("add 1 and 2, twice")
    assert len(step.tool_calls) == 1 and step.finish_reason == "repeat"
    # a request that joins nothing admits one call: the grammar ends the turn after it
    step = Agent([add], model=ScriptedModel([two])).step("add 1 to 2")
    assert [c.arguments for c in step.tool_calls] == [{"a": 1, "b": 2}] and step.finish_reason != "repeat"


class Total(BaseModel):
    total: float

    @field_validator("total")
    @classmethod
    def positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("the total must be positive")
        return v


def test_extraction_retries_show_the_error_and_take_the_fix() -> None:
    model = ScriptedModel(['{"total": -1}', '{"total": 9.5}'])
    assert extract("TOTAL 9.50", Total, model=model).total == 9.5
    assert "the total must be positive" in model.prompts[-1]
    with pytest.raises(ExtractionError) as info:
        extract("TOTAL 9.50", Total, model=ScriptedModel(['{"total": -1}']), retries=0)
    assert info.value.last_output == '{"total": -1}'


def test_extract_stream_retries_and_restarts_partials() -> None:
    model = ScriptedModel(['{"total": -2}', '{"total": 4}'])
    items = list(extract_stream("TOTAL 4", Total, model=model))
    assert items[0] == {"total": -2} and items[-2] == {"total": 4} and items[-1] == Total(total=4)


class Receipt(BaseModel):
    company: str
    total: float


def test_grammar_keeps_output_valid_when_the_plan_is_not() -> None:
    out = extract("TOTAL 9.50", Receipt, model=ScriptedModel(["this is not JSON at all"]), limits=Limits(max_tokens=64))
    assert isinstance(out, Receipt)


def test_stop_strings_and_limits() -> None:
    model = ScriptedModel(["Hello there. END and more"])
    out = generate("hi", model=model, stop=["END"])
    assert out.text == "Hello there. " and out.finish_reason == "stop"
    cut = generate("hi again", model=ScriptedModel(["abcdefghij"]), max_tokens=4)
    assert cut.text == "abcd" and cut.finish_reason == "length"


def test_loop_guard_breaks_a_free_text_loop() -> None:
    out = generate("loop", model=ScriptedModel(["ha" * 40]), limits=Limits(max_tokens=40, repeat_limit=4))
    assert "hahahahaha" not in out.text  # the guard banned the token continuing the loop


def test_a_vanishing_temperature_samples_greedily() -> None:
    """Found by the fuzz test: a denormal temperature overflowed every logit to inf."""
    from pocket_agent import Sampling

    out = generate("hi", model=ScriptedModel(["ok"]), sampling=Sampling(temperature=2.2250738585e-313, seed=1))
    assert out.text == "ok"


def test_extraction_examples_are_laid_out_like_the_answer() -> None:
    """Few-shot answers use the separators the grammar makes the model write."""
    model = ScriptedModel(['{"total": 4}'])
    out = extract("TOTAL 4", Total, model=model, examples=[("TOTAL 9.50", Total(total=9.5)), ("T 2", {"total": 2})])
    assert out.total == 4
    assert '{"total": 9.5}' in model.prompts[-1] and '{"total": 2}' in model.prompts[-1]
