"""Running tool calls under the agent's rules.

- only registered tools run; a call to anything else becomes an error observation;
- arguments are validated against the tool's schema before the tool runs;
- a tool marked ``confirm=True`` runs only if the ``confirm`` callback approves the call;
- a tool that raises, times out or is denied becomes an error observation, not a crash;
- a result longer than ``max_result_chars`` is truncated with a note saying so.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel

from ..errors import InvalidInputError, ToolArgumentError
from ..options import Limits
from .format import ToolCall
from .results import ConfirmCallback, ResultStatus, ToolResult
from .tool import Tool, as_tool


def tool_table(tools: Iterable[Any]) -> dict[str, Tool]:
    """Tools by name, each converted with :func:`~pocket_agent.tools.as_tool`; names must be unique."""
    if isinstance(tools, (str, bytes, Mapping)) or callable(tools):
        tools = [tools]
    table: dict[str, Tool] = {}
    for obj in tools:
        t = as_tool(obj)
        if t.name in table:
            raise InvalidInputError(f"Two tools are named {t.name!r}; tool names must be unique.")
        table[t.name] = t
    return table


def to_content(value: Any) -> str:
    """A tool's return value as text for the model."""
    if isinstance(value, str):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def truncate(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to ``limit`` characters with a note saying how much was dropped."""
    if len(text) <= limit:
        return text, False
    return text[:limit] + f"\n[truncated: showing {limit} of {len(text)} characters]", True


def execute_call(
    tools: Mapping[str, Tool], call: ToolCall, *, limits: Limits, confirm: ConfirmCallback | None = None
) -> ToolResult:
    """Run one call: registered tools only, validated arguments, confirmation, timeout,
    errors as observations, truncation."""
    t0 = time.perf_counter()

    def done(status: ResultStatus, content: str, *, output: Any = None, error: str | None = None) -> ToolResult:
        text, cut = truncate(content, limits.max_result_chars)
        return ToolResult(
            call=call,
            status=status,
            content=text,
            output=output,
            error=error,
            truncated=cut,
            duration_s=time.perf_counter() - t0,
        )

    tool = tools.get(call.name)
    if tool is None:
        msg = f"There is no tool named {call.name!r}. Available: {', '.join(sorted(tools)) or 'none'}."
        return done("error", f"Error: {msg}", error=msg)
    try:
        kwargs = tool.validate(call.arguments)
    except ToolArgumentError as exc:
        return done("error", f"Error: {exc}", error=str(exc))
    if tool.confirm:
        approved = False
        reason = "no confirmation callback is configured"
        if confirm is not None:
            try:
                approved = bool(confirm(call))
                reason = "the user denied it"
            except Exception as exc:
                reason = f"the confirmation callback failed ({type(exc).__name__}: {exc})"
        if not approved:
            msg = f"The call to {call.name} was not run: {reason}."
            return done("denied", f"Error: {msg}", error=msg)
    timeout = limits.tool_timeout
    status, value, err = run_with_timeout(lambda: tool.call_validated(kwargs), timeout, call.name)
    if status == "ok":
        return done("ok", to_content(value), output=value)
    if status == "timeout":
        msg = f"{call.name} did not finish within {timeout:g} s and was abandoned."
        return done("timeout", f"Error: {msg}", error=msg)
    assert err is not None
    msg = f"{type(err).__name__}: {err}"
    return done("error", f"Error: {msg}", error=msg)


def run_with_timeout(
    fn: Callable[[], Any], timeout: float | None, name: str
) -> tuple[Literal["ok", "error", "timeout"], Any, BaseException | None]:
    """Run ``fn``; with a timeout, in a daemon thread that is abandoned if it overruns."""
    if timeout is None:
        try:
            return "ok", fn(), None
        except Exception as exc:
            return "error", None, exc
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    th = threading.Thread(target=target, name=f"pocket-agent-tool-{name}", daemon=True)
    th.start()
    th.join(timeout)
    if th.is_alive():
        return "timeout", None, None
    if "error" in box:
        err = box["error"]
        if not isinstance(err, Exception):
            raise err
        return "error", None, err
    return "ok", box.get("value"), None
