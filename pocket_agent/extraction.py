"""``extract()``: text in, a validated Pydantic object (or JSON-Schema-valid dict) out.

The output is constrained by the schema's grammar token by token, so it always parses
and matches the schema. Pydantic validators the grammar cannot express (cross-field
checks) get a bounded retry that shows the model the error.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar, overload

import jsonschema
from pydantic import BaseModel, ValidationError

from .batched import BatchJob, batch_width, generate_batched
from .errors import (
    ContextOverflowError,
    ExtractionError,
    InvalidInputError,
    PocketAgentError,
    SchemaError,
)
from .generate import render_prompt, stream_tokens
from .grounding import (
    DEFAULT_GROUNDING,
    Extraction,
    Grounding,
    check_grounding,
    choose_nulls,
    choose_numbers,
    document_grammar,
    field_confidence,
    json_members,
    widen_words,
)
from .options import Limits, Sampling, resolve_limits, resolve_sampling
from .progress import DocumentProgress
from .runtime import Model, branches_reliable, get_default_model, resolve_model
from .runtime.task_adapters import AdapterChoice, check_adapter_choice, task_adapter

T = TypeVar("T", bound=BaseModel)
Schema = type[BaseModel] | Mapping[str, Any]

JSON_LAYOUT: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""How extraction output is laid out: ``json.dumps``'s separators, no other whitespace."""

SYSTEM_PROMPT = (
    "You are a precise information extraction engine. Read the document and fill in the JSON fields. "
    "Copy values exactly as they appear in the document. Answer with JSON only."
)


# -- schema handling ---------------------------------------------------------------------


def json_schema_of(schema: Schema) -> dict[str, Any]:
    """The JSON Schema of a Pydantic model class or of a schema dict (returned as is)."""
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return schema.model_json_schema()
    if isinstance(schema, Mapping):
        return dict(schema)
    raise InvalidInputError(
        f"schema must be a Pydantic model class or a JSON Schema dict, got {type(schema).__name__}."
    )


