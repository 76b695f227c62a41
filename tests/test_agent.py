"""The agent loop on the real default model (SmolLM2-135M-Instruct): no mocks.

The tests assert what the library guarantees (every call well-formed, the loop's rules),
never what a 135M model gets right (its arithmetic, its choice of words).
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel

from pocket_agent import Limits
from pocket_agent.errors import OutputBudgetExceeded
from pocket_agent.runtime import Model, chatml_template
from pocket_agent.tools import (
    Agent,
    AgentEvent,
    MaxStepsExceeded,
    RunResult,
    Step,
    Tool,
    ToolCall,
    tool,
)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# Short turns keep the suite fast; strings are capped so a looping model cannot fill a turn.
FAST_LIMITS = Limits(max_tokens=128, max_string_chars=48)
FAST: dict[str, Any] = {"limits": FAST_LIMITS}


def _load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _assert_well_formed(steps: list[Step], agent: Agent) -> None:
    for st in steps:
        seen = set()
        for call in st.tool_calls:
            assert call.name in agent.tools
            jsonschema.validate(call.arguments, agent.tools[call.name].parameters)
            key = json.dumps([call.name, call.arguments], sort_keys=True)
            assert key not in seen, "a verbatim repeat must end the turn"
            seen.add(key)
        if st.results:
            assert [r.call for r in st.results] == st.tool_calls


def _run(agent: Agent, task: str, **kw: Any) -> tuple[RunResult | None, list[Step]]:
    try:
        result = agent.run(task, **kw)
    except MaxStepsExceeded as exc:
        return None, exc.steps
    return result, result.steps


def test_calculator_example_runs_end_to_end(smollm: Model) -> None:
    calc = _load_example("agent_calculator")
    assert calc.safe_eval("2 ** 10 + sqrt(16) * (3 - 1)") == 1032.0
    with pytest.raises(ValueError, match="unsupported"):
        calc.safe_eval("__import__('os').system('echo hi')")
    agent = Agent(calc.TOOLS, model=smollm, tool_choice="required", limits=FAST_LIMITS.replace(max_steps=3))
    events: list[AgentEvent] = []
    result, steps = _run(agent, "What is 12 * 7?", on_event=events.append)
    assert steps and steps[0].tool_calls, "tool_choice='required' makes the first turn call a tool"
    _assert_well_formed(steps, agent)
    first = steps[0]
    assert all(r.status in ("ok", "error") for r in first.results)
    ok = [r for r in first.results if r.ok]
    for r in ok:
        assert r.content == json.dumps(calc.safe_eval(r.call.arguments["expression"]))
    u = first.usage
    assert u.prompt_tokens > 0 and u.completion_tokens > 0 and u.forced_tokens > 0
    assert u.generation_s > 0 and u.requests == 1
    kinds = [e.kind for e in events if e.kind != "text"]
    assert kinds[0] == "step" and kinds[1] == "tool_call" and kinds[2] == "tool_result"
    assert "".join(e.text for e in events if e.kind == "text" and e.step_index == 0).startswith(
        first.text[: len("<tool_call>")]
    )
    if result is not None:
        assert kinds[-1] == "final" and events[-1].run is result
        assert isinstance(result.final, str)
        assert result.usage.requests == len(steps)
        assert result.usage.completion_tokens == sum(s.usage.completion_tokens for s in steps)
        assert result.usage.tool_calls == sum(len(s.tool_calls) for s in steps)
        assert result.messages[-1]["role"] == "assistant"
        tool_msgs = [m for m in result.messages if m["role"] == "tool"]
        assert len(tool_msgs) == result.usage.tool_calls


def test_budget_too_small_for_a_call_raises(smollm: Model) -> None:
    calc = _load_example("agent_calculator")
    agent = Agent(calc.TOOLS, model=smollm, tool_choice="required", max_tokens=6)
    with pytest.raises(OutputBudgetExceeded) as info:
        agent.step("What is 2 + 2?")
    assert info.value.tokens <= 6
    # a free-text answer that runs out of budget is still an answer
    short = Agent(calc.TOOLS, model=smollm, tool_choice="none", max_tokens=4)
    step = short.step("Tell me a long story about numbers.")
    assert step.is_final and step.finish_reason == "length" and step.final


def test_execute_rules_unknown_tool_truncation_timeout(smollm: Model) -> None:
    @tool
    def big(n: int) -> str:
        """Return n characters."""
        return "x" * n

    @tool
    def slow(seconds: float) -> str:
        """Sleep."""
        time.sleep(seconds)
        return "done"

    agent = Agent([big, slow], model=smollm, limits=Limits(max_result_chars=100, tool_timeout=0.3))
    r = agent.execute(ToolCall("big", {"n": 5000}))
    assert r.ok and r.truncated
    assert r.content.startswith("x" * 100) and "truncated: showing 100 of 5000 characters" in r.content
    assert len(r.output) == 5000  # the Python value is kept whole
    assert not agent.execute(ToolCall("big", {"n": 50})).truncated

    t0 = time.perf_counter()
    r = agent.execute(ToolCall("slow", {"seconds": 3.0}))
    assert r.status == "timeout" and "0.3 s" in r.content
    assert time.perf_counter() - t0 < 2.0
    assert agent.execute(ToolCall("slow", {"seconds": 0.01})).output == "done"

    r = agent.execute(ToolCall("rm", {"path": "/"}))
    assert r.status == "error" and "no tool named 'rm'" in r.content
    r = agent.execute(ToolCall("big", {"n": "many"}))
    assert r.status == "error" and "Invalid arguments" in r.content


def test_output_schema_and_stream(smollm: Model) -> None:
    class Verdict(BaseModel):
        positive: bool

    @tool
    def noop() -> str:
        """Do nothing."""
        return ""

    agent = Agent([noop], model=smollm, output=Verdict, tool_choice="none", max_tokens=32)
    events = list(agent.stream("Is 'I love it' a positive review?"))
    assert events[-1].kind == "final"
    run = events[-1].run
    assert run is not None and isinstance(run.final, Verdict)
    assert [e.kind for e in events if e.kind not in ("text",)] == ["step", "final"]


def test_call_threshold_decides_between_call_and_answer(smollm: Model) -> None:
    calc = _load_example("agent_calculator")
    always = Agent(calc.TOOLS, model=smollm, call_threshold=0.0, **FAST)
    step = always.step("What is 2 + 2?")
    assert step.call_probability is not None and 0.0 <= step.call_probability <= 1.0
    assert step.tool_calls
    _assert_well_formed([step], always)
    never = Agent(calc.TOOLS, model=smollm, call_threshold=1.0, max_tokens=16)
    step2 = never.step("What is 2 + 2?")
    assert step2.is_final and isinstance(step2.final, str) and step2.final
    assert step2.call_probability == pytest.approx(step.call_probability, abs=1e-6)


def test_native_tools_template_and_units_example(smollm: Model) -> None:
    units = _load_example("agent_units")
    assert units.convert_units.invoke({"value": 100, "from_unit": "celsius", "to_unit": "fahrenheit"}) == 212.0
    assert units.convert_units.invoke({"value": 1, "from_unit": "mile", "to_unit": "km"}) == 1.609344
    agent = Agent(units.TOOLS, model=smollm, chat_template=chatml_template(), tool_choice="required", **FAST)
    step = agent.step("Convert 5 km to miles.")
    assert step.tool_calls
    _assert_well_formed([step], agent)
    units_enum = agent.tools["convert_units"].parameters["properties"]["from_unit"]["enum"]
    assert step.tool_calls[0].arguments["from_unit"] in units_enum


def test_files_example_tools_stay_inside_their_folder(tmp_path: Path) -> None:
    files = _load_example("agent_files")
    files.write_notes(tmp_path)
    tools = {t.name: t for t in files.make_file_tools(tmp_path)}
    assert "meeting.txt" in tools["list_files"].invoke({})
    assert tools["search_files"].invoke({"query": "budget"})[0].startswith("meeting.txt:1:")
    assert "Lisbon" in tools["read_file"].invoke({"name": "travel.txt"})
    agent = Agent(list(tools.values()))
    r = agent.execute(ToolCall("read_file", {"name": "../../etc/passwd"}))
    assert r.status == "error" and "outside the notes folder" in r.content


def test_cli_run_prints_steps(smollm: Model, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from pocket_agent.tools.cli import add_run_parser, load_tools

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    add_run_parser(sub)
    spec = f"{EXAMPLES / 'agent_calculator.py'}:TOOLS"
    assert [t.name for t in load_tools(spec)] == ["calculate"]
    argv = ["run", "What is 6 * 7?", "--tools", spec, "--model", str(smollm.path), "--threads", "1"]
    args = parser.parse_args([*argv, "--max-steps", "2", "--tool-choice", "required", "--max-tokens", "64"])
    try:
        rc = args.func(args)
    except MaxStepsExceeded:
        rc = 0
    out = capsys.readouterr().out
    assert rc == 0
    assert "step 1:" in out and "-> calculate(" in out


def test_tool_objects_are_reusable_across_agents(smollm: Model) -> None:
    calc = _load_example("agent_calculator")
    t: Tool = calc.calculate
    a1, a2 = Agent([t], model=smollm), Agent([t], model=smollm, parallel_tool_calls=False)
    assert a1.grammar_text() != a2.grammar_text()
    assert "calls: call\n" in a2.grammar_text()


@tool
def _calculate(expression: str) -> float:
    """Evaluate an arithmetic expression such as 2 + 3 * 4."""
    import ast
    import operator

    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return float(ops[type(node.op)](ev(node.left), ev(node.right)))
        raise ValueError("not arithmetic")

    return ev(ast.parse(expression, mode="eval").body)


@tool
def _get_weather(city: str) -> dict[str, Any]:
    """Get the current weather for a city."""
    if city.lower() != "oslo":
        raise ValueError(f"unknown city {city!r}")
    return {"temp_c": -3, "conditions": "light snow"}


@tool
def _convert_currency(amount: float, src: str, dst: str) -> float:
    """Convert an amount of money from one currency to another (ISO codes like USD, EUR)."""
    return round(amount * 0.92, 2)


EVERYDAY = [_calculate, _get_weather, _convert_currency]


def test_tool_choice_reads_the_descriptions(smollm: Model) -> None:
    from pocket_agent.tools.relevance import relevance, relevant_tools

    for request, best in (
        ("What's the weather in Oslo?", "_get_weather"),
        ("How much is 100 USD in EUR?", "_convert_currency"),
        ("Compute 1250 / 4", "_calculate"),
    ):
        assert relevance(smollm, EVERYDAY, request).best_tool == best, request
    assert relevant_tools(relevance(smollm, EVERYDAY, "Hello there!")) == []  # small talk: no tool fits


def test_an_everyday_agent_finishes_with_the_result(smollm: Model) -> None:
    agent = Agent(EVERYDAY, model=smollm, **FAST)
    run = agent.run("Compute 1250 / 4")
    assert [c.name for c in run.steps[0].tool_calls] == ["_calculate"]
    assert run.steps[0].results[0].output == 312.5  # the whole expression, not "1250"
    assert "312.5" in run.final  # the answer states the tool's result
    failed = agent.run("What's the weather in Atlantis?")
    if any(c.name == "_get_weather" for s in failed.steps for c in s.tool_calls):
        assert "_get_weather failed" in failed.final  # said plainly, nothing invented
    assert agent.run("Hello there!").steps[0].tool_calls == []
