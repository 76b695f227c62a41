"""One assistant turn: the grammar that constrains it and the decoding that writes it.

:class:`TurnGrammars` builds (and caches) the Lark grammar of a turn for a tool choice, grounded
in the user's request where asked; :func:`decode_turn` streams the turn's text under it, ends a
turn of calls before a call that repeats an earlier one, and keeps what a turn that ran out of
budget completed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import OutputBudgetExceeded
from ..generate import stream_tokens
from ..options import Limits, Sampling
from ..usage import Usage
from .format import CALL_CLOSE, CALL_OPEN, build_grammar, check_tool_choice
from .routing import asks_for_several, last_user_text
from .tool import Tool

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from ..grammars.compiler import CompiledGrammar
    from ..runtime import Model


@dataclass
class TurnGrammars:
    """The turn grammars of one agent's tools, output type and limits for one model."""

    tools: Mapping[str, Tool]
    tool_choice: str
    output_schema: dict[str, Any] | None
    max_calls: int
    limits: Limits
    ground_numbers: bool
    model: Model

    def __post_init__(self) -> None:
        self._compiled: dict[str, CompiledGrammar] = {}
        self._start_sets: tuple[NDArray[np.int64], NDArray[np.int64]] | None = None

    def text(
        self,
        tool_choice: str | None = None,
        *,
        ground_text: str | None = None,
        exclude: Iterable[str] = (),
        single: bool = False,
        answer_facts: Sequence[str] = (),
    ) -> str:
        """The Lark grammar of one turn under ``tool_choice`` (string arguments grounded in
        ``ground_text`` when given, no calls of the tools named in ``exclude``, one call at
        most with ``single``, a text answer that states ``answer_facts``)."""
        left_out = set(exclude)
        return build_grammar(
            [t for t in self.tools.values() if t.name not in left_out],
            tool_choice=self.tool_choice if tool_choice is None else tool_choice,
            output=self.output_schema,
            max_calls=1 if single else self.max_calls,
            max_string_chars=self.limits.max_string_chars,
            max_array_items=self.limits.max_array_items,
            model=self.model,
            ground_text=ground_text,
            ground_numbers=self.ground_numbers,
            answer_facts=answer_facts,
        )

    def compiled(self, tool_choice: str | None = None) -> CompiledGrammar:
        """The compiled grammar of a turn under ``tool_choice`` (cached per choice)."""
        choice = self.tool_choice if tool_choice is None else check_tool_choice(tool_choice, self.tools)
        g = self._compiled.get(choice)
        if g is None:
            g = compile_lark(self.text(choice), self.model)
            self._compiled[choice] = g
        return g

    def for_turn(
        self,
        choice: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        grounded: bool,
        exclude: Sequence[str] = (),
        answer_facts: Sequence[str] = (),
    ) -> CompiledGrammar:
        """The grammar of the next turn after ``messages``: the cached one for ``choice``, or one
        grounded in the user's last message (``grounded``), without the tools in ``exclude``, of
        one call where the request asks for one
        (:func:`~pocket_agent.tools.routing.asks_for_several`), or whose answer states
        ``answer_facts``."""
        request = last_user_text(messages) if choice != "none" and self.tools else None
        text = request if grounded else None
        exclude = exclude if choice != "none" else ()
        single = request is not None and messages[-1].get("role") == "user" and not asks_for_several(request)
        if text is None and not exclude and not single and not answer_facts:
            return self.compiled(choice)
        lark = self.text(choice, ground_text=text, exclude=exclude, single=single, answer_facts=answer_facts)
        if lark == self.text(choice):
            return self.compiled(choice)
        import llguidance as llg

        from ..grammars import GrammarSpec, compile_spec

        spec = GrammarSpec("lark", llg.LLMatcher.grammar_from_lark(lark), source=lark)
        return compile_spec(spec, self.model, cache=False)

    def start_token_sets(self) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """The tokens an ``auto`` turn may start with, and those of them that start a call."""
        if self._start_sets is None:
            from ..grammars import allowed_tokens

            auto = allowed_tokens(self.compiled("auto").matcher().compute_mask())
            calls = allowed_tokens(self.compiled("required").matcher().compute_mask())
            self._start_sets = (auto, calls)
        return self._start_sets


@dataclass
class DecodedTurn:
    """What :func:`decode_turn` wrote: the output tokens, the turn's text (cut before a repeated
    call), and why it ended (``grammar``, ``stop``, ``repeat``, ``length``)."""

    tokens: list[int]
    text: str
    finish: str


def decode_turn(
    model: Model,
    ids: Sequence[int],
    grammar: CompiledGrammar,
    *,
    sampling: Sampling,
    limits: Limits,
    usage: Usage,
    call_key: Callable[[str], str | None],
    answer_may_be_cut: bool,
    end_bias: float = 0.0,
) -> Generator[tuple[str, bool], None, DecodedTurn]:
    """Stream one turn after the prompt ``ids``: yields ``(text, forced)`` pieces and returns the
    :class:`DecodedTurn`.

    Greedy decoding of a small model tends to repeat a call verbatim; the repeat adds nothing, so
    the turn ends before it. Out of budget, a turn keeps its complete calls, and a free-text
    answer is kept where ``answer_may_be_cut``; otherwise :class:`OutputBudgetExceeded` is raised.
    """
    tokens: list[int] = []
    finish = "grammar"
    watcher = RepeatWatcher(call_key)
    cut: int | None = None
    gen = stream_tokens(model, ids, grammar=grammar, sampling=sampling, limits=limits, usage=usage, end_bias=end_bias)
    try:
        while True:
            try:
                ev = next(gen)
            except StopIteration as done:
                finish = str(done.value)
                break
            tokens.extend(ev.tokens)
            yield ev.text, ev.forced
            cut = watcher.feed(ev.text)
            if cut is not None:
                finish = "repeat"
                break
    except OutputBudgetExceeded as exc:
        partial = exc.partial
        if partial.lstrip().startswith(CALL_OPEN):
            end = partial.rfind(CALL_CLOSE)
            if end < 0:
                raise  # the first call was cut off: the turn has no action
            cut = end + len(CALL_CLOSE)
            watcher.text = partial
        elif not answer_may_be_cut or not partial.strip():
            raise
        finish = "length"
    finally:
        gen.close()
    text = watcher.text[:cut] if cut is not None else model.decode(tokens)
    return DecodedTurn(tokens=tokens, text=text, finish=finish)


class RepeatWatcher:
    """Watches a turn's text and reports where a tool call repeats an earlier one: verbatim,
    or (with ``key``) in every argument that does not come from the schema's choices."""

    def __init__(self, key: Callable[[str], str | None] | None = None) -> None:
        self.text = ""
        self._closed = 0
        self._seen: list[str] = []
        self._key = key

    def feed(self, piece: str) -> int | None:
        """Add ``piece``; the length of the text before a call that repeats an earlier one, if
        ``piece`` closed such a call."""
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


def compile_lark(grammar: str, model: Model) -> CompiledGrammar:
    """Compile a Lark grammar for ``model`` through :mod:`pocket_agent.grammars` (cached there)."""
    from ..grammars import Lark, compile_grammar

    return compile_grammar(Lark(grammar), model)