def _resolve_ref(root: Mapping[str, Any], node: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = node.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return node
    cur: Any = root
    for part in ref[2:].split("/"):
        if not isinstance(cur, Mapping) or part not in cur:
            return node
        cur = cur[part]
    return cur if isinstance(cur, Mapping) else node


def _type_label(root: Mapping[str, Any], node: Mapping[str, Any]) -> str:
    node = _resolve_ref(root, node)
    if "enum" in node:
        return "one of " + ", ".join(json.dumps(v, ensure_ascii=False) for v in node["enum"])
    if "const" in node:
        return f"exactly {json.dumps(node['const'], ensure_ascii=False)}"
    for key in ("anyOf", "oneOf"):
        if key in node:
            return " or ".join(_type_label(root, n) for n in node[key] if isinstance(n, Mapping))
    t = node.get("type")
    if t == "array":
        items = node.get("items")
        return f"list of {_type_label(root, items)}" if isinstance(items, Mapping) else "list"
    if t == "object" or "properties" in node:
        return "object with " + ", ".join(node.get("properties", {}))
    label = t if isinstance(t, str) else "/".join(t) if isinstance(t, list) else "value"
    if node.get("format"):
        label += f", format {node['format']}"
    bounds = [f"{k} {node[k]}" for k in ("minimum", "maximum", "minLength", "maxLength", "pattern") if k in node]
    return label + (f" ({'; '.join(bounds)})" if bounds else "")


def describe_fields(schema: Mapping[str, Any]) -> str:
    """The schema's fields as a short list a small model reads well: name, type, description."""
    props = schema.get("properties")
    if not isinstance(props, Mapping) or not props:
        return json.dumps(schema, ensure_ascii=False)
    required = set(schema.get("required", []))
    lines = []
    for name, node in props.items():
        if not isinstance(node, Mapping):
            continue
        desc = node.get("description") or _resolve_ref(schema, node).get("description") or ""
        opt = "" if name in required else ", optional"
        lines.append(f"- {name} ({_type_label(schema, node)}{opt})" + (f": {desc}" if desc else ""))
    return "\n".join(lines)


PromptLayout = Literal["fields_first", "document_first", "fields_first_plain"]
DEFAULT_LAYOUT: PromptLayout = "fields_first"


def build_messages(
    text: str,
    schema: Mapping[str, Any],
    *,
    instructions: str | None = None,
    examples: Sequence[tuple[str, Any]] | None = None,
    layout: PromptLayout = DEFAULT_LAYOUT,
) -> list[dict[str, str]]:
    """The chat messages ``extract`` sends: system rules, optional examples, then the document.

    ``layout`` is how the request is laid out (compared on SROIE by bench/extract_prompts.py):
    ``fields_first`` (the default) puts the field list before the document, so every
    document shares the longest prompt prefix in the KV cache; ``document_first`` puts it
    after; ``fields_first_plain`` leaves out pocket_agent's system message.
    """
    head = "Extract these fields from the document:\n" + describe_fields(schema)
    if instructions:
        head = instructions.strip() + "\n\n" + head

    def user(doc: str) -> str:
        if layout == "document_first":
            return f"Document:\n{doc}\n\n{head}"
        return f"{head}\n\nDocument:\n{doc}"

    messages = [] if layout == "fields_first_plain" else [{"role": "system", "content": SYSTEM_PROMPT}]
    for ex_text, ex_out in examples or []:
        # laid out as the grammar lays out the answer (JSON_LAYOUT), so the examples teach it
        value = ex_out.model_dump(mode="json") if isinstance(ex_out, BaseModel) else ex_out
        ex_json = json.dumps(value, ensure_ascii=False)
        messages.append({"role": "user", "content": user(ex_text)})
        messages.append({"role": "assistant", "content": ex_json})
    messages.append({"role": "user", "content": user(text)})
    return messages


# -- the extraction call -------------------------------------------------------------------


@dataclass
class _Prepared:
    model: Model
    schema: Schema
    json_schema: dict[str, Any]
    grammar: Any
    sampling: Sampling
    limits: Limits
    retries: int
    grammar_schema: dict[str, Any]
    grounded: Grounding = DEFAULT_GROUNDING
    adapter: AdapterChoice = "auto"

    @property
    def max_tokens(self) -> int:
        return self.limits.max_tokens


def _prepare(
    schema: Schema,
    model: Model | str | None,
    *,
    sampling: Sampling | None,
    limits: Limits | None,
    max_tokens: int | None,
    retries: int,
    grounded: Grounding = DEFAULT_GROUNDING,
    adapter: AdapterChoice = "auto",
) -> _Prepared:
    """Check the options and the schema, resolve the model and compile the grammar."""
    from .grammars import close_objects, compile_grammar
    from .grammars.schema import cap_lengths

    smp = resolve_sampling(sampling)
    lim = resolve_limits(limits, max_tokens=max_tokens)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise InvalidInputError(f"retries must be a non-negative integer, got {retries!r}.")
    check_grounding(grounded)
    check_adapter_choice(adapter)
    js = json_schema_of(schema)
    if isinstance(schema, Mapping):
        try:
            jsonschema.validators.validator_for(js).check_schema(js)
        except jsonschema.SchemaError as exc:
            raise SchemaError(
                f"Invalid JSON Schema: {exc.message} (at {'/'.join(map(str, exc.path)) or 'root'})"
            ) from exc
    # the shipped adapter on the default model: the default model with it merged (runtime/merged.py)
    m = get_default_model("extract") if model is None and adapter == "auto" else resolve_model(model)
    # Only the declared properties are written, even where a JSON Schema leaves objects open:
    # still a valid instance, and a small model given room for more keys invents them until
    # max_tokens (FACTS.md). Validation stays against the schema as written.
    grammar_schema = close_objects(js)
    # JSON laid out as json.dumps writes it (", " and ": "): SmolLM2-135M copies numbers
    # right far more often after '": ' than after '":' (bench/extract.md).
    grammar_schema = {**grammar_schema, "x-guidance": {**JSON_LAYOUT, **dict(grammar_schema.get("x-guidance") or {})}}
    if lim.max_string_chars is not None:
        grammar_schema = cap_lengths(grammar_schema, max_chars=lim.max_string_chars)
    grammar = compile_grammar(grammar_schema, m)
    if check_grounding(grounded) != (False, False) and m.capabilities.probabilities:
        # choosing numbers scores branches; the first call probes the model and clears its KV
        # cache, which after a document's prompt would cost that prompt again (1-2 s a receipt)
        with m.lock:
            branches_reliable(m)
    return _Prepared(
        model=m,
        schema=schema,
        json_schema=js,
        grammar=grammar,
        sampling=smp,
        limits=lim,
        retries=retries,
        grammar_schema=grammar_schema,
        grounded=grounded,
        adapter=adapter,
    )


def _check_text(text: Any) -> str:
    if not isinstance(text, str):
        raise InvalidInputError(f"text must be a string, got {type(text).__name__}.")
    if not text.strip():
        raise InvalidInputError("text is empty; give the document to extract from.")
    return text


def _prompt_ids(p: _Prepared, messages: list[dict[str, str]], text_len: int) -> list[int]:
    ids = render_prompt(p.model, messages)
    needed = len(ids) + p.max_tokens
    if needed > p.model.n_ctx:
        raise ContextOverflowError(
            f"The prompt is {len(ids)} tokens (the document is about {text_len} characters) and the output may "
            f"need up to {p.max_tokens} more, but the model's context window is {p.model.n_ctx} tokens. Split the "
            f"document into parts and extract from each, lower max_tokens, or load the model with a larger "
            f"n_ctx. Nothing was cut: the instructions must stay whole.",
            needed=needed,
            n_ctx=p.model.n_ctx,
        )
    return ids


def _validate(p: _Prepared, raw: str) -> Any:
    """Parse and validate; raises ValidationError / jsonschema.ValidationError."""
    if isinstance(p.schema, type) and issubclass(p.schema, BaseModel):
        return p.schema.model_validate_json(raw)
    data = json.loads(raw)
    jsonschema.validate(data, p.json_schema)
    return data


def _text_grammar(p: _Prepared, text: str, grounded: Grounding | None = None) -> Any:
    """The grammar for one document: grounded in ``text`` when the schema has grounded values."""
    strings, numbers = check_grounding(p.grounded if grounded is None else grounded)
    doc = document_grammar(p.model, p.grammar_schema, text, strings=strings, numbers=numbers)
    return p.grammar if doc is None else doc


def _error_text(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors())
    if isinstance(exc, jsonschema.ValidationError):
        return str(exc.message)
    return str(exc)


def _retry_messages(messages: list[dict[str, str]], raw: str, exc: Exception) -> list[dict[str, str]]:
    """The conversation for the next attempt: the failed answer and what was wrong with it."""
    return [
        *messages,
        {"role": "assistant", "content": raw},
        {
            "role": "user",
            "content": f"That answer failed validation: {_error_text(exc)}. "
            "Read the document again and answer with corrected JSON.",
        },
    ]


def _attempts(
    p: _Prepared,
    text: str,
    instructions: str | None,
    examples: Sequence[tuple[str, Any]] | None,
    first: list[int] | None = None,
    grammar: Any = None,
) -> Iterator[str | _Done | _NewAttempt]:
    """Run the attempts of one extraction, streaming: yields each attempt's output pieces
    (``str``, a retry announced by ``_NEW_ATTEMPT``) and, when an attempt validates, its
    value wrapped in ``_Done``; raises
    :class:`ExtractionError` after the last failed attempt. ``first``: the first attempt's
    output tokens, already generated (by a batch) after the same prompt and ``grammar``."""
    messages = build_messages(text, p.json_schema, instructions=instructions, examples=examples)
    if grammar is None:
        grammar = _text_grammar(p, text)
    last_raw: str | None = None
    last_error: Exception | None = None
    for attempt in range(p.retries + 1):
        if attempt:
            yield _NEW_ATTEMPT
        ids = _prompt_ids(p, messages, len(text))
        tokens: list[int] = []
        if attempt == 0 and first is not None:
            tokens = list(first)
            yield p.model.decode(tokens)
        else:
            for ev in stream_tokens(p.model, ids, grammar=grammar, sampling=p.sampling, limits=p.limits):
                tokens.extend(ev.tokens)
                yield ev.text
        generated = raw = p.model.decode(tokens)
        chosen: dict[str, float] = {}
        strings_grounded, numbers_grounded = check_grounding(p.grounded)
        if strings_grounded or numbers_grounded:
            raw, chosen = choose_numbers(p.model, ids, raw, p.grammar_schema, text)
        if strings_grounded:
            raw, _ = widen_words(raw, p.grammar_schema, text)
            raw, _ = choose_nulls(p.model, ids, raw, p.grammar_schema)
        last_raw = raw
        try:
            value = _validate(p, raw)
            yield _Done(value, raw=raw, prompt=ids, tokens=tokens, grammar=grammar, generated=generated, chosen=chosen)
            return
        except (ValidationError, jsonschema.ValidationError, ValueError) as exc:
            last_error = exc
            messages = _retry_messages(messages, raw, exc)
    raise ExtractionError(
        f"The output failed validation after {p.retries + 1} attempt(s): "
        f"{_error_text(last_error) if last_error else ''}",
        last_output=last_raw,
        errors=getattr(last_error, "errors", lambda: str(last_error))() if last_error else None,
    )


@dataclass(frozen=True)
class _Done:
    value: Any
    raw: str = ""
    prompt: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    grammar: Any = None
    generated: str = ""  # the text the tokens spell (``raw`` before numbers were chosen)
    chosen: dict[str, float] = field(default_factory=dict)  # chosen number fields -> mean probability


class _NewAttempt:
    """Marks the start of a retry in :func:`_attempts`' stream."""


_NEW_ATTEMPT = _NewAttempt()


def _extract_prepared(
    p: _Prepared,
    text: str,
    *,
    instructions: str | None,
    examples: Sequence[tuple[str, Any]] | None,
    confidence: bool = False,
    first: list[int] | None = None,
    grammar: Any = None,
) -> Any:
    with p.model.lock, task_adapter(p.model, p.adapter, "extract"):
        for item in _attempts(p, text, instructions, examples, first=first, grammar=grammar):
            if isinstance(item, _Done):
                if confidence:
                    scores = field_confidence(p.model, item.prompt, item.tokens, item.grammar, item.generated)
                    scores.update(item.chosen)
                    return Extraction(value=item.value, confidence=scores, raw=item.raw)
                return item.value
    raise AssertionError("unreachable: _attempts ends with a value or an error")


@overload
def extract(
    text: str,
    schema: type[T],
    *,
    model: Model | str | None = ...,
    instructions: str | None = ...,
    examples: Sequence[tuple[str, Any]] | None = ...,
    sampling: Sampling | None = ...,
    limits: Limits | None = ...,
    max_tokens: int | None = ...,
    retries: int = ...,
    grounded: Grounding = ...,
    confidence: Literal[False] = ...,
    adapter: AdapterChoice = ...,
) -> T: ...


@overload
def extract(
    text: str,
    schema: type[T],
    *,
    model: Model | str | None = ...,
    instructions: str | None = ...,
    examples: Sequence[tuple[str, Any]] | None = ...,
    sampling: Sampling | None = ...,
    limits: Limits | None = ...,
    max_tokens: int | None = ...,
    retries: int = ...,
    grounded: Grounding = ...,
    confidence: Literal[True],
    adapter: AdapterChoice = ...,
) -> Extraction[T]: ...


@overload
def extract(
    text: str,
    schema: Mapping[str, Any],
    *,
    model: Model | str | None = ...,
    instructions: str | None = ...,
    examples: Sequence[tuple[str, Any]] | None = ...,
    sampling: Sampling | None = ...,
    limits: Limits | None = ...,
    max_tokens: int | None = ...,
    retries: int = ...,
    grounded: Grounding = ...,
    confidence: bool = ...,
    adapter: AdapterChoice = ...,
) -> Any: ...


def extract(
    text: str,
    schema: Schema,
    *,
    model: Model | str | None = None,
    instructions: str | None = None,
    examples: Sequence[tuple[str, Any]] | None = None,
    sampling: Sampling | None = None,
    limits: Limits | None = None,
    max_tokens: int | None = None,
    retries: int = 1,
    grounded: Grounding = DEFAULT_GROUNDING,
    confidence: bool = False,
    adapter: AdapterChoice = "auto",
) -> Any:
    """Extract ``schema`` from ``text``.

    Args:
        text: the document.
        schema: a Pydantic model class (returns an instance) or a JSON Schema dict
            (returns the parsed JSON, validated with ``jsonschema``).
        model: a loaded model or path; default: the process-wide default model.
        instructions: extra guidance placed before the field list.
        examples: ``(document, expected_output)`` pairs shown to the model first.
        sampling: how tokens are chosen (default greedy).
        limits: ``max_tokens`` (running out raises
            :class:`~pocket_agent.errors.OutputBudgetExceeded` with the partial text),
            ``max_string_chars`` (free strings are closed after this many characters, so a
            model looping inside a string still finishes with a valid object) and the loop
            guard ``repeat_limit``; see :class:`~pocket_agent.Limits`.
        max_tokens: shortcut for ``limits.max_tokens``.
        retries: extra attempts when a Pydantic validator the grammar cannot express
            fails; afterwards :class:`~pocket_agent.errors.ExtractionError`.
        grounded: which values must be copied verbatim from ``text`` (see
            :mod:`pocket_agent.grounding`): ``True`` (default) grounds plain string fields
            (no enum, const, pattern or format; a field opts out with
            ``Field(json_schema_extra={"x-grounded": False})``), ``"all"`` numbers too
            (one of the numbers printed in the text), ``False`` nothing.
        confidence: return an :class:`~pocket_agent.grounding.Extraction` whose
            ``confidence`` gives each top-level field the mean probability of the tokens
            the model chose for it (one extra evaluation of the output, no generation).
        adapter: the extraction LoRA switched on while this call runs: ``"auto"`` (default)
            the one shipped for the model, if any (the embedded default model has one; a
            model with LoRAs the caller applied is left as it is), a GGUF LoRA's path
            (e.g. from ``pocket-agent tune extract``), or ``None`` for the base model.
            With ``model=None`` the default model that ``Agent`` and ``decide`` share runs it,
            the adapter applied at run time (under ``POCKET_AGENT_LAYOUT=speed``: a model of
            its own with the adapter merged into its weights, faster, about twice the memory);
            a model passed in (or set with ``set_default_model``) is used as it is, with the
            adapter applied at run time unless it was loaded merged.
    """
    _check_text(text)
    p = _prepare(
        schema,
        model,
        sampling=sampling,
        limits=limits,
        max_tokens=max_tokens,
        retries=retries,
        grounded=grounded,
        adapter=adapter,
    )
    return _extract_prepared(p, text, instructions=instructions, examples=examples, confidence=bool(confidence))


# -- many documents --------------------------------------------------------------------------


@dataclass
class ExtractOutcome(Generic[T]):
    """One document's result in :func:`extract_many`: ``value`` or ``error``."""

    index: int
    value: T | None = None
    error: PocketAgentError | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


@overload
def extract_many(
    texts: Iterable[Any],
    schema: type[T],
    *,
    model: Model | str | None = ...,
    instructions: str | None = ...,
    examples: Sequence[tuple[str, Any]] | None = ...,
    sampling: Sampling | None = ...,
    limits: Limits | None = ...,
    max_tokens: int | None = ...,
    retries: int = ...,
    progress: bool | None = ...,
    grounded: Grounding = ...,
    adapter: AdapterChoice = ...,
    batch: int = ...,
) -> Iterator[ExtractOutcome[T]]: ...


@overload
def extract_many(
    texts: Iterable[Any],
    schema: Mapping[str, Any],
    *,
    model: Model | str | None = ...,
    instructions: str | None = ...,
    examples: Sequence[tuple[str, Any]] | None = ...,
    sampling: Sampling | None = ...,
    limits: Limits | None = ...,
    max_tokens: int | None = ...,
    retries: int = ...,
    progress: bool | None = ...,
    grounded: Grounding = ...,
    adapter: AdapterChoice = ...,
    batch: int = ...,
) -> Iterator[ExtractOutcome[Any]]: ...


def extract_many(
    texts: Iterable[Any],
    schema: Schema,
    *,
    model: Model | str | None = None,
    instructions: str | None = None,
    examples: Sequence[tuple[str, Any]] | None = None,
    sampling: Sampling | None = None,
    limits: Limits | None = None,
    max_tokens: int | None = None,
    retries: int = 1,
    progress: bool | None = None,
    grounded: Grounding = DEFAULT_GROUNDING,
    adapter: AdapterChoice = "auto",
    batch: int = 1,
) -> Iterator[ExtractOutcome[Any]]:
    """Extract from many documents, yielding one :class:`ExtractOutcome` per document in order.

    The prompt shared by every document (system rules, field list, examples) stays in the
    KV cache, so each document evaluates only its own tokens. A bad document (wrong type,
    too long, output budget exhausted, validation failure) is reported on its outcome and
    the run goes on. An exception instance among ``texts`` (how a reader flags an
    unreadable record) is reported as that item's error. ``progress`` shows a progress
    bar on stderr (default: when stderr is a terminal). The other options are those of
    :func:`extract`; the model's lock is held while a document is worked on, and the
    extraction adapter stays switched on until the iteration ends (so the shared prompt
    stays cached).

    ``batch``: how many documents are decoded together (default 1: one at a time, as
    :func:`extract` would). With ``batch > 1`` on llama.cpp the documents' sampled tokens
    are evaluated in one batch per step, in a second context on the same weights with one
    KV stream per document (about 23 KB per token of extra memory for SmolLM2-135M, 2048
    tokens per document; a longer one is extracted alone); prompts and forced runs are
    evaluated one document at a time, so every output equals one-by-one extraction on
    Q8_0 weights; on a BF16 copy (``layout``, :mod:`pocket_agent.runtime.layout`) llama.cpp
    sums a row alone in another order than a row among several, so a document's logits
    move by up to ~0.15 and a near-tie may go the other way (``layout="q8_0"`` is exact).
    Everything after generation (number choice, widening, validation, retries) is as in
    :func:`extract`. Measured on 40 SROIE receipts at 1 thread: 3.52 s/doc at ``batch=4``
    against 3.64 one at a time on an Intel Xeon, 2.64 against 2.61 on an AMD EPYC, so it
    stays opt-in (``bench/extract.md``). Backends without several
    sequences (MNN, Transformers) and a sampling with ``speculate`` extract one at a time.
    With ``batch > 1`` an outcome's ``seconds`` is the time from the document's start to
    its result, overlapping the others'.
    """
    p = _prepare(
        schema,
        model,
        sampling=sampling,
        limits=limits,
        max_tokens=max_tokens,
        retries=retries,
        grounded=grounded,
        adapter=adapter,
    )
    show = sys.stderr.isatty() if progress is None else progress
    total = len(texts) if isinstance(texts, Sequence) else None
    bar = DocumentProgress(total, show)
    width = 1 if p.sampling.speculate else batch_width(p.model, batch)
    with task_adapter(p.model, p.adapter, "extract"):
        try:
            if width > 1:
                yield from _extract_batched(p, texts, width, bar, instructions=instructions, examples=examples)
                return
            for i, text in enumerate(texts):
                t0 = time.perf_counter()
                try:
                    if isinstance(text, PocketAgentError):
                        raise text
                    _check_text(text)
                    value = _extract_prepared(p, text, instructions=instructions, examples=examples)
                    outcome: ExtractOutcome[Any] = ExtractOutcome(index=i, value=value)
                except PocketAgentError as exc:
                    outcome = ExtractOutcome(index=i, error=exc)
                outcome.seconds = time.perf_counter() - t0
                bar.update(outcome.ok)
                yield outcome
        finally:
            bar.close()


@dataclass
class _Doc:
    index: int
    text: str
    grammar: Any
    started: float


def _extract_batched(
    p: _Prepared,
    texts: Iterable[Any],
    width: int,
    bar: DocumentProgress,
    *,
    instructions: str | None,
    examples: Sequence[tuple[str, Any]] | None,
) -> Iterator[ExtractOutcome[Any]]:
    """:func:`extract_many` with up to ``width`` documents decoded together, outcomes in order."""
    ready: dict[int, ExtractOutcome[Any]] = {}

    def settle(outcome: ExtractOutcome[Any], started: float) -> None:
        outcome.seconds = time.perf_counter() - started
        bar.update(outcome.ok)
        ready[outcome.index] = outcome

    def jobs() -> Iterator[BatchJob]:
        for i, text in enumerate(texts):
            t0 = time.perf_counter()
            try:
                if isinstance(text, PocketAgentError):
                    raise text
                _check_text(text)
                messages = build_messages(text, p.json_schema, instructions=instructions, examples=examples)
                ids = _prompt_ids(p, messages, len(text))
                grammar = _text_grammar(p, text)
            except PocketAgentError as exc:
                settle(ExtractOutcome(index=i, error=exc), t0)
                continue
            yield BatchJob(prompt=ids, grammar=grammar, data=_Doc(i, text, grammar, t0))

    next_index = 0
    for result in generate_batched(p.model, jobs(), width=width, sampling=p.sampling, limits=p.limits):
        doc: _Doc = result.job.data
        try:
            if result.error is not None:
                raise result.error
            value = _extract_prepared(
                p, doc.text, instructions=instructions, examples=examples, first=result.tokens, grammar=doc.grammar
            )
            outcome: ExtractOutcome[Any] = ExtractOutcome(index=doc.index, value=value)
        except PocketAgentError as exc:
            outcome = ExtractOutcome(index=doc.index, error=exc)
        settle(outcome, doc.started)
        while next_index in ready:
            yield ready.pop(next_index)
            next_index += 1
    # documents that failed before generation, after the last result
    for index in sorted(ready):
        yield ready.pop(index)


# -- streaming ---------------------------------------------------------------------------------


def complete_fields(prefix: str) -> dict[str, Any]:
    """Top-level fields of a JSON object whose values are complete in ``prefix``.

    A value counts as complete once the delimiter after it (``,`` or ``}``) has arrived,
    so a number like ``12`` is not reported before it could still become ``123``.
    """
    out: dict[str, Any] = {}
    n = len(prefix)
    for key, value, _, end in json_members(prefix):
        while end < n and prefix[end] in " \t\r\n":
            end += 1
        if end >= n or prefix[end] not in ",}":
            break
        out[key] = value
    return out


def extract_stream(
    text: str,
    schema: Schema,
    *,
    model: Model | str | None = None,
    instructions: str | None = None,
    examples: Sequence[tuple[str, Any]] | None = None,
    sampling: Sampling | None = None,
    limits: Limits | None = None,
    max_tokens: int | None = None,
    retries: int = 1,
    grounded: Grounding = DEFAULT_GROUNDING,
    adapter: AdapterChoice = "auto",
) -> Iterator[Any]:
    """Yield partial results as fields complete, then the validated object.

    Each partial result is a dict of the top-level fields completed so far (a new dict
    each time a field completes). The last item is the same value :func:`extract`
    returns. When a validator fails and ``retries`` remain, the next attempt starts over
    and its partial results follow; after the last failed attempt
    :class:`ExtractionError` is raised. The options are those of :func:`extract`; the
    model's lock is held until the stream ends or is closed.
    """
    _check_text(text)
    p = _prepare(
        schema,
        model,
        sampling=sampling,
        limits=limits,
        max_tokens=max_tokens,
        retries=retries,
        grounded=grounded,
        adapter=adapter,
    )
    with p.model.lock, task_adapter(p.model, p.adapter, "extract"):
        buf: list[str] = []
        seen = 0
        for item in _attempts(p, text, instructions, examples):
            if isinstance(item, _Done):
                yield item.value
                return
            if isinstance(item, _NewAttempt):
                buf, seen = [], 0
                continue
            buf.append(item)
            fields = complete_fields("".join(buf))
            if len(fields) > seen:
                seen = len(fields)
                yield fields
