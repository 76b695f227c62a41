"""Grounded extraction and per-field confidence for :func:`pocket_agent.extract`.

Grounding (see :mod:`pocket_agent.grammars.grounding` for the grammar): by default every
plain string field (``str`` with no ``enum``, ``const``, ``pattern`` or ``format``) is
constrained to a verbatim span of the document, whitespace runs read as single spaces.
Turn it off for one field with ``Field(json_schema_extra={"x-grounded": False})`` (or
``"x-grounded": false`` in a JSON Schema), for a whole call with ``grounded=False``.
Numbers: after generation, a top-level number field whose value the document does not print
is set to the printed number the model scores highest as a whole value
(:func:`choose_numbers`; off with ``"x-grounded": false`` or ``grounded=False``).
Constraining the digits in the grammar instead (``"x-grounded": true`` on the field, or
``grounded="all"``) did not beat free numbers on SROIE: greedy decoding still commits to a
wrong first digit; the whole-value choice does.
Words: a top-level grounded string the model cut inside a word of the document (``2041``
out of ``INV-2041``) is widened to the whole word (:func:`widen_words`).

Confidence (``extract(..., confidence=True)``): for each top-level field, the mean
probability the model gave to the tokens it chose for that value, under the grammar's
mask (tokens the grammar forced are left out; a value made only of forced tokens scores
1.0). It costs one extra evaluation of the output tokens (no generation).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import llguidance as llg
import numpy as np

from .errors import InvalidInputError
from .grammars import GrammarSpec, compile_spec
from .grammars.grounding import (
    GROUNDED_KEY,
    HAN_CHARS,
    grounded_grammar,
    in_bounds,
    is_grounded,
    normalize_space,
    number_options,
)
from .runtime import branch_logits

if TYPE_CHECKING:
    from .grammars import CompiledGrammar
    from .runtime import Model

T = TypeVar("T")

Grounding = bool | Literal["strings", "all"]
"""``True``/``"strings"``: plain strings grounded (the default); ``"all"``: numbers too;
``False``: nothing grounded (fields marked ``"x-grounded": true`` included)."""

DEFAULT_GROUNDING: Grounding = True

__all__ = [
    "DEFAULT_GROUNDING",
    "GROUNDED_KEY",
    "Extraction",
    "Grounding",
    "check_grounding",
    "choose_nulls",
    "choose_numbers",
    "choose_spans",
    "comma_names",
    "document_grammar",
    "field_confidence",
    "json_members",
    "whole_words",
    "widen_words",
]

MAX_NUMBER_OPTIONS = 16
"""Printed numbers scored per field at most, those whose first token the model finds
likeliest (bench/extract.md: on 40 SROIE receipts, 14 totals right greedily)."""


def check_grounding(grounded: Any) -> tuple[bool, bool]:
    """``(strings, numbers)`` defaults for a ``grounded=`` argument; ``(False, False)`` is off."""
    if grounded is True or grounded == "strings":
        return True, False
    if grounded == "all":
        return True, True
    if grounded is False:
        return False, False
    raise InvalidInputError(f"grounded must be True, False, 'strings' or 'all', got {grounded!r}.")


def document_grammar(
    model: Model, schema: Mapping[str, Any], text: str, *, strings: bool, numbers: bool
) -> CompiledGrammar | None:
    """The grammar of ``schema`` grounded in ``text``, or ``None`` when nothing is grounded.

    Compiled without the shared cache (it serves one document): a few milliseconds for a
    receipt-sized document on top of the schema's own compile time.
    """
    if not strings and not numbers:
        return None
    lark = grounded_grammar(schema, text, strings=strings, numbers=numbers)
    if lark is None:
        return None
    spec = GrammarSpec("lark", llg.LLMatcher.grammar_from_lark(lark), source=lark)
    return compile_spec(spec, model, cache=False)


@dataclass
class Extraction(Generic[T]):
    """What ``extract(..., confidence=True)`` returns: the ``value`` and how sure the model was.

    ``confidence`` maps each top-level field present in the output to the mean probability
    of its chosen tokens (0-1); ``raw`` is the JSON text the model wrote.
    """

    value: T
    confidence: dict[str, float] = field(default_factory=dict)
    raw: str = ""

    def uncertain(self, below: float = 0.5) -> list[str]:
        """Fields whose confidence is below ``below`` (e.g. to send to a person)."""
        return [k for k, v in self.confidence.items() if v < below]


def json_members(text: str) -> Iterator[tuple[str, Any, int, int]]:
    """``(key, value, start, end)`` of each top-level member of the JSON object that
    ``text`` starts (possibly cut off), in order, up to the first one that does not parse;
    ``text[start:end]`` is the value's JSON text."""
    dec = json.JSONDecoder()
    i = text.find("{")
    if i < 0:
        return
    i += 1
    n = len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "}":
            return
        try:
            key, i = dec.raw_decode(text, i)
        except ValueError:
            return
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i >= n or text[i] != ":":
            return
        i += 1
        while i < n and text[i] in " \t\r\n":
            i += 1
        try:
            value, j = dec.raw_decode(text, i)
        except ValueError:
            return
        yield str(key), value, i, j
        i = j


