"""Routing under ``tool_choice="auto"``: answer, or call which tool, as one scored decision.

A small model asked to choose by sampling its first token almost never starts a tool
call (SmolLM2-135M puts 0.1-5% on ``<tool_call>``), whatever the question. Routing here
scores every option by the model's own probability of the continuation that commits to
it, in one pass over the prompt:

* ``answer``: the probability of a first token that starts an answer (among the tokens
  the turn grammar allows first);
* each tool ``t``: the probability of ``<tool_call>\\n{"name": "t", "arguments":``, the
  whole continuation, summed over the tokens a call is written with (:func:`call_tokens`).

Raw probabilities of a small model mostly say how often it calls tools at all. What
carries the question's signal is how much *this* question moves them, so each score is
taken relative to the same prompt with a content-free question
(:data:`NEUTRAL_QUESTION`; "contextual calibration", Zhao et al. 2021): for a tool,
``log p(call t | question) - log p(call t | neutral)``, and likewise for answering. The
option with the highest calibrated score wins, tools with :data:`CALL_BIAS` added.

:data:`CALL_BIAS` is one constant for every user, fitted once on the BFCL development
split (rows 15-29 of every category, disjoint from the rows ``bench/bfcl.py`` scores) by
``bench/bfcl_calibrate.py``; see ``bench/bfcl.md``.

A tool with a required number parameter is not offered when the user's messages state no
number at all (:func:`needs_unstated_number`): its call could only hold a number the model
made up. SmolLM2-135M otherwise answers "the fastest route from New York to Boston" with
``prime_numbers_in_range(start=10, end=100)``. Likewise when the parameter's description
names a unit and the request states only numbers of other units: "the area of a triangle
with base 10 meters and height 5 meters" does not go to
``determine_body_mass_index(weight: "in kilograms", height)``. A parameter whose number is not expected
from the request opts out with ``"x-grounded": false``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .format import CALL_CLOSE, CALL_OPEN, ToolCall

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from ..runtime import Model
    from .tool import Tool

ANSWER = "answer"
"""The routing option that answers without calling a tool."""

NEUTRAL_QUESTION = "N/A"
"""The content-free question whose scores calibrate every decision."""

CALL_BIAS = 8.38
"""Added to every tool's calibrated score (log scale); fitted on the BFCL dev split with the
default model as it ran then (its Q8_0 copy): best interval 7.95-8.81, balanced accuracy 0.913.
On the BF16 copy (layout "auto" on CPUs with AVX512-BF16) BFCL rows 0-9 score the same 0.50,
irrelevance 0.80, so the constant stands for both."""


@dataclass(frozen=True)
class Routing:
    """How the agent chose between answering and each tool.

    ``choice`` is ``"answer"`` or a tool name. ``scores`` maps every option to its
    probability (softmax of ``logits``, the calibrated log-scores the choice maximised).
    ``raw`` holds the uncalibrated log-probabilities of each option's continuation after
    the real prompt, ``call_probability`` the probability of starting any call, and
    ``unstated`` the tools left out of the choice (score 0) because each needs a number
    the request does not state.
    """

    choice: str
    scores: dict[str, float]
    logits: dict[str, float] = field(default_factory=dict)
    raw: dict[str, float] = field(default_factory=dict)
    call_probability: float = 0.0
    unstated: tuple[str, ...] = ()
    """Tools not offered: each needs a number the user's messages do not state."""

    @property
    def calls(self) -> bool:
        """True when the decision is to call a tool."""
        return self.choice != ANSWER

    @property
    def confidence(self) -> float:
        """Probability of the chosen option."""
        return self.scores[self.choice]


def _log_softmax(row: NDArray[np.floating]) -> NDArray[np.float64]:
    x = row.astype(np.float64)
    m = float(np.max(x[np.isfinite(x)]))
    return x - (m + math.log(float(np.exp(x - m).sum())))


def _logsumexp(vals: NDArray[np.float64]) -> float:
    if vals.size == 0:
        return -math.inf
    m = float(vals.max())
    if not math.isfinite(m):
        return m
    return m + math.log(float(np.exp(vals - m).sum()))


def call_text(name: str) -> str:
    """The continuation that commits to calling ``name``."""
    return CALL_OPEN + '\n{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments":'


