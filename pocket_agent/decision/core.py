"""``decide`` and ``decide_many``: pick one of several options in one forward pass."""

from __future__ import annotations

import contextlib
import importlib.resources
import os
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from ..errors import AdapterError, InvalidInputError, PocketAgentError
from ..options import Limits, Sampling
from ..runtime import (
    LayerStates,
    LoraAdapter,
    Model,
    StatesRequest,
    branch_logits,
    branches_reliable,
    common_prefix_length,
    resolve_model,
)
from ..runtime.identity import model_identity
from ..runtime.merged import check_base_weights
from ._features import FeatureSpec, PassRows, build_features, log_softmax_at, logsumexp, needed_positions
from ._head import softmax
from ._layout import (
    DEFAULT_FORMAT,
    LISTED_FORMAT,
    BranchLayout,
    ClozeLayout,
    PointerLayout,
    PromptFormat,
    check_question,
    cloze_layout,
    label_token_ids,
    option_layout,
    pointer_layout,
)
from .adapter import (
    DecisionAdapter,
    get_decision_adapter,
    load_decision_adapter,
    safetensors_metadata,
)

Method = Literal["auto", "cloze", "letter", "pointer"]
METHODS: tuple[str, ...] = ("auto", "cloze", "letter", "pointer")

# llama.cpp batch limits used when grouping sequences into one decode (the runtime's defaults)
_MAX_BATCH_TOKENS = 512
_MAX_BATCH_SEQS = 7


@dataclass
class Decision:
    """The answer to one question.

    ``choice`` is the chosen option's text and ``index`` its position in ``options``;
    ``scores`` holds one probability per option (they sum to 1) and ``logits`` the raw
    scores they were computed from (log-probabilities for ``cloze``, label logits for
    ``letter``, head scores for ``pointer``). ``method`` is the method that ran (never
    ``"auto"``).
    """

    choice: str
    index: int
    scores: list[float]
    method: str
    options: list[str] = field(default_factory=list)
    logits: list[float] = field(default_factory=list)

    @property
    def confidence(self) -> float:
        """Probability of the chosen option."""
        return self.scores[self.index]


@dataclass
class Question:
    question: str
    options: list[str]
    context: str | None


def _make_decision(item: Question, raw: NDArray[np.floating], method: str) -> Decision:
    probs = softmax(raw)
    idx = int(np.argmax(raw))
    return Decision(
        choice=item.options[idx],
        index=idx,
        scores=[float(p) for p in probs],
        method=method,
        options=list(item.options),
        logits=[float(v) for v in raw],
    )


# -- evaluation helpers ---------------------------------------------------------------


def _eval_rows(model: Model, tokens: list[int], positions: list[int], hidden: bool) -> PassRows:
    """Evaluate ``tokens`` (reusing the cached common prefix) and return rows at ``positions``."""
    keep = min(model.reusable_prefix(tokens), positions[0])
    model.rollback(keep)
    out = model.eval(tokens[keep:], logits=[p - keep for p in positions], hidden=hidden)
    logits = {p: out.logits[j] for j, p in enumerate(positions)}
    hid = {p: out.hidden[j] for j, p in enumerate(positions)} if hidden and out.hidden is not None else {}
    return PassRows(logits=logits, hidden=hid)


