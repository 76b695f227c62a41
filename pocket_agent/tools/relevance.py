"""Which tools a request is about, read from the tools' descriptions (a channel model).

For each option, a tool or plain answering, the model reads the option's name and description
and then the user's request; the option's score is the mean log-probability of the request's
tokens after it. A request about the weather is likelier after ``get_weather: Get the current
weather for a city`` than after ``calculate: Evaluate an arithmetic expression``, and small
talk ("Hello there!") after the answering option (not always: SmolLM2-135M still finds "Thank
you, that is all for today." likelier after ``calculate``). Unlike the router's
probability of *writing* a call (which a small model gives to whichever tool it is used to),
this reads what each tool is for, so tool choice follows the descriptions the user wrote.

The scores are compared, never thresholded absolutely: :func:`relevant_tools` keeps the tools
that score above answering by at least a margin (:data:`CALL_MARGIN`) and within
:data:`TOOL_SPREAD` of the best one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..runtime import branch_logits
from .tool import Tool

if TYPE_CHECKING:
    from ..runtime import Model

ANSWER_OPTION = "answer"
ANSWER_DESCRIPTION = "Chat with the user: hello, thanks, goodbye, how are you, who are you, tell a joke."
HEADER = "Each line names an assistant's tool, what it does, and a request a user sent to it.\n"
MAX_DESCRIPTION_CHARS = 200
MAX_REQUEST_TOKENS = 96

# The answering description and both constants were chosen on development rows of two sources
# (bench/agent_e2e.py's dev half: 54 call and 7 chit-chat tasks; BFCL rows 15-29 of simple_python,
# multiple, parallel_multiple, live_multiple and irrelevance: 60 and 15; the default model). Of five
# answering descriptions this one with a margin of -0.1 left the best tool's calls as they were
# (43/54, 51/60 right by the best score alone) and answered 6/7 chit-chat and 9/15 irrelevance rows
# with no call (the first description tried: 4/7 and 5/15). A spread of 0.25 kept the right tool
# callable in 50/54 and 57/60 rows while leaving out 30% and 26% of the tools.
CALL_MARGIN = -0.1
"""How far (mean nats per request token) a tool must score above answering to be called."""
TOOL_SPREAD = 0.25
"""Tools scoring within this much of the best tool stay callable (a request may need several)."""


@dataclass(frozen=True)
class Relevance:
    """Per-option scores (mean log-probability of the request's tokens after each option)."""

    scores: dict[str, float]

    @property
    def best_tool(self) -> str | None:
        tools = {k: v for k, v in self.scores.items() if k != ANSWER_OPTION}
        return max(tools, key=lambda k: tools[k]) if tools else None

    def margin(self, name: str) -> float:
        """How far ``name`` scores above answering."""
        return self.scores[name] - self.scores[ANSWER_OPTION]


def _option_line(name: str, description: str) -> str:
    text = " ".join(description.split())[:MAX_DESCRIPTION_CHARS] or name.replace("_", " ")
    return f"Tool: {name} ({text})\nRequest:"


def relevance(model: Model, tools: Sequence[Tool], request: str) -> Relevance:
    """Score answering and each tool by how likely ``request`` reads after its description."""
    prefix = model.tokenize(HEADER)
    words = model.tokenize(" " + " ".join(request.split()))[:MAX_REQUEST_TOKENS]
    options = [(ANSWER_OPTION, ANSWER_DESCRIPTION), *[(t.name, t.description) for t in tools]]
    heads = [model.tokenize(_option_line(name, description)) for name, description in options]
    rows = branch_logits(model, prefix, [head + words for head in heads])
    scores: dict[str, float] = {}
    for (name, _), head, logits in zip(options, heads, rows, strict=True):
        # rows[j] predicts branch token j; the request's tokens follow the head
        block = logits[len(head) : len(head) + len(words)].astype(np.float64)
        top = block.max(axis=1, keepdims=True)
        log_norm = np.log(np.exp(block - top).sum(axis=1)) + top[:, 0]
        picked = block[np.arange(len(words)), words]
        scores[name] = float(np.mean(picked - log_norm))
    return Relevance(scores)


def relevant_tools(rel: Relevance, *, margin: float = CALL_MARGIN, spread: float = TOOL_SPREAD) -> list[str]:
    """The tools worth calling for the request: above answering by ``margin`` and within
    ``spread`` of the best tool; empty when the request is for a plain answer."""
    best = rel.best_tool
    if best is None or rel.margin(best) < margin:
        return []
    top = rel.scores[best]
    return [k for k, v in rel.scores.items() if k != ANSWER_OPTION and v >= top - spread and rel.margin(k) >= margin]