def call_tokens(model: Model, name: str) -> list[int]:
    """Token ids of :func:`call_text` as the model writes them inside a whole call.

    Tokenizing the prefix alone can end on a token the model never writes there (SmolLM2:
    ``"arguments"`` ends with a lone ``"`` where a call writes ``":``, a token the tuned model
    gives e^-13), which would charge every tool an artefact. So the whole call is tokenized and
    its longest token prefix whose text lies inside :func:`call_text` is kept.
    """
    text = call_text(name)
    prefix = text.encode("utf-8")
    whole = model.tokenize(f"{CALL_OPEN}\n{ToolCall(name=name).to_json()}\n{CALL_CLOSE}", special=True)
    kept: list[int] = []
    for tok in whole:
        if not prefix.startswith(model.detokenize([*kept, tok])):
            break
        kept.append(tok)
    if json.dumps(name, ensure_ascii=False).encode("utf-8") not in model.detokenize(kept):
        return model.tokenize(text, special=True)  # text and tokens did not line up
    return kept


def option_log_probs(
    model: Model,
    prompt: Sequence[int],
    tools: Sequence[Tool],
    first_allowed: NDArray[np.int64],
    call_first: NDArray[np.int64],
    call_tokens: Sequence[Sequence[int]],
) -> dict[str, float]:
    """Log-probability of each option's continuation after ``prompt``.

    The first token is scored among ``first_allowed`` (what the turn grammar admits);
    ``answer`` gets the mass of the allowed first tokens that do not start a call
    (``call_first``); a tool gets the log-probability of its call tokens (the first one
    renormalised over ``first_allowed`` like the others).
    """
    ids = list(prompt)
    first = model.prefill(ids).logits[-1]
    allowed_lp = _log_softmax(first[first_allowed])
    lp_first = np.full(first.shape[0], -np.inf)
    lp_first[first_allowed] = allowed_lp
    answer_ids = np.setdiff1d(first_allowed, call_first)
    out = {ANSWER: _logsumexp(lp_first[answer_ids])}
    base = len(ids)
    for tool, toks in zip(tools, call_tokens, strict=True):
        total = float(lp_first[toks[0]])
        if len(toks) > 1:
            res = model.eval(list(toks[:-1]), logits="all")
            model.rollback(base)
            for j, tok in enumerate(toks[1:]):
                total += float(_log_softmax(res.logits[j])[tok])
        out[tool.name] = total
    return out


def decide_route(
    question: dict[str, float],
    neutral: dict[str, float],
    *,
    bias: float = CALL_BIAS,
    unstated: Sequence[str] = (),
) -> Routing:
    """The calibrated decision from the option log-probabilities after the real and the
    neutral prompt; the tools in ``unstated`` are never chosen."""
    logits = {}
    for name, lp in question.items():
        cal = lp - neutral.get(name, 0.0)
        logits[name] = cal if name == ANSWER else (-math.inf if name in unstated else cal + bias)
    vals = np.asarray(list(logits.values()), dtype=np.float64)
    if not np.isfinite(vals).any():  # nothing scores: answering is the safe default
        logits[ANSWER] = vals[list(logits).index(ANSWER)] = 0.0
    probs = np.exp(vals - vals.max())
    probs /= probs.sum()
    names = list(logits)
    choice = names[int(np.argmax(vals))]
    p_call = 1.0 - math.exp(question[ANSWER]) if math.isfinite(question[ANSWER]) else 1.0
    return Routing(
        choice=choice,
        scores={n: float(p) for n, p in zip(names, probs, strict=True)},
        logits=logits,
        raw=dict(question),
        call_probability=max(0.0, min(1.0, p_call)),
        unstated=tuple(n for n in question if n in unstated),
    )


def needs_unstated_number(tool: Tool, text: str) -> bool:
    """Whether ``tool`` has a required number parameter (no default, not ``"x-grounded":
    false``) that no number in ``text`` could fill: ``text`` states no number at all
    (:func:`~pocket_agent.grammars.grounding.states_number`), or the parameter's description
    names a unit ("in kilograms") and every number ``text`` states carries a unit of another
    dimension ("10 meters"; :mod:`pocket_agent.grammars.units`)."""
    from ..grammars.grounding import GROUNDED_KEY, states_number
    from ..grammars.units import can_hold, parameter_dimension

    props = tool.parameters.get("properties")
    if not isinstance(props, Mapping):
        return False
    for name in tool.parameters.get("required") or []:
        node = props.get(name)
        if not isinstance(node, Mapping) or "default" in node or node.get(GROUNDED_KEY) is False:
            continue
        types = node.get("type")
        kinds = set(types) if isinstance(types, list) else {types}
        if not kinds or not kinds <= {"integer", "number"}:
            continue
        if not states_number(text):
            return True
        description = node.get("description")
        if isinstance(description, str) and not can_hold(text, parameter_dimension(description)):
            return True
    return False