def _eval_rows_many(
    model: Model, jobs: Sequence[tuple[list[int], list[int]]], hidden: bool, *, batched: bool
) -> list[PassRows]:
    """Rows for many ``(tokens, positions)`` jobs.

    With ``batched`` and a multi-sequence backend, jobs are grouped (at most
    ``_MAX_BATCH_SEQS`` sequences and ``_MAX_BATCH_TOKENS`` new tokens per group) and each
    group is one :meth:`Model.eval_branches` call whose shared prefix is evaluated once.
    Otherwise jobs run one by one in an order that maximises KV-cache prefix reuse.
    """
    results: list[PassRows | None] = [None] * len(jobs)
    order = sorted(range(len(jobs)), key=lambda i: jobs[i][0])
    if not batched or len(jobs) < 2 or not branches_reliable(model):
        for i in order:
            toks, pos = jobs[i]
            results[i] = _eval_rows(model, toks, pos, hidden)
        return [r for r in results if r is not None]
    group: list[int] = []
    group_tokens = 0

    def flush() -> None:
        nonlocal group, group_tokens
        if group:
            _eval_group(model, [jobs[i] for i in group], hidden, results, group)
        group, group_tokens = [], 0

    for i in order:
        toks, _ = jobs[i]
        if len(toks) > _MAX_BATCH_TOKENS:
            results[i] = _eval_rows(model, toks, jobs[i][1], hidden)
            continue
        if group and (len(group) >= _MAX_BATCH_SEQS or group_tokens + len(toks) > _MAX_BATCH_TOKENS * 2):
            flush()
        group.append(i)
        group_tokens += len(toks)
    flush()
    return [r for r in results if r is not None]


def _eval_group(
    model: Model,
    jobs: list[tuple[list[int], list[int]]],
    hidden: bool,
    results: list[PassRows | None],
    slots: list[int],
) -> None:
    prefix_len = min(len(t) - 1 for t, _ in jobs)
    first = jobs[0][0]
    for toks, pos in jobs:
        prefix_len = min(prefix_len, common_prefix_length(first, toks), pos[0] + 1)
    prefix_len = max(prefix_len, 1)
    branches = [toks[prefix_len:] for toks, _ in jobs]
    if sum(len(b) for b in branches) > _MAX_BATCH_TOKENS or any(not b for b in branches):
        for (toks, pos), slot in zip(jobs, slots, strict=True):
            results[slot] = _eval_rows(model, toks, pos, hidden)
        return
    outs = model.eval_branches(first[:prefix_len], branches, hidden=hidden)
    base = prefix_len - 1  # row 0 of each branch output is the last prefix token
    for (_, pos), out, slot in zip(jobs, outs, slots, strict=True):
        logits = {p: out.logits[p - base] for p in pos}
        hid = {p: out.hidden[p - base] for p in pos} if hidden and out.hidden is not None else {}
        results[slot] = PassRows(logits=logits, hidden=hid)


@contextlib.contextmanager
def _lora_on(model: Model, adapter: DecisionAdapter | None) -> Iterator[None]:
    """Switch the adapter's LoRA on for the duration (it stays off otherwise)."""
    lora = adapter.lora if adapter is not None else None
    if lora is None or lora not in model.loras:
        yield
        return
    previous = lora.scale
    if previous != adapter.lora_scale:  # type: ignore[union-attr]
        model.set_lora_scale(lora, adapter.lora_scale)  # type: ignore[union-attr]
    try:
        yield
    finally:
        if lora.scale != previous:
            model.set_lora_scale(lora, previous)


# -- the three methods ----------------------------------------------------------------


def _score_cloze(model: Model, items: Sequence[Question], fmt: PromptFormat) -> list[NDArray[np.float64]]:
    layouts = [cloze_layout(model, fmt, it.question, it.options, it.context) for it in items]
    order = sorted(range(len(items)), key=lambda i: layouts[i].prefix)
    out: list[NDArray[np.float64] | None] = [None] * len(items)
    for i in order:
        out[i] = _cloze_scores(model, layouts[i])
    return [o for o in out if o is not None]


def _cloze_scores(model: Model, lay: ClozeLayout) -> NDArray[np.float64]:
    rows = branch_logits(model, lay.prefix, lay.branches)
    scores = []
    for branch, logits in zip(lay.branches, rows, strict=True):
        scores.append(sum(log_softmax_at(logits[j], tok) for j, tok in enumerate(branch)))
    return np.asarray(scores, dtype=np.float64)


