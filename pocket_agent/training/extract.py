"""Train an extraction adapter: a LoRA that teaches the model to fill a schema from documents.

Every example is a document and the object that should come out of it. The prompt is
exactly the one ``extract`` sends (``build_messages`` and the model's chat template), and
the answer is the object in the layout the extraction grammar writes (``json.dumps``:
``", "`` and ``": "``), so the adapter learns the very continuation inference decodes.
The GGUF LoRA it writes is applied with ``model.load_lora(path)``; every extraction on that
model then uses it (grammars and grounding unchanged).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InvalidInputError
from ..extraction import Schema, build_messages, json_schema_of
from ..generate import render_prompt
from ..runtime import Model, resolve_model
from ..runtime.identity import model_identity
from ._checkpoint import checkpoint_folder, load_torch_model
from ._loop import peak_rss_mb
from ._lora import DEFAULT_TARGETS, write_gguf_lora
from ._progress import Progress, ProgressBar
from ._sft import SftExample, SftTraining, train_sft


@dataclass
class AdapterResult:
    """A trained generation adapter: the GGUF LoRA file and how training went."""

    path: Path
    task: str
    n_train: int
    n_val: int
    steps: int
    base_val_loss: float
    val_loss: float
    seconds: float
    peak_rss_mb: float
    metadata: dict[str, str] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)
    _tmpdir: Any = field(default=None, repr=False)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Copy the LoRA file to ``path`` (a ``.gguf`` file)."""
        out = Path(path)
        if out.suffix != ".gguf":
            raise InvalidInputError(f"An adapter LoRA is a .gguf file; got {out}.")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(self.path.read_bytes())
        return out

    def summary(self) -> str:
        return (
            f"trained on {self.n_train} examples, validated on {self.n_val} ({self.seconds:.0f} s, {self.steps} steps, "
            f"peak memory {self.peak_rss_mb:.0f} MB); validation loss per answer token {self.base_val_loss:.3f} "
            f"(base) -> {self.val_loss:.3f}"
        )


def answer_text(output: Mapping[str, Any], *, raw_numbers: Mapping[str, str] | None = None) -> str:
    """The object as the extraction grammar lays it out (``json.dumps`` spacing).

    ``raw_numbers`` maps a field to the characters of a number as printed (``"9.00"``), which
    is what grounded number copying writes; JSON allows them as they are.
    """
    parts = []
    for key, value in output.items():
        raw = (raw_numbers or {}).get(key)
        text = raw if raw is not None else json.dumps(value, ensure_ascii=False)
        parts.append(f"{json.dumps(key, ensure_ascii=False)}: {text}")
    return "{" + ", ".join(parts) + "}"


def extract_examples(
    model: Model,
    rows: Iterable[Mapping[str, Any]],
    schema: Schema | None,
    *,
    instructions: str | None = None,
) -> list[SftExample]:
    """Token ids of ``{text, output}`` rows: the prompt ``extract`` sends and the answer.

    A row may carry its own ``"schema"`` (a JSON Schema dict), which then replaces ``schema``
    for that row: one adapter can be trained on many schemas.
    """
    default = json_schema_of(schema) if schema is not None else None
    out = []
    for i, row in enumerate(rows):
        text, output, own = row.get("text"), row.get("output"), row.get("schema")
        if not isinstance(text, str) or not text.strip() or not isinstance(output, Mapping):
            raise InvalidInputError(f"examples[{i}] must be {{'text': document, 'output': object}}.")
        if own is not None and not isinstance(own, Mapping):
            raise InvalidInputError(f"examples[{i}].schema must be a JSON Schema object.")
        js = json_schema_of(own) if own is not None else default
        if js is None:
            raise InvalidInputError(f"examples[{i}] has no schema: pass schema= or give every row a 'schema'.")
        numbers = {
            k for k, v in (js.get("properties") or {}).items() if isinstance(v, Mapping) and v.get("type") == "number"
        }
        raw_numbers = {}
        for key in numbers & set(output):
            value = output[key]
            if isinstance(value, str):
                try:
                    float(value.replace(",", ""))
                except ValueError as exc:
                    raise InvalidInputError(f"examples[{i}].{key} is not a number: {value!r}") from exc
                raw_numbers[key] = value.replace(",", "")
        prompt = render_prompt(model, build_messages(text, js, instructions=instructions))
        answer = model.tokenize(answer_text(output, raw_numbers=raw_numbers))
        out.append(SftExample(prompt=prompt, answer=answer))
    return out