def _value_spans(raw: str) -> dict[str, tuple[int, int]]:
    """Character span of every top-level value of the JSON object ``raw``."""
    return {key: (start, end) for key, _, start, end in json_members(raw)}


def _log_softmax_at(row: Any, tok: int) -> float:
    x = np.asarray(row, dtype=np.float64)
    finite = x[np.isfinite(x)]
    if finite.size == 0 or not math.isfinite(float(x[tok])):
        return -math.inf
    m = float(finite.max())
    return float(x[tok] - (m + math.log(float(np.exp(finite - m).sum()))))


def field_confidence(
    model: Model, prompt: Sequence[int], tokens: Sequence[int], grammar: CompiledGrammar, raw: str
) -> dict[str, float]:
    """Mean masked probability of the sampled tokens of each top-level value of ``raw``.

    Re-evaluates ``tokens`` after ``prompt`` once (the prompt stays cached) and replays
    the grammar to know which tokens it forced and what it allowed at each step.
    """
    from .grammars import apply_mask

    toks = [int(t) for t in tokens]
    if not toks or not prompt:
        return {}
    keep = min(len(prompt) - 1, len(model.cached_tokens))
    model.prefill(list(prompt[: keep + 1]))
    model.rollback(keep)
    rows = model.eval([int(prompt[keep]), *toks[:-1]], logits="all").logits
    matcher = grammar.matcher()
    decoder = model.stream_decoder()
    pos = 0
    sampled: list[tuple[int, int, float]] = []  # (start, end, probability)
    i = 0
    while i < len(toks):
        forced = matcher.forced_tokens()
        if forced and toks[i : i + len(forced)] == list(forced):
            matcher.consume_many(list(forced))
            for t in forced:
                pos += len(decoder.feed(t))
            i += len(forced)
            continue
        mask = matcher.compute_mask()
        row = apply_mask(np.array(rows[i], dtype=np.float32), mask)
        p = math.exp(_log_softmax_at(row, toks[i]))
        matcher.consume(toks[i])
        piece = decoder.feed(toks[i])
        sampled.append((pos, pos + max(len(piece), 1), p))
        pos += len(piece)
        i += 1
    out: dict[str, float] = {}
    for key, (start, end) in _value_spans(raw).items():
        ps = [p for s, e, p in sampled if s < end and e > start]
        out[key] = float(sum(ps) / len(ps)) if ps else 1.0
    return out


def _number_fields(schema: Mapping[str, Any]) -> dict[str, tuple[Mapping[str, Any], bool]]:
    """Top-level number fields whose value is chosen among printed numbers: name -> (schema, integer)."""
    props = schema.get("properties")
    out: dict[str, tuple[Mapping[str, Any], bool]] = {}
    if not isinstance(props, Mapping):
        return out
    for name, node in props.items():
        if not isinstance(node, Mapping) or not is_grounded(node, strings=False, numbers=True):
            continue
        t = node.get("type")
        if t in ("number", "integer"):
            out[str(name)] = (node, t == "integer")
    return out


