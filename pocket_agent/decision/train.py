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
from ._features import FINAL_NORM, FeatureSpec
from ._head import FitReport, LinearHead, fit_head
from ._identity import model_identity
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


def _as_examples(examples: Iterable[Example | Mapping[str, object]]) -> list[Example]:
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
    rows = _as_examples(examples)
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


def train_head(
    examples: Iterable[Example | Mapping[str, object]],
    model: Model | str | os.PathLike[str] | None = None,
    *,
    features: FeatureSpec | str = "auto",
    layer: int | str = "auto",
    prompt_format: PromptFormat = DEFAULT_FORMAT,
    val_fraction: float = 0.2,
    stop_fraction: float = 0.2,
    rotations: int = 1,
    seed: int = 0,
    compare: Sequence[str] = ("cloze", "letter"),
    l2_grid: Sequence[float] = (3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0),
    max_iter: int = 2000,
    progress: Progress | None = None,
    metadata: Mapping[str, object] | None = None,
    feature_cache: FeatureCache | None = None,
) -> TrainResult:
    """Fit a pointer head for ``model`` on labelled questions.

    The examples are shuffled (``seed``) and split into validation (``val_fraction``),
    and training; a ``stop_fraction`` of the training part is held out for early
    stopping and for choosing the L2 penalty from ``l2_grid``, then the head is refitted
    on the whole training part. Features are extracted in exactly the layout ``decide``
    uses. ``features="auto"`` extracts the union of :data:`AUTO_CANDIDATES` once and keeps
    the candidate with the lowest early-stopping loss (the head then reads only its
    parts); a :class:`FeatureSpec` fixes the features. With ``features="auto"``,
    ``layer`` says which hidden states are read: a block index, ``"final_norm"``, or
    ``"auto"`` (:func:`default_layer`). ``rotations`` adds that many
    option-rotated copies of every training question (one extra forward pass each) so the
    head does not learn option positions; it applies to ``listed`` prompt formats only (in
    the default ``branches`` layout no option sees another, so order cannot matter).
    ``compare`` lists zero-shot methods to score on the validation questions.
    ``feature_cache`` (a dict kept by the caller) lets several trainings on overlapping
    questions extract each question's features once.

    Returns a :class:`TrainResult`; ``result.adapter.save(path)`` writes a Dec adapter and
    ``load_decision_adapter(model, result.adapter)`` activates it.
    """
    t0 = time.perf_counter()
    m = resolve_model(model)
    rows = _as_examples(examples)
    if not 0.0 < val_fraction < 1.0 or not 0.0 < stop_fraction < 1.0:
        raise InvalidInputError("val_fraction and stop_fraction must be between 0 and 1.")
    if rotations < 0:
        raise InvalidInputError("rotations must be >= 0.")
    for name in compare:
        if name not in ("cloze", "letter"):
            raise InvalidInputError(f"compare may list 'cloze' and 'letter', got {name!r}.")
    n_val = round(len(rows) * val_fraction)
    n_stop = round((len(rows) - n_val) * stop_fraction)
    if n_val < 1 or n_stop < 1 or len(rows) - n_val - n_stop < 2:
        raise InvalidInputError(f"{len(rows)} examples are too few to train and validate a head; give at least 10.")
    order = np.random.default_rng(seed).permutation(len(rows))
    val = [rows[i] for i in order[:n_val]]
    stop = [rows[i] for i in order[n_val : n_val + n_stop]]
    fit_rows = [rows[i] for i in order[n_val + n_stop :]]

    if prompt_format.layout == "branches":
        rotations = 0  # each option is scored on its own: a rotated copy has the same features

    def expand(part: list[Example]) -> list[Example]:
        out = list(part)
        for r in range(1, rotations + 1):
            out += [e.rotated(r) for e in part]
        return out

    fit_x_rows, stop_x_rows = expand(fit_rows), expand(stop)
    everything = fit_x_rows + stop_x_rows + val
    if isinstance(features, FeatureSpec):
        extract_spec, candidates = features, [features.parts]
    elif features == "auto":
        union = tuple(dict.fromkeys(p for c in AUTO_CANDIDATES for p in c))
        where = default_layer(m) if layer == "auto" else layer
        extract_spec, candidates = FeatureSpec(parts=union, layer=where), list(AUTO_CANDIDATES)
    else:
        raise InvalidInputError(f"features must be a FeatureSpec or 'auto', got {features!r}.")
    all_feats = extract_features(
        everything, m, features=extract_spec, prompt_format=prompt_format, progress=progress, cache=feature_cache
    )
    n_fit, n_st = len(fit_x_rows), len(stop_x_rows)
    n_embd = m.info.n_embd
    best: tuple[float, LinearHead, FitReport, FeatureSpec, list[int]] | None = None
    tried: list[dict[str, object]] = []
    for parts in candidates:
        cols = _slice(extract_spec, parts, n_embd)
        sub = [f[:, cols] for f in all_feats]
        cand_head, cand_report = fit_head(
            sub[:n_fit],
            [e.answer for e in fit_x_rows],
            stop_x=sub[n_fit : n_fit + n_st],
            stop_y=[e.answer for e in stop_x_rows],
            l2_grid=l2_grid,
            max_iter=max_iter,
        )
        loss = min(g["stop_loss"] for g in cand_report.grid)
        tried.append({"parts": list(parts), "stop_loss": round(loss, 4), "stop_accuracy": cand_report.stop_accuracy})
        if progress is not None:
            progress("fit", len(tried), len(candidates))
        if best is None or loss < best[0]:
            spec = FeatureSpec(parts=parts, layer=extract_spec.layer, token_ids=extract_spec.token_ids)
            best = (loss, cand_head, cand_report, spec, cols)
    assert best is not None
    _, head, report, chosen, chosen_cols = best
    feats = [f[:, chosen_cols] for f in all_feats]
    val_feats = feats[n_fit + n_st :]
    preds = [int(np.argmax(head.scores(f))) for f in val_feats]
    gold = [e.answer for e in val]
    val_acc = _accuracy(preds, gold)
    zero_shot: dict[str, float] = {}
    for name in compare:
        if progress is not None:
            progress(name, 0, len(val))
        raws = score_questions(m, [e.item() for e in val], name, None, batched=False)
        zero_shot[name] = _accuracy([int(np.argmax(r)) for r in raws], gold)
    seconds = time.perf_counter() - t0
    training = {
        "examples": len(rows),
        "n_fit": len(fit_rows),
        "n_stop": len(stop),
        "n_val": len(val),
        "rotations": rotations,
        "seed": seed,
        "features": list(chosen.parts),
        "layer": chosen.layer,
        "feature_candidates": tried,
        "l2": report.l2,
        "iterations": report.iterations,
        "val_accuracy": round(val_acc, 4),
        "zero_shot_val_accuracy": {k: round(v, 4) for k, v in zero_shot.items()},
        "trained_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if metadata:
        training.update({str(k): v for k, v in metadata.items()})
    adapter = new_adapter(
        m,
        head,
        chosen,
        prompt_format,
        metadata={"training": json.dumps(training, ensure_ascii=False, sort_keys=True)},
    )
    assert adapter.base_model_id == model_identity(m)
    return TrainResult(
        adapter=adapter,
        val_accuracy=val_acc,
        zero_shot=zero_shot,
        n_train=len(fit_rows) + len(stop),
        n_val=len(val),
        fit=report,
        seconds=seconds,
        val_predictions=preds,
        candidates=tried,
    )