_JOINS = re.compile(
    r"(?<!\w)(?:and|or|then|also|plus|both|as well as|each|every|respectively|vs|versus"  # English
    r"|e|y|et|und|ou|oder)(?!\w)"  # a few other languages' "and"/"or"
    r"|[,;&+\n]|[.!?]\s+\w|[。！？]\s*\S"  # lists; a second sentence
    r"|和|与|及|以及|并且|还有|、|，|；",
    re.IGNORECASE,
)


def asks_for_several(text: str) -> bool:
    """Whether a request joins several things ("... and ...", a list, a second clause), so
    that it may ask for several calls. One that joins nothing ("What is the capital of
    Brazil?") gets one call: SmolLM2-135M otherwise adds a call to a neighbouring tool
    (``country_info.population``) that nobody asked for."""
    return bool(_JOINS.search(text))


def source_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The text of every user message and tool result, one per line (where the values of
    a call may come from)."""
    parts = [m.get("content") for m in messages if m.get("role") in ("user", "tool")]
    return "\n".join(p for p in parts if isinstance(p, str))


def last_user_text(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """Content of the last user message (the request tool arguments are grounded in)."""
    for m in reversed(messages):
        if m.get("role") == "user":
            c = m.get("content")
            return c if isinstance(c, str) and c.strip() else None
    return None


def neutral_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with the last user message replaced by :data:`NEUTRAL_QUESTION`."""
    out = [dict(m) for m in messages]
    for m in reversed(out):
        if m.get("role") == "user":
            m["content"] = NEUTRAL_QUESTION
            break
    return out


class Router:
    """Scores the routing options of one agent's turns (start-token sets, call tokens and
    the neutral prompt's scores are computed once and reused)."""

    def __init__(self, bias: float = CALL_BIAS) -> None:
        self.bias = bias
        self._sets: tuple[NDArray[np.int64], NDArray[np.int64]] | None = None
        self._call_tokens: list[list[int]] | None = None
        self._neutral: dict[tuple[int, ...], dict[str, float]] = {}

    def route(
        self,
        model: Model,
        tools: Sequence[Tool],
        prompt: Sequence[int],
        neutral_prompt: Sequence[int],
        start_sets: Callable[[], tuple[NDArray[np.int64], NDArray[np.int64]]],
        *,
        calibrate: bool = True,
        unstated: Sequence[str] = (),
    ) -> Routing:
        """The decision for the turn after ``prompt``: calibrated against ``neutral_prompt``
        with :attr:`bias` for tools, or with ``calibrate=False`` the options' plain scores
        after ``prompt`` (how a turn after tool results decides whether to call again).
        Tools named in ``unstated`` are scored but never chosen."""
        if self._sets is None:
            self._sets = start_sets()
        if self._call_tokens is None:
            self._call_tokens = [call_tokens(model, t.name) for t in tools]
        first_allowed, call_first = self._sets
        if not calibrate:
            question = option_log_probs(model, prompt, tools, first_allowed, call_first, self._call_tokens)
            return decide_route(question, {}, bias=0.0, unstated=unstated)
        key = tuple(neutral_prompt)
        neutral = self._neutral.get(key)
        if neutral is None:
            neutral = option_log_probs(model, neutral_prompt, tools, first_allowed, call_first, self._call_tokens)
            if len(self._neutral) > 64:
                self._neutral.clear()
            self._neutral[key] = neutral
        question = option_log_probs(model, prompt, tools, first_allowed, call_first, self._call_tokens)
        return decide_route(question, neutral, bias=self.bias, unstated=unstated)


def _choice_valued(schema: Any) -> bool:
    """Whether a parameter's value comes from the schema's choices (enum, const, boolean)."""
    if not isinstance(schema, Mapping):
        return False
    t = schema.get("type")
    return "enum" in schema or "const" in schema or t == "boolean"


def call_key(body: str, tools: Mapping[str, Tool]) -> str | None:
    """A call's identity for repeat detection: its name and the arguments whose values do
    not come from the schema's choices. ``None`` when ``body`` is not a call object."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("arguments"), dict):
        return None
    tool = tools.get(str(obj.get("name")))
    props = tool.parameters.get("properties", {}) if tool is not None else {}
    kept = {k: v for k, v in obj["arguments"].items() if not _choice_valued(props.get(k))}
    return json.dumps([obj.get("name"), kept], sort_keys=True, ensure_ascii=False)