def choose_numbers(
    model: Model,
    prompt: Sequence[int],
    raw: str,
    schema: Mapping[str, Any],
    text: str,
    *,
    units: bool = False,
    completions: bool = False,
) -> tuple[str, dict[str, float]]:
    """``raw`` with each top-level number field the model invented (a number the document
    does not print) set to the printed number it scores highest as the whole value, and
    the chosen values' mean token probabilities.

    A small model decoding a number greedily commits to its first digit and often ends
    up at a number nowhere in the document (SmolLM2-135M writes ``10`` or ``100`` for many
    receipt totals). Scoring each printed number as a whole (mean log-probability of its
    tokens and of the separator that ends it, after the same JSON prefix) picks the one
    the model finds likeliest. A number the document prints is kept as written (no
    scoring cost). Fields are chosen left to right, each after the values chosen before
    it; a field with no printed number in its bounds keeps its value. Long
    digit runs (identifiers, see :func:`~pocket_agent.grammars.grounding.number_options`)
    are not candidates. Fields with ``"x-grounded": false`` are left as generated, and so
    is everything on a model without real probabilities (``ScriptedModel``). With
    ``units``, numbers printed with a unit glued on (``5m``) are candidates too
    (:func:`~pocket_agent.grammars.grounding.number_options`). With ``completions``, only
    printed numbers the written one is a cut-off or sign-less copy of are candidates
    (``200`` -> ``200000``, ``2`` -> ``-2``; see :func:`completes`): a tool argument may
    rightly hold a number the request never prints (a constant the model knows).
    """
    fields = _number_fields(schema)
    if not fields or not prompt or not model.capabilities.probabilities:
        return raw, {}  # a scripted model's logits carry no preference to choose by
    chosen: dict[str, float] = {}
    for key, (node, integer) in fields.items():
        span = _value_spans(raw).get(key)
        if span is None:
            continue
        printed = number_options(text, integer=integer, quantities=True, units=units)
        options = [o for o in printed if in_bounds(float(o), node)]
        if not options:
            continue
        start, end = span
        try:
            written = float(raw[start:end])
        except ValueError:
            written = math.nan
        if any(float(o) == written for o in options):
            continue  # the model wrote a number the document prints: kept
        if completions:
            options = [o for o in options if completes(raw[start:end], o)]
            if not options:
                continue
        after = raw[end : end + 1] or "}"
        prefix = [*prompt, *model.tokenize(raw[:start])]
        first = model.prefill(prefix, logits="last").logits[-1]
        branches = [model.tokenize(o + after) for o in options]
        if len(prefix) + max(len(b) for b in branches) > model.n_ctx:
            continue  # no room to score after a context-filling output: keep the generated value
        # long documents print many numbers: score the likeliest starts only
        order = sorted(range(len(options)), key=lambda i: -float(first[branches[i][0]]))[:MAX_NUMBER_OPTIONS]
        rows = branch_logits(model, prefix, [branches[i][:-1] or branches[i] for i in order])
        best, best_score, best_probs = -1, -math.inf, [1.0]
        for i, logits in zip(order, rows, strict=True):
            lps = [_log_softmax_at(logits[j], tok) for j, tok in enumerate(branches[i])]
            score = sum(lps) / len(lps)
            if score > best_score:
                best, best_score, best_probs = i, score, [math.exp(x) for x in lps]
        if best >= 0:
            raw = raw[:start] + options[best] + raw[end:]
            chosen[key] = float(sum(best_probs) / len(best_probs))
    return raw, chosen


