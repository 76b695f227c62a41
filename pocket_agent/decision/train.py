"""Fitting a pointer head on labelled questions (numpy only, runs on the CPU)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from ..errors import InvalidInputError
from ..runtime import Model, resolve_model
from ..runtime.identity import model_identity
from ..runtime.merged import check_base_weights
from ._features import FINAL_NORM, FeatureSpec
from ._head import FitReport, LinearHead, fit_head
from ._layout import DEFAULT_FORMAT, PromptFormat, check_question
from .adapter import DecisionAdapter, new_adapter
from .core import Question, pointer_features, score_questions

DEPTH_FRACTION = 0.6
"""Where ``train_head`` reads hidden states by default: after the block at 60% of the
model's depth (block 17 of SmolLM2-135M's 30). On SmolLM2 the middle blocks carried the
decision signal (sst2 test accuracy of a linear head: 0.83-0.86 after blocks 16-18,
0.80 at the final blocks, 0.5-0.65 below block 10), and a pass that stops there skips
40% of the compute."""

DEFAULT_FEATURES = FeatureSpec(parts=("hidden@marker",))
"""The simplest pointer features: the final-norm hidden state at the marker (the newline)
that closes each option."""


def default_layer(model: Model) -> int | str:
    """The block ``train_head`` reads features after on ``model`` (:data:`DEPTH_FRACTION`
    of its depth), or ``"final_norm"`` where the backend cannot read inner blocks."""
    n = model.info.n_layer
    if not model.capabilities.layer_states or n < 3:
        return FINAL_NORM
    return max(0, min(n - 2, round(n * DEPTH_FRACTION) - 1))


AUTO_CANDIDATES: tuple[tuple[str, ...], ...] = (
    ("hidden@marker",),
    ("hidden@option_end",),
    ("hidden@marker", "hidden@marker*context_mean"),
)
"""Feature sets ``train_head(features="auto")`` chooses from (by early-stopping loss)."""


def _slice(spec: FeatureSpec, parts: tuple[str, ...], n_embd: int) -> list[int]:
    """Column indices of ``parts`` inside features extracted with ``spec``."""
    cols: list[int] = []
    for p in parts:
        start = 0
        for q in spec.parts:
            width = FeatureSpec(parts=(q,), token_ids=spec.token_ids).dim(n_embd)
            if q == p:
                cols.extend(range(start, start + width))
                break
            start += width
    return cols


Progress = Callable[[str, int, int], None]
FeatureCache = dict[tuple[str, str, str, str, tuple[str, ...], str | None], NDArray[np.float32]]
"""Features by (model identity, feature spec, prompt format, question, options, context)."""


@dataclass
class Example:
    """One labelled question: ``answer`` is the index of the right option."""

    question: str
    options: list[str]
    answer: int
    context: str | None = None

    def item(self) -> Question:
        return Question(self.question, self.options, self.context)

    def rotated(self, shift: int) -> Example:
        """The same question with its options rotated left by ``shift``."""
        k = shift % len(self.options)
        return Example(
            self.question, self.options[k:] + self.options[:k], (self.answer - k) % len(self.options), self.context
        )


def parse_example(i: int, row: object) -> Example:
    """Validate one ``{question, options, answer, context?}`` row; ``answer`` may be an index or the option text."""
    if not isinstance(row, Mapping):
        raise InvalidInputError(f"examples[{i}] must be a dict with question, options and answer.")
    for key in ("question", "options", "answer"):
        if key not in row:
            raise InvalidInputError(f"examples[{i}] lacks {key!r}.")
    try:
        q, opts, ctx = check_question(row["question"], row["options"], row.get("context"))
    except InvalidInputError as exc:
        raise InvalidInputError(f"examples[{i}]: {exc}") from exc
    ans = row["answer"]
    if isinstance(ans, bool) or not isinstance(ans, (int, str)):
        raise InvalidInputError(f"examples[{i}]: answer must be an option index or the option text.")
    if isinstance(ans, str):
        if ans not in opts:
            raise InvalidInputError(f"examples[{i}]: answer {ans!r} is not one of the options.")
        ans = opts.index(ans)
    if not 0 <= ans < len(opts):
        raise InvalidInputError(f"examples[{i}]: answer index {ans} is outside the {len(opts)} options.")
    return Example(q, opts, int(ans), ctx)


def load_examples(path: str | os.PathLike[str]) -> list[Example]:
    """Read labelled questions from a JSONL file (one ``{question, options, answer, context?}`` per line)."""
    p = Path(path)
    if not p.is_file():
        raise InvalidInputError(f"Training data not found: {p}")
    out = []
    with p.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise InvalidInputError(f"{p}:{n}: not valid JSON: {exc}") from exc
            out.append(parse_example(n - 1, row))
    if not out:
        raise InvalidInputError(f"{p} holds no examples.")
    return out


def as_examples(examples: Iterable[Example | Mapping[str, object]]) -> list[Example]:
    """Labelled questions from Example objects or {question, options, answer, context?} rows."""
    if isinstance(examples, (str, bytes, Mapping)):
        raise InvalidInputError("examples must be a list of {question, options, answer, context?} rows.")
    return [e if isinstance(e, Example) else parse_example(i, e) for i, e in enumerate(examples)]


def extract_features(
    examples: Iterable[Example | Mapping[str, object]],
    model: Model | str | os.PathLike[str] | None = None,
    *,
    features: FeatureSpec = DEFAULT_FEATURES,
    prompt_format: PromptFormat = DEFAULT_FORMAT,
    progress: Progress | None = None,
    chunk: int = 16,
    cache: FeatureCache | None = None,
) -> list[NDArray[np.float32]]:
    """Pointer features (one ``[n_options, dim]`` matrix per question), computed exactly as ``decide`` does.

    ``cache`` (a dict the caller keeps) remembers features across calls, so training
    several heads on overlapping data extracts each question once.
    """
    m = resolve_model(model)
    check_base_weights(m, "a decision head's features")
    rows = as_examples(examples)
    tag = (model_identity(m), features.to_json(), prompt_format.to_json())
    keys = [(*tag, e.question, tuple(e.options), e.context) for e in rows]
    out: list[NDArray[np.float32] | None] = [cache.get(k) if cache is not None else None for k in keys]
    todo = [i for i, f in enumerate(out) if f is None]
    done = len(rows) - len(todo)
    for s in range(0, len(todo), chunk):
        part = todo[s : s + chunk]
        feats = pointer_features(m, features, prompt_format, [rows[i].item() for i in part], batched=False)
        for i, f in zip(part, feats, strict=True):
            out[i] = f
            if cache is not None:
                cache[keys[i]] = f
        done += len(part)
        if progress is not None:
            progress("features", done, len(rows))
    return [f for f in out if f is not None]


@dataclass
class TrainResult:
    """A trained head and how it compares with the zero-shot methods.

    ``val_accuracy`` is measured on ``n_val`` validation questions the head never saw
    (neither for fitting nor for early stopping); ``zero_shot`` holds the accuracy of
    each zero-shot method on the same questions.
    """

    adapter: DecisionAdapter
    val_accuracy: float
    zero_shot: dict[str, float]
    n_train: int
    n_val: int
    fit: FitReport
    seconds: float
    val_predictions: list[int] = field(default_factory=list)
    candidates: list[dict[str, object]] = field(default_factory=list)

    def summary(self) -> str:
        """One line per number, for the CLI."""
        lines = [
            f"trained on {self.n_train} questions, validated on {self.n_val} ({self.seconds:.0f} s)",
            f"pointer head: {self.val_accuracy:.3f} (features {'+'.join(self.adapter.features.parts)}, "
            f"l2={self.fit.l2:g}, {self.fit.iterations} steps)",
        ]
        lines += [f"{name:>12}: {acc:.3f}" for name, acc in self.zero_shot.items()]
        return "\n".join(lines)


def _accuracy(preds: Sequence[int], gold: Sequence[int]) -> float:
    return float(np.mean([p == g for p, g in zip(preds, gold, strict=True)])) if gold else float("nan")


@dataclass(frozen=True)
class HeadTraining:
    """How :func:`train_head` splits the examples, builds features and fits the head.

    Args:
        features: a :class:`FeatureSpec`, or ``"auto"``: extract the union of
            :data:`AUTO_CANDIDATES` once and keep the candidate with the lowest
            early-stopping loss (the head then reads only its parts).
        layer: with ``features="auto"``, which hidden states are read: a block index,
            ``"final_norm"``, or ``"auto"`` (:func:`default_layer`).
        prompt_format: the layout ``decide`` uses with the adapter.
        val_fraction: share of the examples held out for the reported accuracy.
        stop_fraction: share of the training part held out for early stopping and for
            choosing the L2 penalty; the head is then refitted on the whole training part.
        rotations: option-rotated copies of every training question (``listed`` formats
            only; in the ``branches`` layout no option sees another).
        seed: the shuffle before splitting.
        compare: zero-shot methods (``cloze``, ``letter``) scored on the validation part.
        l2_grid: L2 penalties tried.
        max_iter: most optimisation steps per fit.
    """

    features: FeatureSpec | str = "auto"
    layer: int | str = "auto"
    prompt_format: PromptFormat = DEFAULT_FORMAT
    val_fraction: float = 0.2
    stop_fraction: float = 0.2
    rotations: int = 1
    seed: int = 0
    compare: tuple[str, ...] = ("cloze", "letter")
    l2_grid: tuple[float, ...] = (3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0)
    max_iter: int = 2000

    def __post_init__(self) -> None:
        if not 0.0 < self.val_fraction < 1.0 or not 0.0 < self.stop_fraction < 1.0:
            raise InvalidInputError("val_fraction and stop_fraction must be between 0 and 1.")
        if self.rotations < 0:
            raise InvalidInputError("rotations must be >= 0.")
        for name in self.compare:
            if name not in ("cloze", "letter"):
                raise InvalidInputError(f"compare may list 'cloze' and 'letter', got {name!r}.")
        if not isinstance(self.features, FeatureSpec) and self.features != "auto":
            raise InvalidInputError(f"features must be a FeatureSpec or 'auto', got {self.features!r}.")
        object.__setattr__(self, "compare", tuple(self.compare))
        object.__setattr__(self, "l2_grid", tuple(self.l2_grid))


@dataclass
class _Split:
    """The examples split three ways; ``fit`` and ``stop`` include rotated copies."""

    fit: list[Example]
    stop: list[Example]
    val: list[Example]
    n_fit_questions: int
    n_stop_questions: int


def _split(rows: list[Example], training: HeadTraining) -> _Split:
    n_val = round(len(rows) * training.val_fraction)
    n_stop = round((len(rows) - n_val) * training.stop_fraction)
    if n_val < 1 or n_stop < 1 or len(rows) - n_val - n_stop < 2:
        raise InvalidInputError(f"{len(rows)} examples are too few to train and validate a head; give at least 10.")
    order = np.random.default_rng(training.seed).permutation(len(rows))
    val = [rows[i] for i in order[:n_val]]
    stop = [rows[i] for i in order[n_val : n_val + n_stop]]
    fit = [rows[i] for i in order[n_val + n_stop :]]
    # each option is scored on its own in the branches layout: a rotated copy adds nothing
    rotations = 0 if training.prompt_format.layout == "branches" else training.rotations

    def expand(part: list[Example]) -> list[Example]:
        return part + [e.rotated(r) for r in range(1, rotations + 1) for e in part]

    return _Split(expand(fit), expand(stop), val, len(fit), len(stop))


def _feature_plan(model: Model, training: HeadTraining) -> tuple[FeatureSpec, list[tuple[str, ...]]]:
    """What to extract once, and the candidate feature sets to choose from."""
    if isinstance(training.features, FeatureSpec):
        return training.features, [training.features.parts]
    union = tuple(dict.fromkeys(p for c in AUTO_CANDIDATES for p in c))
    where = default_layer(model) if training.layer == "auto" else training.layer
    return FeatureSpec(parts=union, layer=where), list(AUTO_CANDIDATES)


@dataclass
class _Choice:
    loss: float
    head: LinearHead
    report: FitReport
    spec: FeatureSpec
    cols: list[int]


def _choose_head(
    all_feats: list[NDArray[np.float32]],
    split: _Split,
    extract_spec: FeatureSpec,
    candidates: list[tuple[str, ...]],
    n_embd: int,
    training: HeadTraining,
    progress: Progress | None,
) -> tuple[_Choice, list[dict[str, object]]]:
    """Fit a head on each candidate feature set; keep the lowest early-stopping loss."""
    n_fit, n_stop = len(split.fit), len(split.stop)
    best: _Choice | None = None
    tried: list[dict[str, object]] = []
    for parts in candidates:
        cols = _slice(extract_spec, parts, n_embd)
        sub = [f[:, cols] for f in all_feats]
        head, report = fit_head(
            sub[:n_fit],
            [e.answer for e in split.fit],
            stop_x=sub[n_fit : n_fit + n_stop],
            stop_y=[e.answer for e in split.stop],
            l2_grid=training.l2_grid,
            max_iter=training.max_iter,
        )
        loss = min(g["stop_loss"] for g in report.grid)
        tried.append({"parts": list(parts), "stop_loss": round(loss, 4), "stop_accuracy": report.stop_accuracy})
        if progress is not None:
            progress("fit", len(tried), len(candidates))
        if best is None or loss < best.loss:
            spec = FeatureSpec(parts=parts, layer=extract_spec.layer, token_ids=extract_spec.token_ids)
            best = _Choice(loss, head, report, spec, cols)
    assert best is not None
    return best, tried


def _zero_shot(model: Model, val: list[Example], compare: Sequence[str], progress: Progress | None) -> dict[str, float]:
    gold = [e.answer for e in val]
    scores: dict[str, float] = {}
    for name in compare:
        if progress is not None:
            progress(name, 0, len(val))
        raws = score_questions(model, [e.item() for e in val], name, None, batched=False)
        scores[name] = _accuracy([int(np.argmax(r)) for r in raws], gold)
    return scores


def train_head(
    examples: Iterable[Example | Mapping[str, object]],
    model: Model | str | os.PathLike[str] | None = None,
    *,
    training: HeadTraining | None = None,
    progress: Progress | None = None,
    metadata: Mapping[str, object] | None = None,
    feature_cache: FeatureCache | None = None,
) -> TrainResult:
    """Fit a pointer head for ``model`` on labelled questions.

    The examples are shuffled and split (see :class:`HeadTraining`); features are
    extracted in exactly the layout ``decide`` uses; the L2 penalty and, with
    ``features="auto"``, the feature set are chosen by early-stopping loss; the head is
    scored on the validation part next to the zero-shot methods. ``feature_cache`` (a dict
    kept by the caller) lets several trainings on overlapping questions extract each
    question's features once; ``metadata`` is recorded in the adapter.

    Returns a :class:`TrainResult`; ``result.adapter.save(path)`` writes a Dec adapter and
    ``load_decision_adapter(model, result.adapter)`` activates it.
    """
    t0 = time.perf_counter()
    training = training or HeadTraining()
    m = resolve_model(model)
    rows = as_examples(examples)
    split = _split(rows, training)
    extract_spec, candidates = _feature_plan(m, training)
    all_feats = extract_features(
        [*split.fit, *split.stop, *split.val],
        m,
        features=extract_spec,
        prompt_format=training.prompt_format,
        progress=progress,
        cache=feature_cache,
    )
    best, tried = _choose_head(all_feats, split, extract_spec, candidates, m.info.n_embd, training, progress)
    val_feats = [f[:, best.cols] for f in all_feats[len(split.fit) + len(split.stop) :]]
    preds = [int(np.argmax(best.head.scores(f))) for f in val_feats]
    val_acc = _accuracy(preds, [e.answer for e in split.val])
    zero_shot = _zero_shot(m, split.val, training.compare, progress)
    record = {
        "examples": len(rows),
        "n_fit": split.n_fit_questions,
        "n_stop": split.n_stop_questions,
        "n_val": len(split.val),
        "rotations": training.rotations if training.prompt_format.layout != "branches" else 0,
        "seed": training.seed,
        "features": list(best.spec.parts),
        "layer": best.spec.layer,
        "feature_candidates": tried,
        "l2": best.report.l2,
        "iterations": best.report.iterations,
        "val_accuracy": round(val_acc, 4),
        "zero_shot_val_accuracy": {k: round(v, 4) for k, v in zero_shot.items()},
        "trained_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **{str(k): v for k, v in (metadata or {}).items()},
    }
    adapter = new_adapter(
        m,
        best.head,
        best.spec,
        training.prompt_format,
        metadata={"training": json.dumps(record, ensure_ascii=False, sort_keys=True)},
    )
    assert adapter.base_model_id == model_identity(m)
    return TrainResult(
        adapter=adapter,
        val_accuracy=val_acc,
        zero_shot=zero_shot,
        n_train=split.n_fit_questions + split.n_stop_questions,
        n_val=len(split.val),
        fit=best.report,
        seconds=time.perf_counter() - t0,
        val_predictions=preds,
        candidates=tried,
    )
