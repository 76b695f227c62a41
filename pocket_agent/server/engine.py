"""The model side of the server: each request's work as a generator of events, run on
the one model thread.

It calls the same public entry points application code calls: :class:`pocket_agent.Agent`
(one turn, :meth:`Agent.stream` stopped after the turn, so nothing is executed: OpenAI
tools have no Python implementation here), :func:`pocket_agent.grammars.compile_grammar`
to check schemas before any token is generated, :func:`pocket_agent.extract_stream` and
:func:`pocket_agent.decide`. Between two events the caller's ``check`` runs, so a client
that went away or a request past its deadline stops the generation at the next token.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from ..decision import decide
from ..errors import ContextOverflowError, OutputBudgetExceeded, SchemaError, UnsupportedSchemaError
from ..extraction import extract_stream
from ..grammars import CompiledGrammar, compile_grammar
from ..options import Sampling
from ..runtime import Model
from ..tools import Agent, Step, Tool
from ..tools.format import CALL_OPEN
from .protocol import APIError, CallOut, ChatJob, Reply, new_id
from .structured import StructuredRoute, structured_reply, structured_route
from .unique_keys import unique_keys

Check = Callable[[], None]
"""Called between two events; raises to stop the work (client gone, deadline passed)."""

EventKind = Literal["started", "content", "done"]


@dataclass(frozen=True)
class Event:
    """What the model thread reports: ``started`` (the prompt was read: errors about the
    request are over), ``content`` (answer text, in order) and ``done`` (the result)."""

    kind: EventKind
    text: str = ""
    value: Any = None


def compile_schema(schema: Any, model: Model, where: str) -> None:
    """Compile ``schema`` for ``model`` now, so that a bad or unsupported schema is a 400
    naming the request field (``where``), the feature and its JSON path."""
    try:
        compile_grammar(schema, model)
    except UnsupportedSchemaError as exc:
        feature = exc.feature or "unknown"
        path = exc.path or "#"
        raise APIError(
            400,
            f"{where} uses a feature this server cannot enforce: {feature} at {path}. {exc}",
            param=where,
            code="unsupported_schema",
        ) from None
    except SchemaError as exc:
        raise APIError(400, f"{where} is not a valid JSON Schema: {exc}", param=where, code="invalid_schema") from None


class UniqueKeysAgent(Agent[Any]):
    """An :class:`Agent` whose turns never repeat a key in a JSON object (a structured answer
    under ``json_object``, an open schema, or a call's arguments): see :mod:`.unique_keys`."""

    def turn_grammar(
        self,
        choice: str,
        messages: Sequence[Mapping[str, Any]],
        exclude: Sequence[str] = (),
        *,
        answer_facts: Sequence[str] = (),
    ) -> CompiledGrammar:
        """The turn's grammar (see :meth:`Agent.turn_grammar`), its objects' keys unique."""
        grammar = super().turn_grammar(choice, messages, exclude, answer_facts=answer_facts)
        return unique_keys(grammar, self.model)


def _counts(step: Step) -> tuple[int, int]:
    """Prompt and completion tokens of an agent step."""
    return step.usage.prompt_tokens, step.usage.completion_tokens


class ChatTurn:
    """One chat completion: the model's next turn for an OpenAI conversation.

    Args:
        model: the loaded model.
        job: the validated request.
        call_threshold: passed to :class:`Agent` under ``tool_choice="auto"``.
    """

    def __init__(self, model: Model, job: ChatJob, *, call_threshold: float | None = None) -> None:
        self.model = model
        self.job = job
        self.call_threshold = call_threshold

    def _agent(self, tools: list[Tool], schema: Any, max_tokens: int) -> Agent[Any]:
        job = self.job
        # A JSON answer (json_object, or a schema answered turn by turn) never repeats a key.
        agent_type = UniqueKeysAgent if schema is not None else Agent
        return agent_type(
            tools=tools,
            model=self.model,
            output=schema,
            tool_choice=job.tool_choice,
            parallel_tool_calls=job.parallel_tool_calls,
            # A named tool_choice asks for that function: one call, as OpenAI's models make.
            max_parallel_calls=8 if job.parallel_tool_calls and job.tool_choice in ("auto", "required") else 1,
            max_tokens=max_tokens,
            sampling=Sampling(temperature=job.temperature, top_p=job.top_p, seed=job.seed),
            call_threshold=self.call_threshold if job.tool_choice == "auto" else None,
        )

    def _prepare(self) -> tuple[Agent[Any], int]:
        """Check schemas and the prompt's length; the agent for the turn and the prompt size."""
        job, model = self.job, self.model
        schema = job.response_schema
        if schema is False:
            raise APIError(400, "The schema `false` accepts no output.", param="response_format", code="invalid_schema")
        if schema is True:
            schema = {}
        if schema is not None:
            compile_schema(schema, model, "response_format.json_schema.schema")
        tools = []
        for i, spec in enumerate(job.tools):
            raw = spec["function"].get("parameters")
            if raw is not None:  # as sent: Tool normalises (and closes) the schema it keeps
                compile_schema(raw, model, f"tools.{i}.function.parameters")
            tools.append(Tool.from_openai(spec))
        agent = self._agent(tools, schema, job.max_tokens)
        n_prompt = len(agent.prompt_ids(job.messages))
        n_ctx = model.info.n_ctx
        room = n_ctx - n_prompt
        if not job.max_tokens_given and 0 < room < job.max_tokens:
            # No max_tokens asked for: the reply may use what the context has left.
            agent = self._agent(tools, schema, room)
        elif job.max_tokens > room:
            need = n_prompt + (job.max_tokens if job.max_tokens_given else 1)
            asked = f" and max_tokens is {job.max_tokens}" if job.max_tokens_given else ""
            raise ContextOverflowError(
                f"The prompt is {n_prompt} tokens{asked}: {need} tokens do not fit in the model's context of "
                f"{n_ctx}. Shorten the messages" + (" or lower max_tokens." if job.max_tokens_given else "."),
                needed=need,
                n_ctx=n_ctx,
            )
        return agent, n_prompt

    def events(self, check: Check) -> Iterator[Event]:
        """Run the turn, yielding :class:`Event` objects; the last is ``done`` with a :class:`Reply`."""
        route = structured_route(self.job)
        if route is not None:  # a schema's object from the user's message: extraction (structured.py)
            yield from self._structured_events(route, check)
            return
        job = self.job
        agent, n_prompt = self._prepare()
        calls_possible = bool(job.tools) and job.tool_choice != "none"
        mode: Literal["answer", "calls"] | None = None if calls_possible else "answer"
        if calls_possible and job.tool_choice != "auto":
            mode = "calls"
        stops = job.stop if job.response_schema is None else []
        hold = max((len(s) for s in stops), default=1) - 1
        seen = ""
        released = 0
        n_events = 0
        started = False
        step: Step | None = None
        finish: Literal["stop", "length", "tool_calls"] | None = None
        stream = cast(Generator[Any, None, None], agent.stream(job.messages))
        try:
            for ev in stream:
                check()
                if not started:
                    started = True
                    yield Event("started")
                if ev.kind == "step":
                    step = ev.step
                    break
                if ev.kind != "text":
                    continue
                n_events += 1
                seen += ev.text
                if mode is None:
                    head = seen.lstrip()
                    if head.startswith(CALL_OPEN):
                        mode = "calls"
                    elif not CALL_OPEN.startswith(head):
                        mode = "answer"
                if mode != "answer":
                    continue
                cut = _first_stop(seen, stops, max(0, released - hold))
                if cut is not None:
                    if cut > released:
                        yield Event("content", seen[released:cut])
                    released = cut
                    finish = "stop"
                    break
                safe = len(seen) - hold
                if safe > released:
                    yield Event("content", seen[released:safe])
                    released = safe
        except OutputBudgetExceeded as exc:
            # A structured answer or a first tool call that ran out of max_tokens: OpenAI's
            # "length" with what was written (no call is returned unless it was complete).
            if not started:
                yield Event("started")
            if mode != "calls":
                seen = exc.partial if len(exc.partial) > len(seen) else seen
                if len(seen) > released:
                    yield Event("content", seen[released:])
                released = len(seen)
            yield Event(
                "done",
                value=Reply(
                    content=seen if mode != "calls" else None,
                    tool_calls=[],
                    finish_reason="length",
                    prompt_tokens=n_prompt,
                    completion_tokens=exc.tokens,
                ),
            )
            return
        finally:
            stream.close()
        if not started:
            yield Event("started")
        if finish == "stop":  # a stop sequence ended the answer
            yield Event("done", value=Reply(seen[:released], [], "stop", n_prompt, n_events))
            return
        assert step is not None
        prompt_tokens, completion_tokens = _counts(step)
        if step.tool_calls:
            calls = [
                CallOut(id=new_id("call_"), name=c.name, arguments=json.dumps(c.arguments, ensure_ascii=False))
                for c in step.tool_calls
            ]
            yield Event("done", value=Reply(None, calls, "tool_calls", prompt_tokens, completion_tokens))
            return
        if len(seen) > released:
            yield Event("content", seen[released:])
        reason: Literal["stop", "length"] = "length" if step.finish_reason == "length" else "stop"
        yield Event("done", value=Reply(seen, [], reason, prompt_tokens, completion_tokens))

    def _structured_events(self, route: StructuredRoute, check: Check) -> Iterator[Event]:
        where = "response_format.json_schema.schema" if route.tool is None else "tools.function.parameters"
        compile_schema(route.schema, self.model, where)
        check()
        max_tokens = self.job.max_tokens if self.job.max_tokens_given else None
        reply = structured_reply(self.model, route, max_tokens, check)
        yield Event("started")
        if reply.content:
            yield Event("content", reply.content)
        yield Event("done", value=reply)


def _first_stop(text: str, stops: list[str], start: int) -> int | None:
    """Where the earliest stop sequence begins in ``text`` (searching from ``start``)."""
    hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(hits) if hits else None


def extract_events(
    model: Model, text: str, schema: dict[str, Any], instructions: str | None, max_tokens: int | None, check: Check
) -> Iterator[Event]:
    """``/v1/extract``: the validated object (``done``), checking between completed fields."""
    compile_schema(schema, model, "schema")
    value: Any = None
    started = False
    for item in extract_stream(text, schema, model=model, instructions=instructions, max_tokens=max_tokens):
        check()
        if not started:
            started = True
            yield Event("started")
        value = item
    if not started:
        yield Event("started")
    yield Event("done", value=value)


def decide_events(
    model: Model, question: str, options: list[str], context: str | None, method: str, check: Check
) -> Iterator[Event]:
    """``/v1/decide``: one forward pass, the :class:`~pocket_agent.Decision` as a dict (``done``)."""
    check()
    d = decide(question, options, context=context, model=model, method=method)  # type: ignore[arg-type]
    yield Event("started")
    yield Event(
        "done",
        value={"choice": d.choice, "index": d.index, "scores": list(d.scores), "method": d.method},
    )