NULL_BIAS = -0.5
"""Added to ``null``'s mean log-probability before it is compared with the written value's
(:func:`choose_nulls`). Fitted on bench/extract_wild.py's dev half (float and str schemas, the
default model): of the optional fields the model filled, 5 of 74 that the text does not state
went to null and 6 of 200 that it does (none of them right); from -0.25 up, right values start
to go. A weak signal on its own: most absent fields are caught by the grammar (a kind the text
never prints can only be null, :mod:`pocket_agent.grammars.grounding`)."""


def nullable_fields(schema: Mapping[str, Any]) -> set[str]:
    """Top-level fields that may be ``null`` (``Optional[...]``, ``type: [..., "null"]``, an
    ``anyOf``/``oneOf`` branch of type null)."""
    props = schema.get("properties")
    out: set[str] = set()
    if not isinstance(props, Mapping):
        return out
    for name, node in props.items():
        if not isinstance(node, Mapping):
            continue
        types = node.get("type")
        branches = [*(node.get("anyOf") or []), *(node.get("oneOf") or [])]
        if types == "null" or (isinstance(types, list) and "null" in types):
            out.add(str(name))
        elif any(isinstance(b, Mapping) and b.get("type") == "null" for b in branches):
            out.add(str(name))
    return out


def null_margins(model: Model, prompt: Sequence[int], raw: str, schema: Mapping[str, Any]) -> dict[str, float]:
    """For each nullable top-level field of ``raw`` that holds a value: how much likelier the
    model finds ``null`` there than the value it wrote (mean log-probability of each, with the
    character that ends it, after the same JSON prefix)."""
    nullable = nullable_fields(schema)
    if not nullable or not prompt or not model.capabilities.probabilities:
        return {}
    out: dict[str, float] = {}
    for key, (start, end) in _value_spans(raw).items():
        if key not in nullable or raw[start:end] == "null":
            continue
        after = raw[end : end + 1] or "}"
        prefix = [*prompt, *model.tokenize(raw[:start])]
        branches = [model.tokenize("null" + after), model.tokenize(raw[start:end] + after)]
        if len(prefix) + max(len(b) for b in branches) > model.n_ctx:
            continue
        rows = branch_logits(model, prefix, [b[:-1] or b for b in branches])
        means = [
            sum(_log_softmax_at(logits[j], tok) for j, tok in enumerate(branch)) / len(branch)
            for branch, logits in zip(branches, rows, strict=True)
        ]
        out[key] = means[0] - means[1]
    return out


def choose_nulls(
    model: Model, prompt: Sequence[int], raw: str, schema: Mapping[str, Any], *, bias: float | None = None
) -> tuple[str, list[str]]:
    """``raw`` with each nullable top-level value set to ``null`` where it repeats an earlier
    field's value (:func:`repeated_values`) or where the model, asked again at that point,
    prefers ``null`` to what it wrote by more than ``-bias`` (default :data:`NULL_BIAS`); and the
    fields set to null, in order. A small model writes a value wherever the grammar lets it;
    this is the decision between the value and stating nothing."""
    bias = NULL_BIAS if bias is None else bias
    nulled = set(repeated_values(raw, schema))
    if math.isfinite(bias):
        nulled |= {key for key, margin in null_margins(model, prompt, raw, schema).items() if margin + bias > 0}
    spans = _value_spans(raw)
    for key in sorted(nulled, key=lambda k: -spans[k][0]):  # right to left: earlier spans stay valid
        start, end = spans[key]
        raw = raw[:start] + "null" + raw[end:]
    return raw, sorted(nulled, key=lambda k: spans[k][0])


def repeated_values(raw: str, schema: Mapping[str, Any]) -> list[str]:
    """The nullable top-level fields of ``raw`` whose value repeats an earlier field's value (a
    company that is the person's name, a tax that is the total): one printed value answers one
    field, so the repeat is the model filling a field the text does not state."""
    nullable = nullable_fields(schema)
    seen: list[Any] = []
    out = []
    for key, value, _, _ in json_members(raw):
        if value is None or isinstance(value, (bool, dict, list)):
            continue
        if key in nullable and value in seen:  # equal only: a city inside an address is no repeat
            out.append(key)
            continue
        seen.append(value)
    return out


