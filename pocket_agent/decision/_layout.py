"""How a question and its options become tokens, and where the features are read.

Every piece (template header, context, question, each option label, each option text, the
marker closing each option, the template tail) is tokenized on its own and the token lists
are concatenated. That keeps the position of every option's closing marker exact and makes
training and inference see byte-identical token sequences.
"""

from __future__ import annotations

import json
import string
import weakref
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields

from ..errors import AdapterError, ContextOverflowError, InvalidInputError
from ..runtime import Model
from ..runtime.prompt import encode_pieces, render_pieces
from ._features import Points

LETTERS = string.ascii_uppercase
_SENTINEL = "\x00POCKET_AGENT_DECISION_SLOT\x00"


@dataclass(frozen=True)
class PromptFormat:
    """The text layout of a decision prompt; stored in a Dec adapter's metadata.

    ``layout="branches"`` (the pointer default): the user turn of the chat template holds
    ``context`` (only when a context is given), ``question`` and ``footer``; the assistant
    turn starts with ``answer_prefix``, and every option is a separate continuation of
    that prompt, ``option`` + ``marker``, evaluated after the shared prefix. Each option
    then sees the question and only itself, so the scores cannot depend on the order of
    the options.

    ``layout="listed"`` (used by the ``letter`` method): the user turn lists every option
    as ``label`` + ``option`` + ``marker`` after the question, in one sequence.

    ``{context}``, ``{question}``, ``{label}`` and ``{option}`` are replaced by the actual
    text; every other character is literal. ``system=None`` keeps the chat template's
    default system prompt.
    """

    layout: str = "branches"
    system: str | None = None
    context: str = "{context}\n\n"
    question: str = "{question}\n"
    label: str = "{label}."
    option: str = " {option}"
    marker: str = "\n"
    footer: str = ""
    answer_prefix: str = "Answer:"
    labels: str = LETTERS

    def to_json(self) -> str:
        """The format as a compact JSON object (stored in adapter metadata)."""
        return json.dumps(asdict(self), ensure_ascii=False, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> PromptFormat:
        """Parse :meth:`to_json` output; unknown keys are an :class:`AdapterError`."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise AdapterError(f"The adapter's prompt format is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise AdapterError("The adapter's prompt format must be a JSON object.")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise AdapterError(f"The adapter's prompt format has unknown keys {unknown}; upgrade pocket_agent.")
        for key, value in data.items():
            if not (isinstance(value, str) or (key == "system" and value is None)):
                raise AdapterError(f"The adapter's prompt format field {key!r} must be a string.")
        fmt = cls(**data)
        fmt.validate()
        return fmt

    def validate(self) -> None:
        """Check the placeholders; raise :class:`InvalidInputError` when a field is unusable."""
        if "{question}" not in self.question:
            raise InvalidInputError("PromptFormat.question must contain '{question}'.")
        if "{context}" not in self.context:
            raise InvalidInputError("PromptFormat.context must contain '{context}'.")
        if "{option}" not in self.option:
            raise InvalidInputError("PromptFormat.option must contain '{option}'.")
        if not self.marker:
            raise InvalidInputError("PromptFormat.marker must not be empty.")
        if len(set(self.labels)) != len(self.labels) or not self.labels:
            raise InvalidInputError("PromptFormat.labels must be distinct characters.")
        if self.layout not in ("branches", "listed"):
            raise InvalidInputError("PromptFormat.layout must be 'branches' or 'listed'.")


DEFAULT_FORMAT = PromptFormat()
LISTED_FORMAT = PromptFormat(layout="listed")


def _fill(template: str, **values: str) -> str:
    out = template
    for key, value in values.items():
        out = out.replace("{" + key + "}", value)
    return out


@dataclass
class PointerLayout:
    """One question laid out as a single token sequence with every option listed.

    ``markers[i]`` is the index of the token closing option ``i``; ``spans[i]`` the
    ``[start, end)`` token range of option ``i``'s text; the last token is where the
    answer (a label, for the ``letter`` method) would be predicted.
    """

    tokens: list[int]
    markers: list[int]
    spans: list[tuple[int, int]]
    head_len: int
    context_span: tuple[int, int] | None = None

    @property
    def answer_pos(self) -> int:
        return len(self.tokens) - 1

    def points(self) -> Points:
        """The positions features are read at."""
        span = self.context_span or (self.head_len, self.spans[0][0])
        pred = [[(q, self.tokens[q + 1]) for q in range(s - 1, e - 1)] for s, e in self.spans]
        return Points(self.markers, self.spans, self.answer_pos, span, pred)


@dataclass
class ClozeLayout:
    """A question prompt (``prefix``) and one continuation per option (``branches``)."""

    prefix: list[int]
    branches: list[list[int]]
    head_len: int


@dataclass
class BranchLayout:
    """A question prompt (``prefix``) and one continuation per option: its text, then the marker.

    Positions are *virtual*: the prefix, then branch 0, branch 1, ... concatenated, so one
    :class:`Points` describes where every feature is read even though each branch is
    evaluated on its own after the prefix.
    """

    prefix: list[int]
    branches: list[list[int]]
    n_text: list[int]
    head_len: int
    context_span: tuple[int, int]

    def offsets(self) -> list[int]:
        out, pos = [], len(self.prefix)
        for b in self.branches:
            out.append(pos)
            pos += len(b)
        return out

    @property
    def answer_pos(self) -> int:
        return len(self.prefix) - 1

    def points(self) -> Points:
        """The (virtual) positions features are read at."""
        offs = self.offsets()
        markers = [o + len(b) - 1 for o, b in zip(offs, self.branches, strict=True)]
        spans = [(o, o + n) for o, n in zip(offs, self.n_text, strict=True)]
        pred = []
        for o, b, n in zip(offs, self.branches, self.n_text, strict=True):
            pred.append([(self.answer_pos, b[0])] + [(o + j, b[j + 1]) for j in range(n - 1)])
        return Points(markers, spans, self.answer_pos, self.context_span, pred)


@dataclass
class _TemplateParts:
    head: list[int]
    tail: list[int]
    marker: int
    label_tokens: dict[str, list[int]] = field(default_factory=dict)


_parts_cache: weakref.WeakKeyDictionary[Model, dict[tuple[str | None, str, str], _TemplateParts]] = (
    weakref.WeakKeyDictionary()
)


def template_parts(model: Model, fmt: PromptFormat, *, answer_prefix: str) -> _TemplateParts:
    """Tokens of the chat template around the user turn (cached per model and format)."""
    per_model = _parts_cache.setdefault(model, {})
    key = (fmt.system, fmt.marker, answer_prefix)
    parts = per_model.get(key)
    if parts is not None:
        return parts
    messages = []
    if fmt.system is not None:
        messages.append({"role": "system", "content": fmt.system})
    messages.append({"role": "user", "content": _SENTINEL})
    # the system text is data like any content: only the template makes control tokens
    pieces = render_pieces(model.chat_template, messages, add_generation_prompt=True)
    slots = [i for i, (text, is_data) in enumerate(pieces) if is_data and text == _SENTINEL]
    if len(slots) != 1:
        raise InvalidInputError("The model's chat template does not render the user message verbatim.")
    head = encode_pieces(model, pieces[: slots[0]])
    tail = encode_pieces(model, pieces[slots[0] + 1 :], add_bos=False)
    tail += model.tokenize(answer_prefix) if answer_prefix else []
    marker = model.tokenize(fmt.marker)
    if len(marker) != 1:
        raise AdapterError(
            f"The option marker {fmt.marker!r} is {len(marker)} tokens for this model; it must be exactly one."
        )
    parts = _TemplateParts(head=head, tail=tail, marker=marker[0])
    per_model[key] = parts
    return parts


def check_question(question: object, options: object, context: object) -> tuple[str, list[str], str | None]:
    """Validate decide() arguments; return them normalised (options as a list)."""
    if not isinstance(question, str):
        raise InvalidInputError(f"question must be a string, got {type(question).__name__}.")
    if not question.strip():
        raise InvalidInputError("question is empty.")
    if isinstance(options, (str, bytes)) or not isinstance(options, Sequence):
        raise InvalidInputError("options must be a list of strings, e.g. ['no', 'yes'].")
    opts = list(options)
    if len(opts) < 2:
        raise InvalidInputError(f"decide() needs at least two options, got {len(opts)}.")
    for i, o in enumerate(opts):
        if not isinstance(o, str):
            raise InvalidInputError(f"options[{i}] must be a string, got {type(o).__name__}.")
        if not o.strip():
            raise InvalidInputError(f"options[{i}] is empty.")
    seen: dict[str, int] = {}
    for i, o in enumerate(opts):
        key = o.strip()
        if key in seen:
            raise InvalidInputError(f"options[{i}] duplicates options[{seen[key]}] ({o!r}); options must differ.")
        seen[key] = i
    if context is not None and not isinstance(context, str):
        raise InvalidInputError(f"context must be a string or None, got {type(context).__name__}.")
    ctx = context if context is not None and context.strip() else None
    return question, opts, ctx


def _check_fits(model: Model, needed: int, what: str) -> None:
    if needed > model.n_ctx:
        raise ContextOverflowError(
            f"The {what} needs {needed} tokens but the model's context window is {model.n_ctx}. "
            "Shorten the context or options, or load the model with a larger n_ctx.",
            needed=needed,
            n_ctx=model.n_ctx,
        )


def _question_tokens(
    model: Model, fmt: PromptFormat, parts: _TemplateParts, question: str, context: str | None
) -> tuple[list[int], tuple[int, int]]:
    """Template head, context and question tokens, and the span the context summary reads."""
    toks = list(parts.head)
    if context is not None:
        toks += model.tokenize(_fill(fmt.context, context=context))
    end_of_context = len(toks)
    toks += model.tokenize(_fill(fmt.question, question=question))
    # no context: the question stands in for it
    span = (len(parts.head), end_of_context if context is not None else len(toks))
    return toks, span


def pointer_layout(
    model: Model, fmt: PromptFormat, question: str, options: Sequence[str], context: str | None
) -> PointerLayout:
    """Lay out a question with all options listed, one marker closing each option."""
    if len(options) > len(fmt.labels):
        raise InvalidInputError(
            f"{len(options)} options but only {len(fmt.labels)} labels ({fmt.labels[0]}-{fmt.labels[-1]})."
        )
    parts = template_parts(model, fmt, answer_prefix=fmt.answer_prefix)
    toks, context_span = _question_tokens(model, fmt, parts, question, context)
    markers: list[int] = []
    spans: list[tuple[int, int]] = []
    for label, opt in zip(fmt.labels, options, strict=False):
        if fmt.label:
            toks += model.tokenize(_fill(fmt.label, label=label))
        pre, _, post = fmt.option.partition("{option}")
        if pre:
            # the text before the option (usually one space) joins the option's first word
            opt_toks = model.tokenize(pre + opt)
        else:
            opt_toks = model.tokenize(opt)
        start = len(toks)
        toks += opt_toks
        spans.append((start, len(toks)))
        if post:
            toks += model.tokenize(post)
        toks.append(parts.marker)
        markers.append(len(toks) - 1)
    if fmt.footer:
        toks += model.tokenize(fmt.footer)
    toks += parts.tail
    _check_fits(model, len(toks), "question with its options")
    return PointerLayout(tokens=toks, markers=markers, spans=spans, head_len=len(parts.head), context_span=context_span)


def branch_layout(
    model: Model, fmt: PromptFormat, question: str, options: Sequence[str], context: str | None
) -> BranchLayout:
    """Lay out a question as one prompt and one ``option + marker`` continuation per option."""
    parts = template_parts(model, fmt, answer_prefix=fmt.answer_prefix)
    toks, context_span = _question_tokens(model, fmt, parts, question, context)
    if fmt.footer:
        toks += model.tokenize(fmt.footer)
    toks += parts.tail
    pre, _, post = fmt.option.partition("{option}")
    branches, n_text = [], []
    for i, opt in enumerate(options):
        text = model.tokenize(pre + opt)
        if not text:
            raise InvalidInputError(f"options[{i}] tokenizes to nothing.")
        tail = model.tokenize(post) if post else []
        branches.append([*text, *tail, parts.marker])
        n_text.append(len(text))
    _check_fits(model, len(toks) + max(len(b) for b in branches), "question with its longest option")
    return BranchLayout(
        prefix=toks, branches=branches, n_text=n_text, head_len=len(parts.head), context_span=context_span
    )


def option_layout(
    model: Model, fmt: PromptFormat, question: str, options: Sequence[str], context: str | None
) -> PointerLayout | BranchLayout:
    """The pointer layout ``fmt.layout`` asks for."""
    if fmt.layout == "listed":
        return pointer_layout(model, fmt, question, options, context)
    return branch_layout(model, fmt, question, options, context)


def cloze_layout(
    model: Model, fmt: PromptFormat, question: str, options: Sequence[str], context: str | None
) -> ClozeLayout:
    """Lay out a question without its options; each option is a continuation to score."""
    parts = template_parts(model, fmt, answer_prefix="")
    toks = list(parts.head)
    if context is not None:
        toks += model.tokenize(_fill(fmt.context, context=context))
    toks += model.tokenize(_fill(fmt.question, question=question).rstrip("\n") or question)
    toks += parts.tail
    branches = [model.tokenize(opt) for opt in options]
    for i, b in enumerate(branches):
        if not b:
            raise InvalidInputError(f"options[{i}] tokenizes to nothing.")
    _check_fits(model, len(toks) + max(len(b) for b in branches), "question with its longest option")
    return ClozeLayout(prefix=toks, branches=branches, head_len=len(parts.head))


def label_token_ids(model: Model, labels: str, n: int) -> list[list[int]]:
    """For each of the first ``n`` labels, the single-token spellings (``"A"``, ``" A"``)."""
    out: list[list[int]] = []
    for label in labels[:n]:
        ids = []
        for variant in (label, " " + label):
            t = model.tokenize(variant)
            if len(t) == 1 and t[0] not in ids:
                ids.append(t[0])
        if not ids:
            raise InvalidInputError(f"The label {label!r} is not a single token for this model.")
        out.append(ids)
    return out
