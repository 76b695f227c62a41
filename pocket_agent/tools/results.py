"""What an agent run produces: tool results, steps, the run's outcome and its events."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from ..usage import Usage
from .format import ToolCall
from .routing import Routing

ResultStatus = Literal["ok", "error", "denied", "timeout"]
FinalT = TypeVar("FinalT")


@dataclass
class ToolResult:
    """What running one :class:`ToolCall` gave.

    ``output`` is the Python value the tool returned (``status == "ok"``); ``content`` is
    the text the model sees (after truncation); ``error`` explains a failure, denial or
    timeout.
    """

    call: ToolCall
    status: ResultStatus
    content: str
    output: Any = None
    error: str | None = None
    truncated: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the tool ran and returned normally."""
        return self.status == "ok"


@dataclass
class Step:
    """One assistant turn: the model's tool calls (or final answer) and what came of them.

    ``text`` is the raw model output. ``final`` is the answer (text, or the ``output`` object)
    when the turn made no calls. ``results`` is empty until the calls are executed
    (:meth:`~pocket_agent.tools.Agent.step` never executes them). ``usage`` counts the turn's tokens and time
    (tool time included once the calls ran). ``call_probability`` is the model's
    probability of starting a call when the turn was routed (``tool_choice="auto"``);
    ``routing`` holds the scored decision (:class:`~pocket_agent.tools.routing.Routing`:
    the choice and a probability for answering and for each tool).
    """

    index: int
    text: str
    tool_calls: list[ToolCall]
    final: Any = None
    results: list[ToolResult] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    finish_reason: str = ""
    call_probability: float | None = None
    routing: Routing | None = None

    @property
    def is_final(self) -> bool:
        """True when the model answered instead of calling tools."""
        return not self.tool_calls


@dataclass
class RunResult(Generic[FinalT]):
    """The outcome of :meth:`~pocket_agent.tools.Agent.run`: the ``final`` answer, every step, totals, and the
    conversation (``messages``, OpenAI style) to continue from.

    ``final`` is typed by the agent: ``str`` for a text answer, the ``output`` type's instance
    for an agent with ``output=Model``, ``Any`` with ``answer="result"`` (the tool's value)."""

    final: FinalT
    steps: list[Step]
    usage: Usage
    messages: list[dict[str, Any]]

    @classmethod
    def of(cls, final: FinalT, steps: list[Step], messages: list[dict[str, Any]]) -> RunResult[FinalT]:
        """A result whose usage is the sum of its steps'."""
        return cls(final=final, steps=steps, usage=sum((s.usage for s in steps), Usage()), messages=messages)


EventKind = Literal["text", "step", "tool_call", "tool_result", "final"]


@dataclass(frozen=True)
class AgentEvent:
    """Something that happened during a run, in order.

    - ``text``: new output text of the current turn (``text``; ``forced`` when the grammar
      dictated it); a call that repeats an earlier one of the same turn verbatim is streamed
      before the turn is cut, so :attr:`Step.text` is the authoritative output;
    - ``step``: a turn finished generating (``step``, before its calls run);
    - ``tool_call``: a call is about to run (``call``);
    - ``tool_result``: it finished (``result``);
    - ``final``: the run is over (``run``).
    """

    kind: EventKind
    step_index: int
    text: str = ""
    forced: bool = False
    call: ToolCall | None = None
    result: ToolResult | None = None
    step: Step | None = None
    run: RunResult[Any] | None = None


ConfirmCallback = Callable[[ToolCall], bool]
EventCallback = Callable[[AgentEvent], None]