def _score_letter(
    model: Model, items: Sequence[Question], fmt: PromptFormat, *, batched: bool
) -> list[NDArray[np.float64]]:
    layouts = [pointer_layout(model, fmt, it.question, it.options, it.context) for it in items]
    jobs = [(lay.tokens, [lay.answer_pos]) for lay in layouts]
    rows = _eval_rows_many(model, jobs, False, batched=batched)
    out = []
    for it, lay, r in zip(items, layouts, rows, strict=True):
        ids = label_token_ids(model, fmt.labels, len(it.options))
        row = r.logits[lay.answer_pos]
        out.append(np.asarray([logsumexp(row[list(v)]) for v in ids], dtype=np.float64))
    return out


def _eval_branch_rows(model: Model, lay: BranchLayout, positions: list[int], hidden: bool) -> PassRows:
    """Rows at virtual ``positions`` of a branch layout: the prefix once, then each option after it."""
    n_pre = len(lay.prefix)
    pre_pos = sorted({p for p in positions if p < n_pre} | {n_pre - 1})
    reliable = branches_reliable(model)  # its first call probes the model and clears the cache
    rows = _eval_rows(model, lay.prefix, pre_pos, hidden)
    offs = lay.offsets()
    wanted = [[p - o for p in positions if o <= p < o + len(b)] for o, b in zip(offs, lay.branches, strict=True)]
    if reliable and len(lay.branches) > 1:
        outs = model.eval_branches(lay.prefix, lay.branches, hidden=hidden)
        for o, want, out in zip(offs, wanted, outs, strict=True):
            for j in want:  # row 0 is the last prefix token
                rows.logits[o + j] = out.logits[j + 1]
                if hidden and out.hidden is not None:
                    rows.hidden[o + j] = out.hidden[j + 1]
        return rows
    for o, want, branch in zip(offs, wanted, lay.branches, strict=True):
        if not want:
            continue
        out = model.eval(branch, logits=want, hidden=hidden)
        model.rollback(n_pre)
        for k, j in enumerate(want):
            rows.logits[o + j] = out.logits[k]
            if hidden and out.hidden is not None:
                rows.hidden[o + j] = out.hidden[k]
    return rows


def _states_request(lay: PointerLayout | BranchLayout, positions: list[int]) -> StatesRequest:
    if isinstance(lay, PointerLayout):
        return StatesRequest(prefix=lay.tokens, prefix_positions=positions)
    n_pre = len(lay.prefix)
    return StatesRequest(prefix=lay.prefix, branches=lay.branches, prefix_positions=[p for p in positions if p < n_pre])


def _layer_rows(lay: PointerLayout | BranchLayout, req: StatesRequest, states: LayerStates) -> PassRows:
    hidden = {p: states.prefix[k] for k, p in enumerate(req.prefix_positions)}
    if isinstance(lay, BranchLayout):
        for o, rows in zip(lay.offsets(), states.branches, strict=True):
            for j in range(rows.shape[0]):
                hidden[o + j] = rows[j]
    return PassRows(logits={}, hidden=hidden)


def _inner_layer_features(
    model: Model,
    spec: FeatureSpec,
    layouts: Sequence[PointerLayout | BranchLayout],
    *,
    batched: bool,
    lora: tuple[LoraAdapter, float] | None,
) -> list[NDArray[np.float32]]:
    """Features read after an inner block: every question (and every option branch) of a
    call goes to :meth:`Model.layer_states` together, which stops after that block."""
    layer = spec.inner_layer
    assert layer is not None
    reqs = [_states_request(lay, needed_positions(spec, lay.points())) for lay in layouts]
    loras = [lora] if lora is not None else []
    if batched:
        states = model.layer_states(reqs, layer=layer, loras=loras)
    else:
        # one request at a time, in prefix order so each reuses the cached prefix of the last
        found: list[LayerStates | None] = [None] * len(reqs)
        for i in sorted(range(len(reqs)), key=lambda i: reqs[i].prefix):
            found[i] = model.layer_states([reqs[i]], layer=layer, loras=loras)[0]
        states = [st for st in found if st is not None]
    return [
        build_features(spec, _layer_rows(lay, req, st), lay.points(), [])
        for lay, req, st in zip(layouts, reqs, states, strict=True)
    ]


