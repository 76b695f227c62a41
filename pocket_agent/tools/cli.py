"""``pocket-agent run "task" --tools module:attr``: run an agent from the command line.

``--tools`` names a module (dotted, importable from the current folder) or a ``.py`` file,
and an attribute in it: a :class:`~pocket_agent.tools.Tool`, a typed function, or a list
of them. It may be given several times. Each step is printed as it finishes: the calls
with their arguments, then each result (or error).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from typing import Any

from .._cli_common import EXIT_OK, add_model_options, load_reference, open_model, positive_int
from ..options import DEFAULT_MAX_STEPS, DEFAULT_MAX_TOKENS
from .agent import AgentEvent
from .format import ToolCall
from .tool import Tool, as_tool


def load_tools(spec: str) -> list[Tool]:
    """Tools named by ``module:attr`` or ``path/to/file.py:attr`` (a Tool, a typed function,
    or a list of them)."""
    obj = load_reference(spec, "--tools")
    items: Iterable[Any] = obj if isinstance(obj, (list, tuple)) else [obj]
    return [as_tool(o) for o in items]


def _ask(call: ToolCall) -> bool:
    if not sys.stdin.isatty():
        print(f"  ! {call.name} needs confirmation and stdin is not a terminal: denied", flush=True)
        return False
    answer = input(f"  ? run {call.name}({json.dumps(call.arguments, ensure_ascii=False)})? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def _print_event(ev: AgentEvent) -> None:
    if ev.kind == "step" and ev.step is not None:
        st = ev.step
        head = f"step {st.index + 1}: {st.usage.completion_tokens} tokens in {st.usage.generation_s:.1f}s"
        if st.call_probability is not None:
            head += f" (P(call)={st.call_probability:.3f})"
        print(head, flush=True)
        for c in st.tool_calls:
            print(f"  -> {c.name}({json.dumps(c.arguments, ensure_ascii=False)})", flush=True)
    elif ev.kind == "tool_result" and ev.result is not None:
        r = ev.result
        mark = "<-" if r.ok else f"<- [{r.status}]"
        text = r.content if len(r.content) <= 300 else r.content[:300] + "..."
        print(f"  {mark} {text}", flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    """Run the agent on ``args.task`` and print every step and the final answer."""
    from ..options import Limits
    from .agent import Agent

    tools: list[Tool] = []
    for spec in args.tools or []:
        tools.extend(load_tools(spec))
    task = args.task if args.task != "-" else sys.stdin.read()
    limits = Limits(max_steps=args.max_steps, max_tokens=args.max_tokens, tool_timeout=args.tool_timeout)
    model = open_model(args)
    agent = Agent(
        tools,
        model=model,
        instructions=args.instructions,
        tool_choice=args.tool_choice,
        confirm=(lambda call: True) if args.yes else _ask,
        limits=limits,
        call_threshold=args.call_threshold,
    )
    result = agent.run(task, on_event=_print_event)
    u = result.usage
    final = result.final
    if hasattr(final, "model_dump_json"):
        final = final.model_dump_json()
    print(f"answer: {final}")
    print(
        f"[{len(result.steps)} steps, {u.tool_calls} tool calls, {u.prompt_tokens_evaluated} prompt tokens evaluated, "
        f"{u.completion_tokens} generated, {u.total_s:.1f}s]",
        file=sys.stderr,
    )
    model.close()
    return EXIT_OK


def add_run_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``run "task" --tools module:attr [--model M] [--max-steps N] ...``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "run", help="run a tool-calling agent on a task, printing each step"
    )
    p.add_argument("task", help="what the agent should do ('-' reads stdin)")
    p.add_argument(
        "--tools",
        action="append",
        metavar="MODULE:ATTR",
        help="tools to offer: module:attr or file.py:attr (a Tool, a function, or a list); repeatable",
    )
    add_model_options(p)
    p.add_argument(
        "--max-steps",
        type=positive_int,
        default=DEFAULT_MAX_STEPS,
        help=f"most model turns (default {DEFAULT_MAX_STEPS})",
    )
    p.add_argument(
        "--max-tokens",
        type=positive_int,
        default=DEFAULT_MAX_TOKENS,
        help=f"token budget of one turn (default {DEFAULT_MAX_TOKENS})",
    )
    p.add_argument("--instructions", default=None, help="system instructions")
    p.add_argument("--tool-choice", default="auto", help="auto, required, none, or a tool name (first turn)")
    p.add_argument("--call-threshold", type=float, default=None, help="call when P(call) >= this (auto only)")
    p.add_argument("--tool-timeout", type=float, default=None, help="seconds a tool may run")
    p.add_argument("--yes", "-y", action="store_true", help="approve tools that ask for confirmation")
    p.set_defaults(func=cmd_run)
    return p