def _schema_record(schema: Schema | None, rows: list[Mapping[str, Any]]) -> str:
    """What the adapter was trained to fill: the schema, or "per example" when rows bring their own."""
    own = sum(1 for r in rows if r.get("schema") is not None)
    if schema is None:
        return "per example"
    text = json.dumps(json_schema_of(schema), sort_keys=True)
    return text if not own else f"per example ({own} rows); the other {len(rows) - own}: {text}"


def train_extract_adapter(
    examples: Iterable[Mapping[str, Any]],
    schema: Schema | None,
    model: Model | str | os.PathLike[str] | None = None,
    *,
    training: SftTraining | None = None,
    instructions: str | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    resume: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
    metadata: Mapping[str, object] | None = None,
) -> AdapterResult:
    """Train a LoRA that makes ``extract(text, schema)`` on ``model`` write the right objects.

    ``examples`` are ``{"text": document, "output": object}`` rows (a row's own
    ``"schema"`` replaces ``schema``, which may then be None); ``checkpoint`` is the
    Hugging Face folder of the same weights (default: the GGUF converted once into the
    cache); ``resume`` is a folder the training state is saved in after every validation
    check and resumed from by a later call with the same data and settings. Returns an
    :class:`AdapterResult`; ``result.save("extract.gguf")`` writes the LoRA and
    ``model.load_lora("extract.gguf")`` applies it.
    """
    t0 = time.perf_counter()
    training = training or SftTraining()
    m = resolve_model(model)
    rows = list(examples)
    sft = extract_examples(m, rows, schema, instructions=instructions)
    details: dict[str, object] = {
        "schema": _schema_record(schema, rows),
        "examples": len(rows),
    }
    return train_lora_adapter(
        m,
        sft,
        "extract",
        details,
        training=training,
        checkpoint=checkpoint,
        resume=resume,
        progress=progress,
        metadata=metadata,
        started=t0,
    )


def train_lora_adapter(
    m: Model,
    sft: list[SftExample],
    task: str,
    details: Mapping[str, object],
    *,
    training: SftTraining,
    checkpoint: str | os.PathLike[str] | None,
    resume: str | os.PathLike[str] | None,
    progress: Progress | None,
    metadata: Mapping[str, object] | None,
    started: float,
) -> AdapterResult:
    """Train a LoRA on ``sft`` and export it as a GGUF LoRA recording ``task`` and the base model.

    Shared by the generation adapters (``extract``, ``tools``): ``details`` are the
    task's own metadata entries (placed after the base model's), ``metadata`` the caller's
    (placed last, so they may override); ``started`` is when the call began.
    """
    hf = load_torch_model(checkpoint_folder(m, checkpoint), training.threads)
    state_dir = Path(resume) if resume is not None else None
    outcome = train_sft(hf, sft, training, progress or ProgressBar(enabled=False), state_dir=state_dir)
    del hf
    record: dict[str, object] = {
        "task": task,
        "base_model_id": model_identity(m),
        "base_model_name": m.info.name,
        **details,
        "n_train": outcome.n_train,
        "n_val": outcome.n_val,
        "rank": training.rank,
        "lora_blocks": [outcome.first_block, m.info.n_layer - 1],
        "lora_targets": list(DEFAULT_TARGETS),
        "steps": outcome.steps,
        "val_loss": round(outcome.best_val_loss, 4),
        "base_val_loss": round(outcome.base_val_loss, 4),
        "training": asdict(training),
        "trained_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **{str(k): v for k, v in (metadata or {}).items()},
    }
    meta = {k: v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for k, v in record.items()}
    tmp = tempfile.TemporaryDirectory(prefix="pocket-agent-lora-")
    path = write_gguf_lora(
        Path(tmp.name) / f"{task}.gguf",
        outcome.state,
        architecture=m.info.architecture,
        alpha=training.alpha,
        metadata=meta,
    )
    return AdapterResult(
        path=path,
        task=task,
        n_train=outcome.n_train,
        n_val=outcome.n_val,
        steps=outcome.steps,
        base_val_loss=outcome.base_val_loss,
        val_loss=outcome.best_val_loss,
        seconds=time.perf_counter() - started,
        peak_rss_mb=peak_rss_mb(),
        metadata=meta,
        history=outcome.history,
        _tmpdir=tmp,
    )