def pointer_features(
    model: Model,
    spec: FeatureSpec,
    fmt: PromptFormat,
    items: Sequence[Question],
    *,
    batched: bool = False,
    lora: tuple[LoraAdapter, float] | None = None,
) -> list[NDArray[np.float32]]:
    """Feature matrices (one ``[n_options, dim]`` per item) in the exact inference layout."""
    if fmt.layout == "branches" and "letter_logit" in spec.parts:
        raise AdapterError("The 'letter_logit' feature needs the 'listed' prompt layout.")
    layouts = [option_layout(model, fmt, it.question, it.options, it.context) for it in items]
    if spec.inner_layer is not None:
        return _inner_layer_features(model, spec, layouts, batched=batched, lora=lora)
    hidden = spec.needs_hidden
    rows: list[PassRows | None] = [None] * len(items)
    listed = [i for i, lay in enumerate(layouts) if isinstance(lay, PointerLayout)]
    if listed:
        jobs = []
        for i in listed:
            lay = layouts[i]
            assert isinstance(lay, PointerLayout)
            jobs.append((lay.tokens, needed_positions(spec, lay.points())))
        for i, r in zip(listed, _eval_rows_many(model, jobs, hidden, batched=batched), strict=True):
            rows[i] = r
    order = sorted(range(len(items)), key=lambda i: _layout_prefix(layouts[i]))
    for i in order:
        lay = layouts[i]
        if isinstance(lay, BranchLayout):
            rows[i] = _eval_branch_rows(model, lay, needed_positions(spec, lay.points()), hidden)
    feats = []
    for it, lay, got in zip(items, layouts, rows, strict=True):
        assert got is not None
        label_ids = label_token_ids(model, fmt.labels, len(it.options)) if "letter_logit" in spec.parts else []
        feats.append(build_features(spec, got, lay.points(), label_ids))
    return feats


def _layout_prefix(lay: PointerLayout | BranchLayout) -> list[int]:
    return lay.tokens if isinstance(lay, PointerLayout) else lay.prefix


def _score_pointer(
    model: Model, items: Sequence[Question], adapter: DecisionAdapter, *, batched: bool
) -> list[NDArray[np.float64]]:
    if adapter.features.inner_layer is not None:
        lora = (adapter.lora, adapter.lora_scale) if adapter.lora is not None else None
        feats = pointer_features(model, adapter.features, adapter.prompt, items, batched=batched, lora=lora)
    else:
        with _lora_on(model, adapter):
            feats = pointer_features(model, adapter.features, adapter.prompt, items, batched=batched)
    return [adapter.head.scores(f) for f in feats]


# -- the shipped default heads ----------------------------------------------------------

_default_checked: weakref.WeakSet[Model] = weakref.WeakSet()
_default_lock = threading.Lock()


def shipped_heads() -> list[Path]:
    """Decision heads shipped inside the package (``pocket_agent/data/*.safetensors``)."""
    root = importlib.resources.files("pocket_agent") / "data"
    try:
        entries = list(root.iterdir())
    except (FileNotFoundError, NotADirectoryError, OSError):
        return []
    return sorted(Path(str(e)) for e in entries if e.name.endswith(".safetensors") and e.is_file())


def find_shipped_head(model: Model) -> Path | None:
    """The shipped head whose base-model identity matches ``model``, if any."""
    ident = model_identity(model)
    for path in shipped_heads():
        try:
            with path.open("rb") as f:
                n = int.from_bytes(f.read(8), "little")
                header = f.read(n) if 0 < n < 10_000_000 else b""
            meta = safetensors_metadata(n.to_bytes(8, "little") + header, str(path))
        except (OSError, PocketAgentError):
            continue
        if meta.get("base_model_id") == ident:
            return path
    return None


