"""The agent loop: ask the model for its next action under the tool-call grammar, run the
calls, feed the results back, until the model answers.

Safety rules the loop keeps:

- only registered tools run; a call to anything else (possible only through
  :meth:`Agent.execute` with hand-made calls) becomes an error observation;
- tool results are data: they go back in the ``tool`` role, are tokenized as plain text
  (a result cannot inject control tokens) and are never parsed or acted on by the library;
- a tool marked ``confirm=True`` runs only if the ``confirm`` callback approves the call;
- a tool that raises, times out or is denied becomes an error observation, not a crash.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import BaseModel, TypeAdapter, ValidationError

from ..errors import GenerationError, InvalidInputError, MaxStepsExceeded, OutputBudgetExceeded, ToolArgumentError
from ..generate import stream_tokens
from ..options import Limits, Sampling, resolve_limits, resolve_sampling
from ..runtime.prompt import encode_pieces
from ..runtime.task_adapters import (
    AdapterChoice,
    adapter_record,
    check_adapter_choice,
    recorded_number,
    task_adapter,
)
from ..usage import Usage
from .format import (
    CALL_CLOSE,
    CALL_OPEN,
    ParsedTurn,
    ToolCall,
    build_grammar,
    check_tool_choice,
    output_schema,
    parse_turn,
    render_messages,
)
from .routing import (
    CALL_BIAS,
    Router,
    Routing,
    asks_for_several,
    call_key,
    last_user_text,
    needs_unstated_number,
    neutral_messages,
    source_text,
)
from .tool import Tool, as_tool

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from ..grammars.compiler import CompiledGrammar
    from ..runtime import ChatTemplate, Model

ResultStatus = Literal["ok", "error", "denied", "timeout"]


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
    (:meth:`Agent.step` never executes them). ``usage`` counts the turn's tokens and time
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
class RunResult:
    """The outcome of :meth:`Agent.run`: the ``final`` answer, every step, totals, and the
    conversation (``messages``, OpenAI style) to continue from."""

    final: Any
    steps: list[Step]
    usage: Usage
    messages: list[dict[str, Any]]

    @classmethod
    def of(cls, final: Any, steps: list[Step], messages: list[dict[str, Any]]) -> RunResult:
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
    run: RunResult | None = None


ConfirmCallback = Callable[[ToolCall], bool]
EventCallback = Callable[[AgentEvent], None]


def _to_content(value: Any) -> str:
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


def _tool_table(tools: Iterable[Any]) -> dict[str, Tool]:
    """Tools by name, each converted with :func:`as_tool`; names must be unique."""
    if isinstance(tools, (str, bytes, Mapping)) or callable(tools):
        tools = [tools]
    table: dict[str, Tool] = {}
    for obj in tools:
        t = as_tool(obj)
        if t.name in table:
            raise InvalidInputError(f"Two tools are named {t.name!r}; tool names must be unique.")
        table[t.name] = t
    return table


class Agent:
    """A tool-calling loop over a local model whose tool calls are always well-formed.

    Args:
        tools: tools the model may call: :class:`Tool` objects, typed functions, Pydantic
            model classes, or OpenAI-style spec dicts (see :func:`~pocket_agent.tools.tool`).
        model: a loaded model, a model path, or ``None`` for the process-wide default
            (loaded on first use).
        instructions: system instructions placed before the tool descriptions.
        output: type of the final answer: ``None`` for text, or a Pydantic model / type /
            JSON Schema dict (the answer is then generated as JSON of that schema and
            returned validated).
        tool_choice: ``"auto"``, ``"required"``, ``"none"`` or a tool name. ``required`` and
            a tool name apply to the first turn of a run only (then ``auto``), so a run can
            end; ``none`` applies to every turn.
        parallel_tool_calls: allow several calls in one turn (at most ``max_parallel_calls``;
            a call that repeats an earlier one of the same turn ends the turn; a call to the
            same tool that changes only enum or boolean arguments counts as a repeat). A
            request that joins nothing (no "and", "or", list, comma or second clause; see
            :func:`~pocket_agent.tools.routing.asks_for_several`) gets one call.
        max_parallel_calls: most calls in one turn.
        confirm: callback asked before running a tool marked ``confirm=True``; it gets the
            :class:`ToolCall` and returns True to allow it. Without a callback such calls are
            denied.
        sampling: how tokens are chosen (default greedy).
        limits: ``max_tokens`` of one turn, ``max_steps`` of a run, ``tool_timeout``
            (a slower call becomes an error observation; its thread is abandoned, not
            killed), ``max_result_chars`` (longer tool results are truncated with a note),
            and the grammar's caps on free string arguments (``max_string_chars``) and
            argument arrays (``max_array_items``) that keep a looping small model from
            filling a turn inside one value; see :class:`~pocket_agent.Limits`.
        max_tokens: shortcut for ``limits.max_tokens``.
        call_threshold: under ``tool_choice="auto"``, decide between calling and answering
            by a fixed threshold instead of ``routing``: the turn is constrained to tool
            calls when the model puts at least this probability on starting a call (among
            the tokens the turn grammar allows), else to an answer. ``None`` (the default):
            ``routing`` decides.
        routing: how a ``tool_choice="auto"`` turn chooses between answering and calling:
            ``"scored"`` (default) scores answering and each tool by the model's own
            probability of the continuation that commits to it, calibrated against a
            content-free question (:mod:`pocket_agent.tools.routing`), and constrains the
            turn to the winner; ``"sample"`` leaves it to the first sampled token (what
            a model without real probabilities, such as ``ScriptedModel``, always does).
        grounded: ``True`` (default): string arguments must be verbatim spans of the
            user's last message (a parameter opts out with ``"x-grounded": false``), when
            that message has words; ``"all"``: numbers too must be numbers it prints;
            ``False``: arguments follow the schemas only.
        chat_template: render prompts with this template instead of the model's own (e.g.
            :func:`pocket_agent.runtime.chatml_template` for the Qwen tool format).
        adapter: the tools LoRA switched on while the agent generates: ``"auto"`` (default)
            the one shipped for the model, if any; a GGUF LoRA's path (``pocket-agent tune
            tools``); ``None`` for the base model. An adapter that records a calibrated
            routing constant (``pocket_agent.call_bias``) routes on its own weights with
            that constant; one that records none writes the calls and answers only, and
            the base weights route with :data:`~pocket_agent.tools.routing.CALL_BIAS`.
    """

    def __init__(
        self,
        tools: Iterable[Any] = (),
        model: Model | str | None = None,
        instructions: str | None = None,
        output: Any = None,
        *,
        tool_choice: str = "auto",
        parallel_tool_calls: bool = True,
        max_parallel_calls: int = 8,
        confirm: ConfirmCallback | None = None,
        sampling: Sampling | None = None,
        limits: Limits | None = None,
        max_tokens: int | None = None,
        call_threshold: float | None = None,
        chat_template: ChatTemplate | None = None,
        routing: Literal["scored", "sample"] = "scored",
        grounded: bool | Literal["strings", "all"] = True,
        adapter: AdapterChoice = "auto",
    ) -> None:
        self.tools = _tool_table(tools)
        check_adapter_choice(adapter)
        self.adapter = adapter
        self.limits = resolve_limits(limits, max_tokens=max_tokens)
        self.sampling = resolve_sampling(sampling)
        if isinstance(max_parallel_calls, bool) or not isinstance(max_parallel_calls, int) or max_parallel_calls < 1:
            raise InvalidInputError(f"max_parallel_calls must be a positive integer, got {max_parallel_calls!r}.")
        if instructions is not None and not isinstance(instructions, str):
            raise InvalidInputError("instructions must be a string.")
        if call_threshold is not None and not (isinstance(call_threshold, (int, float)) and 0 <= call_threshold <= 1):
            raise InvalidInputError(f"call_threshold must be a probability in [0, 1] or None, got {call_threshold!r}.")
        if confirm is not None and not callable(confirm):
            raise InvalidInputError("confirm must be a callable taking a ToolCall and returning a bool.")
        if routing not in ("scored", "sample"):
            raise InvalidInputError(f"routing must be 'scored' or 'sample', got {routing!r}.")
        if grounded not in (True, False, "strings", "all"):
            raise InvalidInputError(f"grounded must be True, False, 'strings' or 'all', got {grounded!r}.")
        self.routing = routing
        self.grounded = grounded
        self._router = Router()
        self._route_on_base = False
        self._more_calls_bias = 0.0
        self.tool_choice = check_tool_choice(tool_choice, self.tools)
        self._model_arg = model
        self._model: Model | None = None
        self.instructions = instructions
        self.output = output
        self._output_schema = output_schema(output)
        self.parallel_tool_calls = parallel_tool_calls
        self.max_parallel_calls = max_parallel_calls
        self.confirm = confirm
        self.call_threshold = None if call_threshold is None else float(call_threshold)
        self.chat_template = chat_template
        self._grammars: dict[str, CompiledGrammar] = {}
        self._start_sets: tuple[NDArray[np.int64], NDArray[np.int64]] | None = None
        self._router_for: Path | None = None

    @property
    def max_steps(self) -> int:
        return self.limits.max_steps

    # -- model and grammar -------------------------------------------------------------------

    @property
    def model(self) -> Model:
        """The model this agent drives (resolved, and loaded if needed, on first use)."""
        if self._model is None:
            from ..runtime import resolve_model

            self._model = resolve_model(self._model_arg)
        return self._model

    @contextmanager
    def _adapter_on(self) -> Iterator[None]:
        """The tools LoRA on while the agent scores and generates (the model's lock held)."""
        # a tools adapter is for turns that can call tools; without tools, the base weights
        choice = self.adapter if self.tools else None
        with self.model.lock, task_adapter(self.model, choice, "tools") as lora:
            path = lora.path if lora is not None else None
            if path != self._router_for:  # the routing constant belongs to the weights
                record = adapter_record(path) if path is not None else {}
                bias = recorded_number(record, "call_bias", path)
                self._router = Router(bias if bias is not None else CALL_BIAS)
                # a tools LoRA trained on few parallel turns ends a turn after its first call
                # more readily than the request asks; its recorded constant evens that out
                self._more_calls_bias = recorded_number(record, "more_calls_bias", path) or 0.0
                # CALL_BIAS belongs to the base weights: an adapter without its own constant
                # is not routed on
                self._route_on_base = path is not None and bias is None
                self._router_for = path
            yield

    def grammar_text(
        self,
        tool_choice: str | None = None,
        *,
        ground_text: str | None = None,
        exclude: Iterable[str] = (),
        single: bool = False,
    ) -> str:
        """The Lark grammar that constrains one turn under ``tool_choice`` (with string
        arguments grounded in ``ground_text`` when given, no calls of the tools named in
        ``exclude``, and with ``single`` one call at most)."""
        left_out = set(exclude)
        return build_grammar(
            [t for t in self.tools.values() if t.name not in left_out],
            tool_choice=self.tool_choice if tool_choice is None else tool_choice,
            output=self._output_schema,
            max_calls=self.max_parallel_calls if self.parallel_tool_calls and not single else 1,
            max_string_chars=self.limits.max_string_chars,
            max_array_items=self.limits.max_array_items,
            model=self.model,
            ground_text=ground_text,
            ground_numbers=self.grounded == "all",
        )

    def _turn_grammar(
        self, choice: str, messages: Sequence[Mapping[str, Any]], exclude: Sequence[str] = ()
    ) -> CompiledGrammar:
        """The cached grammar for ``choice``, or one grounded in the user's last message,
        without the tools in ``exclude``, or of one call where the request asks for one
        (:func:`~pocket_agent.tools.routing.asks_for_several`)."""
        request = last_user_text(messages) if choice != "none" and self.tools else None
        text = request if self.grounded else None
        exclude = exclude if choice != "none" else ()
        single = request is not None and messages[-1].get("role") == "user" and not asks_for_several(request)
        if text is None and not exclude and not single:
            return self.grammar(choice)
        from ..grammars import GrammarSpec, compile_spec

        lark = self.grammar_text(choice, ground_text=text, exclude=exclude, single=single)
        if lark == self.grammar_text(choice):
            return self.grammar(choice)
        import llguidance as llg

        spec = GrammarSpec("lark", llg.LLMatcher.grammar_from_lark(lark), source=lark)
        return compile_spec(spec, self.model, cache=False)

    def route(self, messages: Sequence[Mapping[str, Any]]) -> Routing:
        """The scored decision between answering and each tool for the next turn after
        ``messages`` (what ``routing="scored"`` uses; nothing is generated).

        The first turn of a request is calibrated against a content-free question (a small
        model's raw call probability says little about the question). A turn that follows
        tool results compares the options' plain scores: the results are there to be
        answered from, so the agent calls again only where the model itself prefers to.
        A tool that needs a number no user message or tool result states is not chosen
        (:func:`~pocket_agent.tools.routing.needs_unstated_number`).
        """
        if not self.tools:
            raise InvalidInputError("Routing needs at least one tool.")
        ids = self.prompt_ids(messages)
        after_results = bool(messages) and messages[-1].get("role") == "tool"
        neutral = [] if after_results else self.prompt_ids(neutral_messages(messages))
        source = source_text(messages)
        unstated = [t.name for t in self.tools.values() if needs_unstated_number(t, source)]
        with self._adapter_on():
            base = task_adapter(self.model, None, "tools") if self._route_on_base else nullcontext()
            with base:
                return self._router.route(
                    self.model,
                    list(self.tools.values()),
                    ids,
                    neutral,
                    self._start_token_sets,
                    calibrate=not after_results,
                    unstated=unstated,
                )

    def _call_key(self, body: str) -> str | None:
        """What makes a call new: its tool and the arguments not picked from the schema's
        choices (a second call changing only an enum or boolean, e.g. ``unit``, adds nothing
        the user asked for and ends the turn like a verbatim repeat)."""
        return call_key(body, self.tools)

    def _start_token_sets(self) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        if self._start_sets is None:
            from ..grammars import allowed_tokens

            auto = allowed_tokens(self.grammar("auto").matcher().compute_mask())
            calls = allowed_tokens(self.grammar("required").matcher().compute_mask())
            self._start_sets = (auto, calls)
        return self._start_sets

    def grammar(self, tool_choice: str | None = None) -> CompiledGrammar:
        """The compiled turn grammar for this agent's model (cached per tool choice)."""
        choice = self.tool_choice if tool_choice is None else check_tool_choice(tool_choice, self.tools)
        g = self._grammars.get(choice)
        if g is None:
            g = compile_lark(self.grammar_text(choice), self.model)
            self._grammars[choice] = g
        return g

    def tool_specs(self) -> list[dict[str, Any]]:
        """The registered tools as OpenAI-style specs (what the model is shown)."""
        return [t.to_openai() for t in self.tools.values()]

    # -- one turn ----------------------------------------------------------------------------

    def _messages(self, task_or_messages: str | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        if isinstance(task_or_messages, str):
            if not task_or_messages.strip():
                raise InvalidInputError("The task is empty; say what the agent should do.")
            return [{"role": "user", "content": task_or_messages}]
        if isinstance(task_or_messages, Sequence) and not isinstance(task_or_messages, bytes):
            msgs: list[dict[str, Any]] = []
            for i, m in enumerate(task_or_messages):
                if not isinstance(m, Mapping):
                    raise InvalidInputError(f"messages[{i}] must be a dict with 'role' and 'content'.")
                msgs.append(dict(m))
            if not msgs:
                raise InvalidInputError("messages is empty; give at least one message.")
            for i, m in enumerate(msgs):
                if not isinstance(m.get("role"), str):
                    raise InvalidInputError(f"messages[{i}] needs a 'role'.")
            return msgs
        raise InvalidInputError(f"task must be a string or a list of messages, got {type(task_or_messages).__name__}.")

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]], *, tool_choice: str | None = None) -> list[int]:
        """Token ids of the prompt for the next turn after ``messages``."""
        pieces = render_messages(
            self.model,
            messages,
            list(self.tools.values()),
            instructions=self.instructions,
            show_tools=bool(self.tools),
            template=self.chat_template,
        )
        return encode_pieces(self.model, pieces)

    def call_probability(self, ids: Sequence[int]) -> float:
        """Probability the model gives to starting a tool call after the prompt ``ids``,
        among the tokens the ``auto`` turn grammar allows first."""
        auto_ids, call_ids = self._start_token_sets()
        logits = self.model.prefill(list(ids)).logits[-1].astype(np.float64)
        top = float(logits[auto_ids].max())
        total = float(np.exp(logits[auto_ids] - top).sum())
        return float(np.exp(logits[call_ids] - top).sum()) / total

    def _turn(self, messages: Sequence[Mapping[str, Any]], index: int, tool_choice: str) -> Iterator[AgentEvent]:
        model = self.model
        ids = self.prompt_ids(messages)
        p_call: float | None = None
        routed: Routing | None = None
        if tool_choice == "auto" and self.tools and self.call_threshold is not None:
            p_call = self.call_probability(ids)
            tool_choice = "required" if p_call >= self.call_threshold else "none"
        elif tool_choice == "auto" and self.tools and self.routing == "scored" and model.capabilities.probabilities:
            routed = self.route(messages)
            p_call = routed.call_probability
            tool_choice = "required" if routed.calls else "none"
        grammar = self._turn_grammar(tool_choice, messages, routed.unstated if routed is not None else ())
        usage = Usage()
        tokens: list[int] = []
        finish = "grammar"
        watcher = _RepeatWatcher(self._call_key)
        cut: int | None = None
        # The tools LoRA was trained to decide and to write calls; an answer turn is written by
        # the base weights (the adapter's only answers are refusals of irrelevant requests).
        weights = task_adapter(model, None, "tools") if tool_choice == "none" and self.tools else nullcontext()
        with weights:
            # a turn of calls only: how readily it goes on to another call belongs to the weights
            end_bias = -self._more_calls_bias if tool_choice not in ("auto", "none") else 0.0
            gen = stream_tokens(
                model, ids, grammar=grammar, sampling=self.sampling, limits=self.limits, usage=usage, end_bias=end_bias
            )
            try:
                while True:
                    try:
                        ev = next(gen)
                    except StopIteration as done:
                        finish = str(done.value)
                        break
                    tokens.extend(ev.tokens)
                    yield AgentEvent("text", index, text=ev.text, forced=ev.forced)
                    cut = watcher.feed(ev.text)
                    if cut is not None:
                        # Greedy decoding of a small model tends to repeat a call verbatim; the
                        # repeat adds nothing, so the turn ends before it.
                        finish = "repeat"
                        break
            except OutputBudgetExceeded as exc:
                # A free-text answer that ran out of budget is still an answer. Of tool calls only
                # the complete ones are kept; a turn whose first call was cut off has no action.
                partial = exc.partial
                if partial.lstrip().startswith(CALL_OPEN):
                    end = partial.rfind(CALL_CLOSE)
                    if end < 0:
                        raise
                    cut = end + len(CALL_CLOSE)
                    watcher.text = partial
                elif self._output_schema is not None or not partial.strip():
                    raise
                finish = "length"
            finally:
                gen.close()
        text = model.decode(tokens)
        if cut is not None:
            text = watcher.text[:cut]
        user_text = last_user_text(messages) if self.grounded and self.tools else None
        if user_text and CALL_OPEN in text and model.capabilities.probabilities:
            text = self._choose_argument_spans(ids, tokens, text, user_text)
            text = self._choose_argument_numbers(ids, tokens, text, user_text)
        if CALL_OPEN in text:
            # two calls written differently may read the same once their arguments are chosen
            deduplicated = without_repeated_calls(text, self._call_key)
            if deduplicated != text:
                text, finish = deduplicated, "repeat"
        parsed = self._parse(text, index)
        final: Any = None
        if parsed.is_final:
            final = self._final_value(parsed.text)
        step = Step(
            index=index,
            text=text,
            tool_calls=parsed.calls,
            final=final,
            usage=usage,
            finish_reason=finish,
            call_probability=p_call,
            routing=routed,
        )
        yield AgentEvent("step", index, step=step)

    def _choose_argument_spans(self, ids: list[int], tokens: list[int], text: str, user_text: str) -> str:
        """``text`` (a turn of calls) with each grounded string argument that stops at a comma
        before a name of the request, or starts after one, set to the span the model scores
        highest as a whole value (:func:`~pocket_agent.grounding.choose_spans`): the model
        writes ``Riga`` for ``Riga, Latvia``. The chosen value is always a span of the request."""
        from ..grammars.grounding import is_grounded
        from ..grounding import choose_spans, comma_names, json_members

        edits: list[tuple[int, int, str, list[str]]] = []  # value span in text, value, longer options
        for tool, base, end in self._call_arguments(text):
            props = tool.parameters.get("properties") or {}
            for key, value, a, b in json_members(text[base:end]):
                node = props.get(key)
                if not isinstance(value, str) or not isinstance(node, Mapping) or not is_grounded(node):
                    continue
                limit = node.get("maxLength")
                options = comma_names(value, user_text)
                options = [o for o in options if not isinstance(limit, int) or len(o) <= limit]
                if options:
                    edits.append((base + a, base + b, value, options))
        for start, end, value, options in reversed(edits):  # right to left: earlier spans stay valid
            chosen, _ = choose_spans(self.model, self._prefix_ids(ids, tokens, text[: start + 1]), value, options)
            if chosen != value:
                text = text[:start] + json.dumps(chosen, ensure_ascii=False) + text[end:]
        return text

    def _choose_argument_numbers(self, ids: list[int], tokens: list[int], text: str, user_text: str) -> str:
        """``text`` (a turn of calls) with each number argument the model cut short or wrote
        without its sign (``200`` for "$200,000", ``2`` for "x = -2") set to the printed
        number it completes that scores highest as the whole value
        (:func:`~pocket_agent.grounding.choose_numbers`). Other numbers the request does
        not print are kept: a call may rightly hold a constant the model knows."""
        from ..grounding import choose_numbers

        for tool, base, end in reversed(list(self._call_arguments(text))):  # right to left
            raw = text[base:end]
            prompt = self._prefix_ids(ids, tokens, text[:base])
            chosen, _ = choose_numbers(
                self.model, prompt, raw, tool.parameters, user_text, units=True, completions=True
            )
            if chosen != raw:
                text = text[:base] + chosen + text[end:]
        return text

    def _call_arguments(self, text: str) -> Iterator[tuple[Tool, int, int]]:
        """For each call in ``text`` (a turn of calls) to a registered tool whose arguments
        are an object: the tool and where its arguments' JSON starts and ends in ``text``."""
        from ..grounding import json_members

        pos = 0
        while (open_at := text.find(CALL_OPEN, pos)) >= 0 and (close_at := text.find(CALL_CLOSE, open_at)) >= 0:
            body = open_at + len(CALL_OPEN)
            members = {key: (value, a, b) for key, value, a, b in json_members(text[body:close_at])}
            name, args = members.get("name"), members.get("arguments")
            tool = self.tools.get(name[0]) if name is not None and isinstance(name[0], str) else None
            if tool is not None and args is not None and isinstance(args[0], dict):
                yield tool, body + args[1], body + args[2]
            pos = close_at + len(CALL_CLOSE)

    def _prefix_ids(self, ids: list[int], tokens: list[int], prefix: str) -> list[int]:
        """The prompt ``ids`` and the output tokens that spell ``prefix`` (the rest of it tokenized)."""
        k, done = 0, ""
        while k < len(tokens):
            longer = self.model.decode(tokens[: k + 1])
            if not prefix.startswith(longer):
                break
            k, done = k + 1, longer
        rest = prefix[len(done) :]
        return [*ids, *tokens[:k], *(self.model.tokenize(rest) if rest else [])]

    def _parse(self, text: str, index: int) -> ParsedTurn:
        try:
            return parse_turn(text, self.tools, call_id_prefix=f"call_{index}_")
        except ToolArgumentError as exc:  # the grammar makes this unreachable; never act on a bad call
            raise GenerationError(f"The model produced a malformed tool call despite the grammar: {exc}") from exc

    def _final_value(self, text: str) -> Any:
        if self._output_schema is None:
            return text.strip()
        data = json.loads(text)
        out = self.output
        try:
            if isinstance(out, type) and issubclass(out, BaseModel):
                return out.model_validate(data)
            if out is not None and not isinstance(out, Mapping):
                return TypeAdapter(out).validate_python(data)
        except ValidationError as exc:
            raise GenerationError(f"The final answer does not validate against the output type: {exc}") from exc
        return data

    def step(self, task_or_messages: str | Sequence[Mapping[str, Any]], *, tool_choice: str | None = None) -> Step:
        """The model's next action for a task or conversation, without executing anything.

        Returns a :class:`Step` whose ``tool_calls`` (validated, registered tools only) or
        ``final`` answer say what the model would do. Use it for human-in-the-loop flows
        (inspect, then :meth:`execute`) and for evaluation.
        """
        messages = self._messages(task_or_messages)
        choice = self.tool_choice if tool_choice is None else check_tool_choice(tool_choice, self.tools)
        step: Step | None = None
        with self._adapter_on():
            for ev in self._turn(messages, 0, choice):
                if ev.kind == "step":
                    step = ev.step
        assert step is not None
        return step

    # -- running tools -----------------------------------------------------------------------

    def execute(self, call: ToolCall) -> ToolResult:
        """Run one call under the agent's rules (registered tools only, confirmation,
        timeout, errors as observations, truncation)."""
        t0 = time.perf_counter()

        def done(status: ResultStatus, content: str, *, output: Any = None, error: str | None = None) -> ToolResult:
            text, cut = truncate(content, self.limits.max_result_chars)
            return ToolResult(
                call=call,
                status=status,
                content=text,
                output=output,
                error=error,
                truncated=cut,
                duration_s=time.perf_counter() - t0,
            )

        tool = self.tools.get(call.name)
        if tool is None:
            msg = f"There is no tool named {call.name!r}. Available: {', '.join(sorted(self.tools)) or 'none'}."
            return done("error", f"Error: {msg}", error=msg)
        try:
            kwargs = tool.validate(call.arguments)
        except ToolArgumentError as exc:
            return done("error", f"Error: {exc}", error=str(exc))
        if tool.confirm:
            approved = False
            reason = "no confirmation callback is configured"
            if self.confirm is not None:
                try:
                    approved = bool(self.confirm(call))
                    reason = "the user denied it"
                except Exception as exc:
                    reason = f"the confirmation callback failed ({type(exc).__name__}: {exc})"
            if not approved:
                msg = f"The call to {call.name} was not run: {reason}."
                return done("denied", f"Error: {msg}", error=msg)
        timeout = self.limits.tool_timeout
        status, value, err = _run_with_timeout(lambda: tool.call_validated(kwargs), timeout, call.name)
        if status == "ok":
            return done("ok", _to_content(value), output=value)
        if status == "timeout":
            msg = f"{call.name} did not finish within {timeout:g} s and was abandoned."
            return done("timeout", f"Error: {msg}", error=msg)
        assert err is not None
        msg = f"{type(err).__name__}: {err}"
        return done("error", f"Error: {msg}", error=msg)

    # -- the loop ----------------------------------------------------------------------------

    def _loop(self, task: str | Sequence[Mapping[str, Any]]) -> Iterator[AgentEvent]:
        messages = self._messages(task)
        with self._adapter_on():  # one run at a time per model, tool calls included
            yield from self._steps(messages)

    def _steps(self, messages: list[dict[str, Any]]) -> Iterator[AgentEvent]:
        steps: list[Step] = []
        choice = self.tool_choice
        for index in range(self.max_steps):
            step: Step | None = None
            for ev in self._turn(messages, index, choice):
                if ev.kind == "step":
                    step = ev.step
                yield ev
            assert step is not None
            if choice != "none":
                choice = "auto"
            steps.append(step)
            if step.is_final:
                messages.append({"role": "assistant", "content": step.text})
                result = RunResult.of(step.final, steps, messages)
                yield AgentEvent("final", index, run=result)
                return
            messages.append(
                {"role": "assistant", "content": "", "tool_calls": [c.to_message() for c in step.tool_calls]}
            )
            t0 = time.perf_counter()
            for call in step.tool_calls:
                yield AgentEvent("tool_call", index, call=call)
                res = self.execute(call)
                step.results.append(res)
                messages.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": res.content})
                yield AgentEvent("tool_result", index, call=call, result=res)
            step.usage.tools_s += time.perf_counter() - t0
            step.usage.tool_calls += len(step.tool_calls)
        raise MaxStepsExceeded(
            f"The agent took {self.max_steps} steps without a final answer; raise limits.max_steps or simplify the "
            f"task. "
            f"The steps so far are on .steps.",
            steps=steps,
            messages=messages,
        )

    def stream(self, task: str | Sequence[Mapping[str, Any]]) -> Iterator[AgentEvent]:
        """Run the loop, yielding :class:`AgentEvent` objects as they happen; the last one
        has ``kind == "final"`` and carries the :class:`RunResult`."""
        yield from self._loop(task)

    def run(self, task: str | Sequence[Mapping[str, Any]], *, on_event: EventCallback | None = None) -> RunResult:
        """Run the loop until the model answers.

        Args:
            task: the user's request, or a conversation (OpenAI-style messages) to continue.
            on_event: called with every :class:`AgentEvent` as it happens.

        Raises:
            MaxStepsExceeded: no final answer within ``max_steps`` turns (carries the steps).
            OutputBudgetExceeded: the turn's first tool call (or a structured ``output``) did
                not fit in ``max_tokens``. Calls completed before the budget ran out are kept
                and run (the step's ``finish_reason`` is then ``"length"``).
        """
        result: RunResult | None = None
        for ev in self._loop(task):
            if on_event is not None:
                on_event(ev)
            if ev.kind == "final":
                result = ev.run
        assert result is not None
        return result

    def __repr__(self) -> str:
        return f"<Agent tools={list(self.tools)} max_steps={self.max_steps}>"


