"""The agent's parts, each on its own (no model weights: a scripted model where one is needed):
running calls (execute), the turn's grammar and decoding (turn), argument positions (arguments),
and the final answer after tool results (answer), plus the loop rules they give the Agent."""

from __future__ import annotations

import json
import time

import pytest

from pocket_agent import Agent, Limits, ToolCall, tool
from pocket_agent.errors import InvalidInputError
from pocket_agent.runtime import ScriptedModel
from pocket_agent.tools.answer import facts_of, failure_answer, result_facts, stated_pattern
from pocket_agent.tools.arguments import call_arguments
from pocket_agent.tools.execute import execute_call, tool_table, truncate
from pocket_agent.tools.format import build_grammar
from pocket_agent.tools.turn import RepeatWatcher, TurnGrammars, compile_lark


@tool
def divide(a: float, b: float) -> float:
    """Divide a by b."""
    return a / b


@tool
def get_weather(city: str) -> dict[str, object]:
    """Current weather for a city."""
    if city != "Oslo":
        raise ValueError(f"unknown city {city!r}")
    return {"city": "Oslo", "temp_c": -3, "conditions": "light snow"}


def call(name: str, **arguments: object) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


# -- execute -----------------------------------------------------------------------------------


def test_execute_runs_registered_tools_and_turns_failures_into_observations() -> None:
    tools = tool_table([divide, get_weather])
    limits = Limits(max_result_chars=40)
    ok = execute_call(tools, ToolCall("divide", {"a": 1250, "b": 4}, id="c1"), limits=limits)
    assert ok.ok and ok.output == 312.5 and ok.content == "312.5"
    raised = execute_call(tools, ToolCall("divide", {"a": 1, "b": 0}, id="c2"), limits=limits)
    assert raised.status == "error" and raised.content.startswith("Error: ZeroDivisionError")
    unknown = execute_call(tools, ToolCall("shutdown", {}, id="c3"), limits=limits)
    assert unknown.status == "error" and "no tool named 'shutdown'" in unknown.content
    bad_args = execute_call(tools, ToolCall("divide", {"a": "x"}, id="c4"), limits=limits)
    assert bad_args.status == "error"


def test_execute_times_out_and_truncates() -> None:
    @tool
    def slow() -> str:
        """Sleep."""
        time.sleep(2)
        return "late"

    res = execute_call(tool_table([slow]), ToolCall("slow", {}, id="c"), limits=Limits(tool_timeout=0.05))
    assert res.status == "timeout"
    text, cut = truncate("x" * 100, 10)
    assert cut and text.startswith("x" * 10) and "showing 10 of 100" in text
    with pytest.raises(InvalidInputError, match="unique"):
        tool_table([divide, divide])


# -- turn --------------------------------------------------------------------------------------


def test_turn_grammars_cache_per_choice_and_ground_in_the_request() -> None:
    model = ScriptedModel(["x"])
    turns = TurnGrammars(
        tools=tool_table([get_weather]),
        tool_choice="auto",
        output_schema=None,
        max_calls=4,
        limits=Limits(),
        ground_numbers=False,
        model=model,
    )
    assert turns.compiled("required") is turns.compiled("required")
    messages = [{"role": "user", "content": "Weather in Oslo please"}]
    grounded = turns.for_turn("required", messages, grounded=True)
    assert grounded.accepts_text(call("get_weather", city="Oslo"))
    assert not grounded.accepts_text(call("get_weather", city="Paris"))  # not a span of the request
    assert turns.compiled("required").accepts_text(call("get_weather", city="Paris"))


def test_repeat_watcher_cuts_before_a_repeated_call() -> None:
    watcher = RepeatWatcher()
    one = call("divide", a=1, b=2)
    assert watcher.feed(one) is None
    assert watcher.feed("\n" + one) == len(one)


# -- arguments ---------------------------------------------------------------------------------


def test_call_arguments_finds_each_calls_argument_object() -> None:
    text = call("divide", a=1, b=2) + "\n" + call("get_weather", city="Oslo")
    found = [(t.name, json.loads(text[a:b])) for t, a, b in call_arguments(text, tool_table([divide, get_weather]))]
    assert found == [("divide", {"a": 1, "b": 2}), ("get_weather", {"city": "Oslo"})]


# -- answer ------------------------------------------------------------------------------------


def test_facts_are_the_values_a_user_asked_for() -> None:
    assert facts_of("312.5") == ["312.5"]
    assert facts_of("0.30000000000000004") == ["0.3"]
    assert facts_of('{"city": "Oslo", "temp_c": -3, "conditions": "light snow"}', "weather in Oslo?") == [
        "-3",
        "light snow",
    ]
    assert facts_of("true") == [] and facts_of("x" * 200) == []
    messages = [
        {"role": "user", "content": "q"},
        {"role": "tool", "name": "divide", "content": "312.5"},
        {"role": "tool", "name": "divide", "content": "Error: ZeroDivisionError: division by zero"},
    ]
    assert result_facts(messages) == ["312.5"]