def _active_adapter(model: Model) -> DecisionAdapter | None:
    adapter = get_decision_adapter(model)
    if adapter is not None:
        return adapter
    if os.environ.get("POCKET_AGENT_NO_DEFAULT_HEAD"):
        return None
    with _default_lock:
        if model in _default_checked:
            return get_decision_adapter(model)
        _default_checked.add(model)
        path = find_shipped_head(model)
        if path is None:
            return None
        try:
            return load_decision_adapter(model, path)
        except AdapterError:
            # e.g. the MNN build of the default model: its backend cannot read inner
            # blocks, so decide() uses cloze there
            return None


def forget_default_head(model: Model) -> None:
    """Stop ``decide`` from loading a shipped head into ``model`` automatically."""
    with _default_lock:
        _default_checked.add(model)


# -- public API --------------------------------------------------------------------------


def _resolve_method(model: Model, method: str) -> tuple[str, DecisionAdapter | None]:
    check_base_weights(model, "decide")
    if method not in METHODS:
        raise InvalidInputError(f"method must be one of {', '.join(METHODS)}; got {method!r}.")
    if method == "auto":
        adapter = _active_adapter(model)
        return ("pointer", adapter) if adapter is not None else ("cloze", None)
    if method == "pointer":
        adapter = _active_adapter(model)
        if adapter is None:
            raise AdapterError(
                "method='pointer' needs a decision adapter: load one with load_decision_adapter(model, path) "
                "or train one with train_head(); method='auto' falls back to cloze."
            )
        return "pointer", adapter
    return method, None


def score_questions(
    model: Model, items: Sequence[Question], method: str, adapter: DecisionAdapter | None, *, batched: bool
) -> list[NDArray[np.float64]]:
    if method == "cloze":
        return _score_cloze(model, items, DEFAULT_FORMAT)
    if method == "letter":
        return _score_letter(model, items, LISTED_FORMAT, batched=batched)
    assert adapter is not None
    return _score_pointer(model, items, adapter, batched=batched)


def decide(
    question: str,
    options: Sequence[str],
    *,
    context: str | None = None,
    model: Model | str | os.PathLike[str] | None = None,
    method: Method = "auto",
    sampling: Sampling | None = None,
    limits: Limits | None = None,
) -> Decision:
    """Pick the best of ``options`` for ``question`` (about ``context``) in one forward pass.

    Args:
        question: the question, e.g. ``"Is this review positive?"``.
        options: at least two distinct, non-empty option texts.
        context: optional text the question is about (a review, a passage, ...).
        model: a loaded model, a model path, or ``None`` for the process-wide default.
        method: ``"cloze"`` (sum log-probability of each option's text, all options in
            one batched evaluation), ``"letter"`` (logits of the labels ``A``, ``B``, ...
            at the answer position), ``"pointer"`` (a trained Dec adapter: a head scores
            the hidden state closing each option) or ``"auto"`` (``pointer`` when an
            adapter is loaded or shipped for this model, else ``cloze``).
        sampling: refused (``InvalidInputError``) unless ``None``: a decision scores the
            options in one pass and generates nothing, so sampling cannot apply to it.
        limits: refused unless ``None``, as ``sampling``.

    Returns:
        A :class:`Decision` with ``choice``, ``index``, ``scores`` (probabilities) and
        ``method``.

    Raises:
        InvalidInputError: bad arguments (non-string question, fewer than two options,
            empty or duplicate options, more options than labels, unknown method).
        ContextOverflowError: the prompt with its options does not fit the context window.
        AdapterError: ``method="pointer"`` without a usable adapter.
    """
    _refuse_generation_options(sampling, limits)
    q, opts, ctx = check_question(question, options, context)
    m = resolve_model(model)
    with m.lock:
        chosen, adapter = _resolve_method(m, method)
        item = Question(q, opts, ctx)
        raw = score_questions(m, [item], chosen, adapter, batched=False)[0]
    return _make_decision(item, raw, chosen)