def completes(written: str, printed: str) -> bool:
    """Whether the number text ``written`` is ``printed`` cut short or without its sign:
    the digits of ``written`` (sign and a ``.0`` ending dropped) begin those of ``printed``."""
    w = written.strip().lstrip("-")
    if w.endswith(".0"):
        w = w[:-2]
    return bool(w) and printed.lstrip("-").startswith(w)


# Characters a word is made of, for widening: letters and digits of scripts that separate
# words with spaces (CJK text has no spaces, so a CJK character never extends a value),
# and the joiners of codes, dates and addresses (INV-2041, 12/03/2024, bob@x.com).
_JOINERS = frozenset("-./&'_#@+%")
_CJK_START = 0x2E80


def _word_char(c: str) -> bool:
    return (c.isalnum() and ord(c) < _CJK_START) or c in _JOINERS


def whole_words(value: str, text: str) -> str:
    """``value`` widened to the whole words of ``text`` it cuts.

    Unchanged when ``value`` is empty, is not in the (whitespace-normalised) ``text``, or
    appears somewhere as whole words already. Otherwise, at its first appearance, each end
    that falls inside a word moves out to the word's end; the added part never ends on a
    joiner, so sentence punctuation stays out (``Smith`` in ``John Smith.`` stays ``Smith``).
    """
    if not value:
        return value
    t = normalize_space(text)
    starts = [m.start() for m in re.finditer(re.escape(value), t)]
    if not starts:
        return value

    def cuts_left(i: int) -> bool:
        return i > 0 and _word_char(t[i - 1]) and _word_char(t[i])

    def cuts_right(j: int) -> bool:
        return j < len(t) and _word_char(t[j]) and _word_char(t[j - 1])

    if any(not cuts_left(i) and not cuts_right(i + len(value)) for i in starts):
        return value
    lo, hi = starts[0], starts[0] + len(value)
    a, b = lo, hi
    while cuts_left(a):
        a -= 1
    while cuts_right(b):
        b += 1
    while a < lo and not t[a].isalnum():
        a += 1
    while b > hi and not t[b - 1].isalnum():
        b -= 1
    return t[a:b]


def widen_words(raw: str, schema: Mapping[str, Any], text: str) -> tuple[str, list[str]]:
    """``raw`` with every top-level grounded string field widened to whole words of ``text``
    (:func:`whole_words`), and the names of the fields that changed.

    A span grammar lets a small model start or stop a value inside a word: with the
    quick start's invoice, SmolLM2-135M writes ``2041`` for ``INV-2041``. Widening keeps
    the value a verbatim span of the document. A field whose widened value would break its
    ``maxLength`` is left as generated.
    """
    props = schema.get("properties")
    if not isinstance(props, Mapping):
        return raw, []
    changed: list[str] = []
    for key, value, start, end in list(json_members(raw))[::-1]:  # right to left: spans stay valid
        node = string_node(props.get(key))
        if not isinstance(value, str) or node is None or not is_grounded(node):
            continue
        wider = whole_words(value, text)
        if is_person_field(key):
            wider = without_titles(wider)
        limit = node.get("maxLength")
        if wider == value or (isinstance(limit, int) and len(wider) > limit):
            continue
        raw = raw[:start] + json.dumps(wider, ensure_ascii=False) + raw[end:]
        changed.append(key)
    return raw, changed[::-1]


def string_node(node: Any) -> Mapping[str, Any] | None:
    """The string schema of a field: the field's own, or its one string branch beside ``null``
    (``Optional[str]``); ``None`` for anything else."""
    if not isinstance(node, Mapping):
        return None
    branches = [b for b in (node.get("anyOf") or node.get("oneOf") or []) if isinstance(b, Mapping)]
    if branches:
        strings = [b for b in branches if b.get("type") == "string"]
        if len(strings) == 1 and all(b.get("type") in ("string", "null") for b in branches):
            inherit = {k: v for k, v in node.items() if k not in ("anyOf", "oneOf", "default")}
            return {**inherit, **strings[0]}
        return None
    return node if node.get("type") == "string" else None