def test_an_answer_after_results_must_state_them() -> None:
    model = ScriptedModel(["x"])
    lark = build_grammar([divide], tool_choice="none", answer_facts=["312.5"])
    assert stated_pattern(["312.5"]) in lark
    grammar = compile_lark(lark, model)
    assert grammar.accepts_text("1250 divided by 4 is 312.5.")
    assert not grammar.accepts_text("You can use the format method to create a JSON string.")
    assert not grammar.accepts_text("The answer is 312.5.\n\nMore text on another paragraph.")
    late = "a" * 200 + " 312.5"
    assert not grammar.accepts_text(late)  # stated early, not after a long detour
    for glued in ("It312.5 is it.", "2312.5", "The answer is 312.55.", "x312.5y"):
        assert not grammar.accepts_text(glued), glued  # another word or number, not the result
    assert grammar.accepts_text("312.5")
    assert grammar.accepts_text("结果是312.5。")


def test_stated_answers_hold_in_the_loop_and_free_answers_do_not() -> None:
    replies = [call("divide", a=1250, b=4), "You can use the format method."]
    stated = Agent([divide], model=ScriptedModel(replies), max_tokens=120).run("Compute 1250 / 4")
    assert "312.5" in stated.final
    free = Agent([divide], model=ScriptedModel(replies), answer="free").run("Compute 1250 / 4")
    assert free.final == "You can use the format method."


def test_answer_result_returns_the_tool_output() -> None:
    model = ScriptedModel([call("divide", a=1250, b=4), "unused"])
    result = Agent([divide], model=model, answer="result").run("Compute 1250 / 4")
    assert result.final == 312.5 and len(result.steps) == 1
    with pytest.raises(InvalidInputError, match="answer must be one of"):
        Agent([divide], answer="maybe")  # type: ignore[arg-type]


def test_a_failing_tool_gets_one_retry_then_a_plain_answer_saying_so() -> None:
    model = ScriptedModel([call("get_weather", city="Atlantis"), call("get_weather", city="Atlantis City"), "Sunny."])
    result = Agent([get_weather], model=model).run("What's the weather in Atlantis?")
    assert [s.is_final for s in result.steps] == [False, False, True]
    assert result.steps[1].results[0].status == "error"  # the retry ran, and failed
    assert result.final.startswith("Sorry, I could not complete that: get_weather failed (ValueError:")
    assert result.steps[-1].finish_reason == "tool_error" and "Sunny" not in result.final


def test_a_failing_tool_with_an_output_type_raises_instead_of_answering() -> None:
    from pydantic import BaseModel

    from pocket_agent import ToolsFailedError

    class Weather(BaseModel):
        temp_c: float

    replies = [call("get_weather", city="Atlantis"), call("get_weather", city="Atlantis City"), '{"temp_c": 20}']
    agent = Agent([get_weather], model=ScriptedModel(replies), output=Weather)
    with pytest.raises(ToolsFailedError, match="get_weather failed") as info:
        agent.run("What's the weather in Atlantis?")
    assert len(info.value.steps) == 2 and info.value.steps[1].results[0].status == "error"


def test_one_printed_word_fills_one_argument() -> None:
    from pocket_agent.tools.arguments import without_other_values

    assert without_other_values("12 EUR", [12.0, "CNY"]) == "EUR"
    assert without_other_values("EUR 12", [12]) == "EUR"
    assert without_other_values("Paris France", ["France"]) == "Paris"
    assert without_other_values("1,200 USD", [1200]) == "USD"
    assert without_other_values("12", [12]) == "12"  # never empty
    assert without_other_values("Room 12", [13, True]) == "Room 12"  # 12 is no other argument's value


def test_the_failure_answer_speaks_the_requests_language() -> None:
    messages = [
        {"role": "user", "content": "亚特兰蒂斯的天气怎么样？"},
        {"role": "tool", "name": "get_weather", "content": "Error: ValueError: unknown city"},
    ]
    assert failure_answer(messages, "亚特兰蒂斯的天气怎么样？").startswith("抱歉，无法完成：get_weather 调用失败")


def test_a_chinese_argument_may_be_any_word_of_the_request() -> None:
    from pocket_agent.grounding import cjk_words

    words = cjk_words("现在", "东京现在多少度？")
    assert "东京" in words and "现在" not in words  # the other candidate words, not the written one
    assert all(2 <= len(w) <= 4 for w in words)
    assert cjk_words("Tokyo", "东京现在多少度？") == []  # only Chinese values get Chinese alternatives