def _refuse_generation_options(sampling: Sampling | None, limits: Limits | None) -> None:
    """``decide`` uses what it is given or refuses it: it generates nothing, so sampling and limits
    (which every generating entry point takes) cannot apply."""
    given = [name for name, value in (("sampling", sampling), ("limits", limits)) if value is not None]
    if given:
        raise InvalidInputError(
            f"decide scores the options in one forward pass and generates nothing, so {' and '.join(given)} "
            "cannot apply; leave it out (choose how options are scored with method=)."
        )


def _parse_item(i: int, raw: object) -> Question:
    if isinstance(raw, Mapping):
        if "question" not in raw or "options" not in raw:
            raise InvalidInputError(f"items[{i}] needs 'question' and 'options' keys.")
        q, o, c = raw["question"], raw["options"], raw.get("context")
    elif isinstance(raw, Sequence) and not isinstance(raw, (str, bytes)) and 2 <= len(raw) <= 3:
        q, o = raw[0], raw[1]
        c = raw[2] if len(raw) == 3 else None
    else:
        raise InvalidInputError(
            f"items[{i}] must be a dict with question/options[/context] or a (question, options[, context]) tuple."
        )
    try:
        qq, oo, cc = check_question(q, o, c)
    except InvalidInputError as exc:
        raise InvalidInputError(f"items[{i}]: {exc}") from exc
    return Question(qq, oo, cc)


def decide_many(
    items: Iterable[Mapping[str, object] | Sequence[object]],
    *,
    model: Model | str | os.PathLike[str] | None = None,
    method: Method = "auto",
    batched: bool | None = None,
    sampling: Sampling | None = None,
    limits: Limits | None = None,
) -> list[Decision]:
    """Answer many questions; results come back in the order of ``items``.

    Each item is a dict ``{"question", "options", "context"?}`` (extra keys such as
    ``answer`` are ignored) or a tuple ``(question, options[, context])``. All items are
    validated before anything is evaluated.

    The prefix shared by all items (the chat-template header, any common text) is
    evaluated once and every item reuses it. A pointer head that reads an inner block
    (the shipped heads do) runs the questions one after another, sorted so each reuses
    the cached prefix of the previous one, and gives exactly the results of
    :func:`decide`; ``batched=True`` packs up to 15 option sequences of several
    questions into one decode instead (worth it where a decode is bound by per-call
    overhead rather than compute, e.g. a GPU build; the features then differ from
    :func:`decide`'s by llama.cpp's batch-dependent rounding). ``letter`` questions are
    batched where the backend reproduces one-sequence results in a batch
    (:func:`branches_reliable`). ``cloze`` batches the options of each question.
    ``batched=False`` forces the sequential path everywhere. ``sampling`` and ``limits`` are
    refused, as by :func:`decide`.
    """
    _refuse_generation_options(sampling, limits)
    if isinstance(items, (str, bytes, Mapping)):
        raise InvalidInputError("items must be a list of questions (dicts or tuples).")
    parsed = [_parse_item(i, raw) for i, raw in enumerate(items)]
    if not parsed:
        return []
    m = resolve_model(model)
    with m.lock:
        return _decide_all(m, parsed, method, batched)


def _decide_all(m: Model, parsed: list[Question], method: Method, batched: bool | None) -> list[Decision]:
    chosen, adapter = _resolve_method(m, method)
    if batched is None:
        # Several questions in one decode change the pointer features slightly (llama.cpp's
        # CPU kernels round differently per batch layout; about 1% of the feature scale,
        # enough to flip close calls) and were not faster on CPU, so by default pointer
        # questions run one by one and decide_many(x) == [decide(q) for q in x] exactly.
        batched = not (chosen == "pointer" and adapter is not None and adapter.features.inner_layer is not None)
    use_batch = bool(batched)
    raws = score_questions(m, parsed, chosen, adapter, batched=use_batch)
    return [_make_decision(it, r, chosen) for it, r in zip(parsed, raws, strict=True)]
