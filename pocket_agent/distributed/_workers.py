"""The Ray Data class UDFs: one model per actor, loaded in ``__init__``, batches in ``__call__``.

Each worker calls only the public entry points (``load_model``, ``extract_many``,
``decide_many``). Every input row gives exactly one output row: a row that fails carries
the error's message and type name as plain strings, so nothing that crosses the process
boundary depends on pickling pocket_agent's error objects.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pydantic import BaseModel

from ..decision import decide_many
from ..errors import InvalidInputError
from ..extraction import extract_many
from ..runtime import Model, load_model
from ._schema import ShippedSchema

log = logging.getLogger(__name__)

EXTRACT_COLUMNS = ("value", "error", "error_type")
DECIDE_COLUMNS = ("choice", "index", "scores", "error", "error_type")


@dataclass(frozen=True)
class WorkerSpec:
    """How an actor loads its model: ``load_model(model, threads=threads, **model_options)``."""

    model: str | None
    threads: int
    model_options: Mapping[str, Any] = field(default_factory=dict)

    def load(self, **defaults: Any) -> Model:
        """The actor's model; ``defaults`` are ``load_model`` arguments ``model_options`` may override."""
        t0 = time.perf_counter()
        model = load_model(self.model, threads=self.threads, **{**defaults, **self.model_options})
        log.info("pocket_agent worker loaded %s in %.2fs", model.info.path, time.perf_counter() - t0)
        return model


def to_json(value: Any) -> str:
    """An extracted value as compact JSON text (a Pydantic object through its JSON dump)."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _replace_columns(table: pa.Table, columns: Mapping[str, pa.Array]) -> pa.Table:
    """``table`` with ``columns`` appended, replacing input columns of the same names."""
    clash = [c for c in columns if c in table.column_names]
    if clash:
        table = table.drop_columns(clash)
    for name, array in columns.items():
        table = table.append_column(name, array)
    return table


def _column(table: pa.Table, name: str) -> list[Any] | None:
    return table.column(name).to_pylist() if name in table.column_names else None


class ExtractWorker:
    """Ray Data UDF: adds ``value`` (JSON text), ``error`` and ``error_type`` to each row."""

    def __init__(
        self, spec: WorkerSpec, schema: ShippedSchema, text_column: str, extract_options: Mapping[str, Any]
    ) -> None:
        self.options = dict(extract_options)
        # the shipped adapter merged into the weights: a worker only extracts, merged is faster (runtime/merged.py)
        self.model = spec.load(merge_adapter="extract" if self.options.get("adapter", "auto") == "auto" else None)
        self.schema = schema.load()
        self.text_column = text_column
        # Compile the schema's grammar now: a schema the engine cannot enforce fails the actor
        # (the whole job) here, instead of turning every row into the same error.
        for _ in extract_many([], self.schema, model=self.model, progress=False, **self.options):
            pass

    def __call__(self, table: pa.Table) -> pa.Table:
        texts = _column(table, self.text_column)
        n = table.num_rows
        values: list[str | None] = [None] * n
        errors: list[str | None] = [None] * n
        types: list[str | None] = [None] * n
        if texts is None:
            msg = f"the dataset has no column {self.text_column!r} (columns: {', '.join(table.column_names)})"
            errors = [msg] * n
            types = [InvalidInputError.__name__] * n
        else:
            start = 0
            while start < n:  # restart after a row that broke the loop: every row gets an outcome
                done = start
                try:
                    for outcome in extract_many(
                        texts[start:], self.schema, model=self.model, progress=False, **self.options
                    ):
                        done = start + outcome.index
                        if outcome.ok:
                            values[done] = to_json(outcome.value)
                        else:
                            errors[done], types[done] = str(outcome.error), type(outcome.error).__name__
                        done += 1
                    start = n
                except Exception as exc:  # not a pocket_agent error: record it on its row, go on
                    if done >= n:
                        break
                    errors[done], types[done] = str(exc) or repr(exc), type(exc).__name__
                    start = done + 1
        return _replace_columns(
            table,
            {
                "value": pa.array(values, type=pa.string()),
                "error": pa.array(errors, type=pa.string()),
                "error_type": pa.array(types, type=pa.string()),
            },
        )


class DecideWorker:
    """Ray Data UDF: adds ``choice``, ``index``, ``scores``, ``error`` and ``error_type``."""

    def __init__(
        self,
        spec: WorkerSpec,
        question_column: str,
        options_column: str,
        context_column: str | None,
        decide_options: Mapping[str, Any],
    ) -> None:
        self.model = spec.load()
        self.columns = (question_column, options_column, context_column)
        self.options = dict(decide_options)

    def __call__(self, table: pa.Table) -> pa.Table:
        q_col, o_col, c_col = self.columns
        n = table.num_rows
        questions, options = _column(table, q_col), _column(table, o_col)
        contexts = _column(table, c_col) if c_col else None
        choice: list[str | None] = [None] * n
        index: list[int | None] = [None] * n
        scores: list[list[float] | None] = [None] * n
        errors: list[str | None] = [None] * n
        types: list[str | None] = [None] * n
        if questions is None or options is None:
            missing = q_col if questions is None else o_col
            errors = [f"the dataset has no column {missing!r} (columns: {', '.join(table.column_names)})"] * n
            types = [InvalidInputError.__name__] * n
        else:
            items = [
                {"question": q, "options": o, "context": contexts[i] if contexts is not None else None}
                for i, (q, o) in enumerate(zip(questions, options, strict=True))
            ]
            for i, result in enumerate(self._decide(items)):
                if isinstance(result, Exception):
                    errors[i], types[i] = str(result) or repr(result), type(result).__name__
                else:
                    choice[i], index[i], scores[i] = result.choice, result.index, list(result.scores)
        return _replace_columns(
            table,
            {
                "choice": pa.array(choice, type=pa.string()),
                "index": pa.array(index, type=pa.int64()),
                "scores": pa.array(scores, type=pa.list_(pa.float64())),
                "error": pa.array(errors, type=pa.string()),
                "error_type": pa.array(types, type=pa.string()),
            },
        )

    def _decide(self, items: Sequence[Mapping[str, Any]]) -> list[Any]:
        """One ``decide_many`` over the batch; if any item is bad, each item on its own."""
        try:
            return list(decide_many(items, model=self.model, **self.options))
        except Exception:  # some item is bad (decide_many checks all first): find which
            out: list[Any] = []
            for item in items:
                try:
                    out.append(decide_many([item], model=self.model, **self.options)[0])
                except Exception as exc:  # reported on the row
                    out.append(exc)
            return out