_PERSON_WORDS = frozenset(
    {"name", "person", "recipient", "sender", "contact", "customer", "attendee", "author", "signer", "addressee"}
)
_NOT_PERSON = frozenset(
    {"company", "product", "file", "shop", "store", "business", "brand", "item", "event", "street", "city", "bank",
     "project", "venue", "place", "organization", "organisation", "org", "team", "department", "email", "phone"}
)  # fmt: skip
_PERSON_CJK = ("姓名", "收件人", "联系人", "客户", "发件人", "收信人", "负责人", "申请人")
_LEADING_TITLES = re.compile(
    r"^(?:(?:dear|hi|hello|attn:?|to:?|mr\.?|mrs\.?|ms\.?|miss|dr\.?|prof\.?)\s+)+|^(?:尊敬的|亲爱的|致)+",
    re.IGNORECASE,
)
_TRAILING_TITLES = re.compile(r"(?:先生|女士|小姐|老师|教授|博士|同学|阁下)+$|[,，:：]$")


def is_person_field(name: str) -> bool:
    """Whether a field named ``name`` holds a person's name (``name``, ``recipient``,
    ``contact_person``, ``收件人``; not ``company_name`` or ``file_name``)."""
    if any(w in name for w in _PERSON_CJK):
        return True
    words = set(re.findall(r"[a-z]+", re.sub(r"([a-z])([A-Z])", r"\1 \2", name).lower()))
    return bool(words & _PERSON_WORDS) and not words & _NOT_PERSON


def without_titles(value: str) -> str:
    """A person's name without the greeting or title around it: ``尊敬的王小明先生`` -> ``王小明``,
    ``Dear Dr. Anna Berg`` -> ``Anna Berg``; the value itself when nothing would be left."""
    trimmed = _TRAILING_TITLES.sub("", _LEADING_TITLES.sub("", value.strip())).strip()
    return trimmed or value


def _name_word(word: str) -> bool:
    """A capitalised word of a name: ``Latvia``, ``CA``, ``Divinópolis``, ``O'Hare``."""
    return bool(word) and word[0].isupper() and all(c.isalnum() or c in "'-&" for c in word)


MAX_NAME_WORDS = 3


def comma_names(value: str, text: str) -> list[str]:
    """Longer spans of ``text`` that extend ``value`` over a name joined to it by a comma,
    at its first appearance: ``Riga`` in ``I'm at Riga, Latvia, ...`` gives ``Riga, Latvia``;
    ``MG`` in ``Divinópolis, MG?`` gives ``Divinópolis, MG``. A name is one to three
    capitalised words. Empty when ``value`` is not in ``text``."""
    t = normalize_space(text)
    i = t.find(value) if value else -1
    if i < 0:
        return []
    out: list[str] = []
    j = i + len(value)
    if t.startswith(",", j):
        k = j + 1 + (t[j + 1 : j + 2] == " ")
        words: list[str] = []
        for word in t[k:].split(" ")[:MAX_NAME_WORDS]:
            bare = word.rstrip(".,;:!?)")
            if not _name_word(bare):
                break
            words.append(bare)
            if bare != word:
                break
        if words:
            out.append(t[i:k] + " ".join(words))
    before = t[:i]
    if before.endswith((", ", ",")):
        head = before.rstrip(" ")[:-1]
        words = []
        for word in reversed(head.split(" ")[-MAX_NAME_WORDS:]):
            bare = word.lstrip("(")
            if not _name_word(bare):
                break
            words.insert(0, bare)
            if bare != word:
                break
        if words:
            start = len(head) - len(" ".join(words))
            out.append(t[start:j])
    return out