class _RepeatWatcher:
    """Watches a turn's text and reports where a tool call repeats an earlier one: verbatim,
    or (with ``key``) in every argument that does not come from the schema's choices."""

    def __init__(self, key: Callable[[str], str | None] | None = None) -> None:
        self.text = ""
        self._closed = 0
        self._seen: list[str] = []
        self._key = key

    def feed(self, piece: str) -> int | None:
        self.text += piece
        n = self.text.count(CALL_CLOSE)
        if n == self._closed:
            return None
        self._closed = n
        end = self.text.rfind(CALL_CLOSE)
        start = self.text.rfind(CALL_OPEN, 0, end)
        if start < 0:
            return None
        body = " ".join(self.text[start + len(CALL_OPEN) : end].split())
        if self._key is not None:
            body = self._key(body) or body
        if body in self._seen:
            return len(self.text[:start].rstrip("\n"))
        self._seen.append(body)
        return None


def without_repeated_calls(text: str, key: Callable[[str], str | None]) -> str:
    """``text`` (a turn of calls) with every call that repeats an earlier one (by ``key``, else
    verbatim) left out; the text itself when nothing repeats."""
    blocks = list(re.finditer(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), text, re.DOTALL))
    seen: set[str] = set()
    kept: list[str] = []
    for block in blocks:
        body = " ".join(block.group(1).split())
        ident = key(body) or body
        if ident not in seen:
            seen.add(ident)
            kept.append(block.group(0))
    return "\n".join(kept) if len(kept) < len(blocks) else text


def _run_with_timeout(
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


def compile_lark(grammar: str, model: Model) -> CompiledGrammar:
    """Compile a Lark grammar for ``model`` through :mod:`pocket_agent.grammars` (cached there)."""
    from ..grammars import Lark, compile_grammar

    return compile_grammar(Lark(grammar), model)
