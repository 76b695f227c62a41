"""The agent loop: ask the model for its next action under the tool-call grammar, run the
calls, feed the results back, until the model answers.

:class:`Agent` orchestrates the parts, each a module of its own: routing (answer or which tool,
:mod:`.routing`), the turn's grammar and decoding (:mod:`.turn`), argument grounding
(:mod:`.arguments`) and running the calls (:mod:`.execute`).

Safety rules the loop keeps:

- only registered tools run; a call to anything else (possible only through
  :meth:`Agent.execute` with hand-made calls) becomes an error observation;
- tool results are data: they go back in the ``tool`` role, are tokenized as plain text
  (a result cannot inject control tokens) and are never parsed or acted on by the library;
- a tool marked ``confirm=True`` runs only if the ``confirm`` callback approves the call;
- a tool that raises, times out or is denied becomes an error observation, not a crash.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, TypedDict, TypeVar, overload

import numpy as np
from typing_extensions import Unpack

from ..errors import GenerationError, InvalidInputError, MaxStepsExceeded, ToolArgumentError, ToolsFailedError
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
from .answer import (
    ANSWER_MODES,
    AnswerMode,
    failure_answer,
    final_value,
    is_error,
    result_facts,
    trailing_tool_messages,
)
from .arguments import ground_arguments
from .execute import execute_call, tool_table
from .format import (
    CALL_OPEN,
    ParsedTurn,
    ToolCall,
    as_messages,
    check_tool_choice,
    output_schema,
    parse_turn,
    render_messages,
)
from .relevance import relevance, relevant_tools
from .results import AgentEvent, ConfirmCallback, EventCallback, FinalT, RunResult, Step, ToolResult
from .routing import (
    CALL_BIAS,
    Router,
    Routing,
    call_key,
    last_user_text,
    needs_unstated_number,
    neutral_messages,
    source_text,
)
from .turn import DecodedTurn, TurnGrammars, decode_turn, without_repeated_calls

if TYPE_CHECKING:
    from ..grammars.compiler import CompiledGrammar
    from ..runtime import ChatTemplate, Model

__all__ = ["Agent", "AgentEvent", "RunResult", "Step", "ToolResult"]


OutputT = TypeVar("OutputT")


class AgentOptions(TypedDict, total=False):
    """The keyword options of :class:`Agent` besides ``output`` and ``answer`` (for typing)."""

    tool_choice: str
    parallel_tool_calls: bool
    max_parallel_calls: int
    confirm: ConfirmCallback | None
    sampling: Sampling | None
    limits: Limits | None
    max_tokens: int | None
    call_threshold: float | None
    chat_template: ChatTemplate | None
    routing: Literal["scored", "sample"]
    grounded: bool | Literal["strings", "all"]
    adapter: AdapterChoice


class Agent(Generic[FinalT]):
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
        answer: what the run answers once tools have given results: ``"stated"`` (default) the
            model writes a one-paragraph text answer that must state the latest results' values
            (:mod:`pocket_agent.tools.answer`); ``"free"`` the model's answer, unconstrained;
            ``"result"`` no answer turn: the run ends after the first successful calls and
            ``final`` is the tool's return value (a list of them for several calls), which suits
            lookups. With any mode, a call that fails gets one more turn, in which the model sees
            the error and may call again; when that fails too, or the model answers instead, the
            final answer says plainly which tool failed and why (nothing is invented).
    """

    @overload
    def __init__(
        self: Agent[str],
        tools: Iterable[Any] = (),
        model: Model | str | None = None,
        instructions: str | None = None,
        output: None = None,
        *,
        answer: Literal["stated", "free"] = "stated",
        **options: Unpack[AgentOptions],
    ) -> None: ...

    @overload
    def __init__(
        self: Agent[OutputT],
        tools: Iterable[Any],
        model: Model | str | None,
        instructions: str | None,
        output: type[OutputT],
        *,
        answer: Literal["stated", "free"] = "stated",
        **options: Unpack[AgentOptions],
    ) -> None: ...

    @overload
    def __init__(
        self: Agent[OutputT],
        tools: Iterable[Any] = (),
        model: Model | str | None = None,
        instructions: str | None = None,
        *,
        output: type[OutputT],
        answer: Literal["stated", "free"] = "stated",
        **options: Unpack[AgentOptions],
    ) -> None: ...

    @overload
    def __init__(
        self: Agent[Any],
        tools: Iterable[Any] = (),
        model: Model | str | None = None,
        instructions: str | None = None,
        output: Any = None,
        *,
        answer: AnswerMode = "stated",
        **options: Unpack[AgentOptions],
    ) -> None: ...

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
        answer: AnswerMode = "stated",
    ) -> None:
        self.tools = tool_table(tools)
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
        if answer not in ANSWER_MODES:
            raise InvalidInputError(f"answer must be one of {', '.join(ANSWER_MODES)}; got {answer!r}.")
        self.answer = answer
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
        self._turn_grammars: TurnGrammars | None = None
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

    @property
    def turn_grammars(self) -> TurnGrammars:
        """The grammars of this agent's turns for its model (built on first use)."""
        if self._turn_grammars is None:
            self._turn_grammars = TurnGrammars(
                tools=self.tools,
                tool_choice=self.tool_choice,
                output_schema=self._output_schema,
                max_calls=self.max_parallel_calls if self.parallel_tool_calls else 1,
                limits=self.limits,
                ground_numbers=self.grounded == "all",
                model=self.model,
            )
        return self._turn_grammars

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
        choice = self.tool_choice if tool_choice is None else tool_choice
        return self.turn_grammars.text(choice, ground_text=ground_text, exclude=exclude, single=single)

    def turn_grammar(
        self,
        choice: str,
        messages: Sequence[Mapping[str, Any]],
        exclude: Sequence[str] = (),
        *,
        answer_facts: Sequence[str] = (),
    ) -> CompiledGrammar:
        """The grammar of the next turn after ``messages`` under ``choice`` (see
        :meth:`TurnGrammars.for_turn <pocket_agent.tools.turn.TurnGrammars.for_turn>`)."""
        return self.turn_grammars.for_turn(
            choice, messages, grounded=bool(self.grounded), exclude=exclude, answer_facts=answer_facts
        )

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
                    self.turn_grammars.start_token_sets,
                    calibrate=not after_results,
                    unstated=unstated,
                )

    def relevant_tools(self, request: str) -> list[str]:
        """The tools whose descriptions fit ``request`` (:mod:`pocket_agent.tools.relevance`,
        scored on the base weights); empty when it asks for a plain answer."""
        with task_adapter(self.model, None, "tools"):
            return relevant_tools(relevance(self.model, list(self.tools.values()), request))

    def _call_key(self, body: str) -> str | None:
        """What makes a call new: its tool and the arguments not picked from the schema's
        choices (a second call changing only an enum or boolean, e.g. ``unit``, adds nothing
        the user asked for and ends the turn like a verbatim repeat)."""
        return call_key(body, self.tools)

    def grammar(self, tool_choice: str | None = None) -> CompiledGrammar:
        """The compiled turn grammar for this agent's model (cached per tool choice)."""
        return self.turn_grammars.compiled(tool_choice)

    def tool_specs(self) -> list[dict[str, Any]]:
        """The registered tools as OpenAI-style specs (what the model is shown)."""
        return [t.to_openai() for t in self.tools.values()]

    # -- one turn ----------------------------------------------------------------------------

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
        auto_ids, call_ids = self.turn_grammars.start_token_sets()
        logits = self.model.prefill(list(ids)).logits[-1].astype(np.float64)
        top = float(logits[auto_ids].max())
        total = float(np.exp(logits[auto_ids] - top).sum())
        return float(np.exp(logits[call_ids] - top).sum()) / total

    def _choose(
        self, messages: Sequence[Mapping[str, Any]], ids: list[int], tool_choice: str
    ) -> tuple[str, float | None, Routing | None, list[str]]:
        """How the next turn is constrained: its tool choice, the call probability and routing
        that decided it (under ``auto``), and the tools left out of it."""
        if tool_choice != "auto" or not self.tools:
            return tool_choice, None, None, []
        if self.call_threshold is not None:
            p_call = self.call_probability(ids)
            return ("required" if p_call >= self.call_threshold else "none"), p_call, None, []
        if self.routing != "scored" or not self.model.capabilities.probabilities:
            return tool_choice, None, None, []
        routed = self.route(messages)
        request = last_user_text(messages) if messages[-1].get("role") == "user" else None
        if not routed.calls:
            return "none", routed.call_probability, routed, []
        if not request:
            return "required", routed.call_probability, routed, []
        # a request no tool's description fits is answered; the calls go to the tools it fits
        fits = self.relevant_tools(request)
        off_topic = [name for name in self.tools if name not in fits]
        return ("required" if fits else "none"), routed.call_probability, routed, off_topic

    def _turn(self, messages: Sequence[Mapping[str, Any]], index: int, tool_choice: str) -> Iterator[AgentEvent]:
        model = self.model
        ids = self.prompt_ids(messages)
        tool_choice, p_call, routed, off_topic = self._choose(messages, ids, tool_choice)
        request = last_user_text(messages) or ""
        results = trailing_tool_messages(messages)
        answers_text = tool_choice != "required" and tool_choice not in self.tools and self._output_schema is None
        if answers_text and results and all(is_error(m.get("content")) for m in results) and tool_choice == "none":
            # the latest calls failed and the model does not try again: say so, invent nothing
            yield from self._composed_step(index, failure_answer(messages, source_text(messages)), p_call, routed)
            return
        facts = result_facts(messages, request) if answers_text and self.answer == "stated" else []
        exclude = [*(routed.unstated if routed is not None else ()), *off_topic]
        grammar = self.turn_grammar(tool_choice, messages, exclude, answer_facts=facts)
        usage = Usage()
        # The tools LoRA was trained to decide and to write calls; an answer turn is written by
        # the base weights (the adapter's only answers are refusals of irrelevant requests).
        weights = task_adapter(model, None, "tools") if tool_choice == "none" and self.tools else nullcontext()
        with weights:
            # a turn of calls only: how readily it goes on to another call belongs to the weights
            end_bias = -self._more_calls_bias if tool_choice not in ("auto", "none") else 0.0
            decoded = yield from self._decode(ids, grammar, usage, index, end_bias)
        text, finish = decoded.text, decoded.finish
        if request and self.grounded and self.tools and CALL_OPEN in text and model.capabilities.probabilities:
            text = ground_arguments(model, self.tools, ids, decoded.tokens, text, request)
        if CALL_OPEN in text:
            # two calls written differently may read the same once their arguments are chosen
            deduplicated = without_repeated_calls(text, self._call_key)
            if deduplicated != text:
                text, finish = deduplicated, "repeat"
        parsed = self._parse(text, index)
        final: Any = None
        if parsed.is_final:
            final = final_value(parsed.text, self.output, self._output_schema)
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

    def _composed_step(
        self, index: int, text: str, p_call: float | None, routed: Routing | None
    ) -> Iterator[AgentEvent]:
        """A final turn the library writes instead of the model (``finish_reason="tool_error"``)."""
        yield AgentEvent("text", index, text=text, forced=True)
        step = Step(
            index=index,
            text=text,
            tool_calls=[],
            final=text,
            finish_reason="tool_error",
            call_probability=p_call,
            routing=routed,
        )
        yield AgentEvent("step", index, step=step)

    def _decode(
        self, ids: list[int], grammar: CompiledGrammar, usage: Usage, index: int, end_bias: float
    ) -> Generator[AgentEvent, None, DecodedTurn]:
        """Decode one turn, yielding its text as events; returns the :class:`~.turn.DecodedTurn`."""
        gen = decode_turn(
            self.model,
            ids,
            grammar,
            sampling=self.sampling,
            limits=self.limits,
            usage=usage,
            call_key=self._call_key,
            answer_may_be_cut=self._output_schema is None,
            end_bias=end_bias,
        )
        try:
            while True:
                try:
                    text, forced = next(gen)
                except StopIteration as done:
                    decoded: DecodedTurn = done.value
                    return decoded
                yield AgentEvent("text", index, text=text, forced=forced)
        finally:
            gen.close()  # releases the model's lock when the run stops early

    def _parse(self, text: str, index: int) -> ParsedTurn:
        try:
            return parse_turn(text, self.tools, call_id_prefix=f"call_{index}_")
        except ToolArgumentError as exc:  # the grammar makes this unreachable; never act on a bad call
            raise GenerationError(f"The model produced a malformed tool call despite the grammar: {exc}") from exc

    def step(self, task_or_messages: str | Sequence[Mapping[str, Any]], *, tool_choice: str | None = None) -> Step:
        """The model's next action for a task or conversation, without executing anything.

        Returns a :class:`Step` whose ``tool_calls`` (validated, registered tools only) or
        ``final`` answer say what the model would do. Use it for human-in-the-loop flows
        (inspect, then :meth:`execute`) and for evaluation.
        """
        messages = as_messages(task_or_messages)
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
        return execute_call(self.tools, call, limits=self.limits, confirm=self.confirm)

    # -- the loop ----------------------------------------------------------------------------

    def _loop(self, task: str | Sequence[Mapping[str, Any]]) -> Iterator[AgentEvent]:
        messages = as_messages(task)
        with self._adapter_on():  # one run at a time per model, tool calls included
            yield from self._steps(messages)

    def _steps(self, messages: list[dict[str, Any]]) -> Iterator[AgentEvent]:
        steps: list[Step] = []
        choice = self.tool_choice
        failures = 0  # turns whose calls failed: one retry, then a plain answer saying so
        for index in range(self.max_steps):
            step: Step | None = None
            if failures > 1 and self._output_schema is not None:  # no object can be given: say why
                raise ToolsFailedError(failure_answer(messages, source_text(messages)), steps=steps, messages=messages)
            if failures > 1:  # the retry failed too: say so instead of another turn
                turn = self._composed_step(index, failure_answer(messages, source_text(messages)), None, None)
            else:
                turn = self._turn(messages, index, choice)
            for ev in turn:
                step = ev.step or step
                yield ev
            assert step is not None
            if choice != "none":
                choice = "auto"
            steps.append(step)
            if step.is_final:
                messages.append({"role": "assistant", "content": step.text})
                yield AgentEvent("final", index, run=RunResult.of(step.final, steps, messages))
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
            if not all(r.ok for r in step.results):
                failures += 1
            elif self.answer == "result":
                outputs = [r.output for r in step.results]
                final = outputs[0] if len(outputs) == 1 else outputs
                yield AgentEvent("final", index, run=RunResult.of(final, steps, messages))
                return
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

    def run(
        self, task: str | Sequence[Mapping[str, Any]], *, on_event: EventCallback | None = None
    ) -> RunResult[FinalT]:
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
        result: RunResult[FinalT] | None = None
        for ev in self._loop(task):
            if on_event is not None:
                on_event(ev)
            if ev.kind == "final":
                result = ev.run
        assert result is not None
        return result

    def __repr__(self) -> str:
        return f"<Agent tools={list(self.tools)} max_steps={self.max_steps}>"