_OPERATOR_TAIL = re.compile(r"(?:\s*[-+*/×÷^%]\s*\(*\s*-?\d[\d.,]*\s*\)*)+")
_OPEN_BRACKETS = {"(": ")", "[": "]"}


def value_extensions(value: str, text: str) -> list[str]:
    """Longer spans of ``text`` that complete ``value`` where it stops inside a value: an
    arithmetic expression cut after a number (``1250`` of ``Compute 1250 / 4``) or a bracket
    left unbalanced (``18 + 7`` of ``(18 + 7) * 3``), at its first appearance. Empty when
    nothing completes it or ``value`` is not in ``text``."""
    t = normalize_space(text)
    i = t.find(value) if value else -1
    if i < 0:
        return []
    start, end = i, i + len(value)
    if start > 0 and t[start - 1] in _OPEN_BRACKETS and _OPEN_BRACKETS[t[start - 1]] not in value:
        start -= 1  # "(18 + 7": the bracket the value's expression opens with
    for _ in range(3):  # close brackets, continue the expression, close again
        for opening, closing in _OPEN_BRACKETS.items():
            while t[start:end].count(opening) > t[start:end].count(closing) and t.startswith(closing, end):
                end += 1
            while t[start:end].count(closing) > t[start:end].count(opening):
                back = t.rfind(opening, 0, start)
                if back < 0:
                    break
                start = back
        tail = _OPERATOR_TAIL.match(t, end) if t[start:end][-1:].isdigit() or t[start:end][-1:] == ")" else None
        if tail is None:
            break
        end = tail.end()
    span = t[start:end].rstrip(" ,.")
    return [span] if span != value and value in span else []


_CJK_RUN = re.compile(f"[{HAN_CHARS}]+")
MAX_CJK_WORD = 4


def cjk_words(value: str, text: str) -> list[str]:
    """Where ``value`` is Chinese, the other spans of ``text`` that could be the word meant: every
    run of 2 to :data:`MAX_CJK_WORD` CJK characters (Chinese writes no spaces, so a small model's
    span may be the wrong word of the sentence: ``现在`` for ``东京`` in ``东京现在多少度``).
    Empty for a value that is not all CJK."""
    if not value or not _CJK_RUN.fullmatch(value):
        return []
    out: dict[str, None] = {}
    for run in _CJK_RUN.findall(text):
        for size in range(2, MAX_CJK_WORD + 1):
            for i in range(len(run) - size + 1):
                out.setdefault(run[i : i + size], None)
    out.pop(value, None)
    return list(out)


def choose_spans(model: Model, prompt: Sequence[int], written: str, options: Sequence[str]) -> tuple[str, float]:
    """Of ``written`` (a string value the model wrote after ``prompt``) and the longer
    ``options``, the one the model scores highest as the whole value (mean log-probability
    of its tokens and the closing quote), and that mean probability.

    A small model writing a grounded span tends to close the string at the first comma:
    SmolLM2-135M writes ``Riga`` for a request that says ``Riga, Latvia``, although it
    finds ``, Latvia`` likely once the comma is there. Scoring the whole values, as
    :func:`choose_numbers` does for numbers, lets it pick the span it prefers as a whole.
    """
    candidates = [written, *[o for o in options if o != written]]
    if len(candidates) == 1 or not prompt or not model.capabilities.probabilities:
        return written, math.nan
    branches = [model.tokenize(json.dumps(c, ensure_ascii=False)[1:]) for c in candidates]
    if len(prompt) + max(len(b) for b in branches) > model.n_ctx:
        return written, math.nan
    model.prefill(list(prompt))
    rows = branch_logits(model, list(prompt), [b[:-1] or b for b in branches])
    best, best_score = 0, -math.inf
    for i, (branch, logits) in enumerate(zip(branches, rows, strict=True)):
        lps = [_log_softmax_at(logits[j], tok) for j, tok in enumerate(branch)]
        score = sum(lps) / len(lps)
        if score > best_score:
            best, best_score = i, score
    return candidates[best], math.exp(best_score)
