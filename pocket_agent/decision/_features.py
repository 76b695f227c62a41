"""Which numbers describe an option: the feature specification of a pointer head.

A :class:`FeatureSpec` lists feature parts, concatenated in order into one vector per
option. All parts are read from the single forward pass of the pointer layout
(:func:`pocket_agent.decision._layout.pointer_layout`). Hidden states are those of
``layer`` (``final_norm``: the output of the final norm).

``hidden@marker``
    the hidden state at the marker token closing the option's line.
``hidden@option_end``
    the hidden state at the last token of the option's text.
``hidden@A*B`` (``A`` is ``marker`` or ``option_end``; ``B`` is ``answer``, ``context_mean``
or ``context_last``)
    the element-wise product of the option's hidden state at ``A`` with a summary of the
    question shared by all options: the hidden state at the answer position (the last
    prompt token, which has seen every option), the mean hidden state over the context
    tokens (the question's tokens when there is no context), or the hidden state at the
    context's last token. For a fixed set of options this lets a linear head read the
    summary like a linear probe.
``logits@marker``
    the logits at the marker, restricted to ``token_ids`` (a fixed vocabulary subset:
    a linear image of the final hidden state that backends without hidden states, such
    as MNN, can still return).
``option_logprob``
    the mean log-probability of the option's text tokens where they stand in the prompt.
``letter_logit``
    the log-sum-exp of the logits of the option's label tokens (``A``/`` A``) at the
    answer position (``listed`` layout only).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from ..errors import AdapterError

OPTION_POINTS = ("marker", "option_end")
SHARED_POINTS = ("answer", "context_mean", "context_last")
SCALAR_PARTS = ("option_logprob", "letter_logit")
PARTS = (
    *(f"hidden@{a}" for a in OPTION_POINTS),
    *(f"hidden@{a}*{b}" for a in OPTION_POINTS for b in SHARED_POINTS),
    "logits@marker",
    *SCALAR_PARTS,
)
FINAL_NORM = "final_norm"


def _parse_hidden(part: str) -> tuple[str, str | None]:
    body = part.removeprefix("hidden@")
    a, _, b = body.partition("*")
    return a, (b or None)


@dataclass(frozen=True)
class FeatureSpec:
    """Feature parts of a pointer head and where hidden states are read (``layer``)."""

    parts: tuple[str, ...] = ("hidden@marker",)
    layer: str | int = FINAL_NORM
    token_ids: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not self.parts:
            raise AdapterError("A feature specification needs at least one part.")
        for p in self.parts:
            if p not in PARTS:
                raise AdapterError(f"Unknown feature part {p!r}; known parts: {', '.join(PARTS)}.")
        if len(set(self.parts)) != len(self.parts):
            raise AdapterError("Feature parts must not repeat.")
        if "logits@marker" in self.parts and not self.token_ids:
            raise AdapterError("The 'logits@marker' feature needs token_ids (the vocabulary subset).")
        if isinstance(self.layer, bool) or not (
            self.layer == FINAL_NORM or (isinstance(self.layer, int) and self.layer >= 0)
        ):
            raise AdapterError(
                f"features.layer must be {FINAL_NORM!r} or a block index (int >= 0), got {self.layer!r}."
            )
        if isinstance(self.layer, int) and not all(p.startswith("hidden@") for p in self.parts):
            raise AdapterError(
                f"Features read at block {self.layer} can only be hidden states: a pass that stops after an "
                "inner block computes no logits."
            )

    @property
    def needs_hidden(self) -> bool:
        return any(p.startswith("hidden@") for p in self.parts)

    @property
    def inner_layer(self) -> int | None:
        """The block index features are read after, or None for the final norm."""
        return self.layer if isinstance(self.layer, int) else None

    def dim(self, n_embd: int) -> int:
        """Length of the feature vector for a model with hidden size ``n_embd``."""
        total = 0
        for p in self.parts:
            if p.startswith("hidden@"):
                total += n_embd
            elif p == "logits@marker":
                total += len(self.token_ids)
            else:
                total += 1
        return total

    def to_json(self) -> str:
        return json.dumps(
            {"parts": list(self.parts), "layer": self.layer, "token_ids": list(self.token_ids)}, sort_keys=True
        )

    @classmethod
    def from_json(cls, text: str) -> FeatureSpec:
        try:
            data = json.loads(text)
            parts = tuple(str(p) for p in data["parts"])
            raw_layer = data.get("layer", FINAL_NORM)
            layer: str | int = raw_layer if isinstance(raw_layer, int) else str(raw_layer)
            ids = tuple(int(t) for t in data.get("token_ids", []))
        except (ValueError, KeyError, TypeError) as exc:
            raise AdapterError(f"The adapter's feature specification is malformed: {exc}") from exc
        return cls(parts=parts, layer=layer, token_ids=ids)


@dataclass
class PassRows:
    """What one forward pass of a pointer layout returned, by token position."""

    logits: dict[int, NDArray[np.float32]]
    hidden: dict[int, NDArray[np.float32]]


@dataclass(frozen=True)
class Points:
    """Token positions of one pointer layout that features can be read at.

    ``option_pred[i]`` lists ``(position, token)`` pairs: the row at ``position`` predicts
    ``token``, the option's text tokens in turn.
    """

    markers: Sequence[int]
    spans: Sequence[tuple[int, int]]
    answer_pos: int
    context_span: tuple[int, int]
    option_pred: Sequence[Sequence[tuple[int, int]]]

    def option_points(self, name: str) -> list[int]:
        if name == "marker":
            return list(self.markers)
        return [e - 1 for _, e in self.spans]

    def shared_points(self, name: str) -> list[int]:
        if name == "answer":
            return [self.answer_pos]
        s, e = self.context_span
        if name == "context_last":
            return [e - 1]
        return list(range(s, e))


def log_softmax_at(row: NDArray[np.float32], token: int) -> float:
    """``log p(token)`` from one logits row."""
    v = row.astype(np.float64)
    mx = float(v.max())
    return float(v[token] - mx - np.log(np.exp(v - mx).sum()))


def logsumexp(values: NDArray[np.floating]) -> float:
    v = np.asarray(values, dtype=np.float64)
    mx = float(v.max())
    return float(mx + np.log(np.exp(v - mx).sum()))


def needed_positions(spec: FeatureSpec, pts: Points) -> list[int]:
    """Token positions whose outputs (logits, and hidden states when needed) the spec reads."""
    pos: set[int] = set()
    for p in spec.parts:
        if p.startswith("hidden@"):
            a, b = _parse_hidden(p)
            pos.update(pts.option_points(a))
            if b is not None:
                pos.update(pts.shared_points(b))
        elif p == "logits@marker":
            pos.update(pts.markers)
        elif p == "option_logprob":
            for pairs in pts.option_pred:
                pos.update(q for q, _ in pairs)
        elif p == "letter_logit":
            pos.add(pts.answer_pos)
    return sorted(pos)


def build_features(
    spec: FeatureSpec, rows: PassRows, pts: Points, label_ids: Sequence[Sequence[int]]
) -> NDArray[np.float32]:
    """The ``[n_options, dim]`` feature matrix of one question."""
    cols: list[NDArray[np.floating]] = []
    n = len(pts.markers)
    for p in spec.parts:
        if p.startswith("hidden@"):
            a, b = _parse_hidden(p)
            opt = np.stack([rows.hidden[i] for i in pts.option_points(a)])
            if b is None:
                cols.append(opt)
            else:
                shared = np.mean(np.stack([rows.hidden[i] for i in pts.shared_points(b)]), axis=0)
                cols.append(opt * shared[None, :])
        elif p == "logits@marker":
            ids = np.asarray(spec.token_ids, dtype=np.int64)
            cols.append(np.stack([rows.logits[m][ids] for m in pts.markers]))
        elif p == "option_logprob":
            vals = []
            for pairs in pts.option_pred:
                vals.append(float(np.mean([log_softmax_at(rows.logits[q], t) for q, t in pairs])))
            cols.append(np.asarray(vals, dtype=np.float32)[:, None])
        elif p == "letter_logit":
            row = rows.logits[pts.answer_pos]
            vals = [logsumexp(row[list(ids)]) for ids in label_ids[:n]]
            cols.append(np.asarray(vals, dtype=np.float32)[:, None])
    return np.concatenate(cols, axis=1).astype(np.float32)
