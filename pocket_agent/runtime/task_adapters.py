"""Task adapters: LoRAs trained for one task and switched on only while that task runs.

The package ships GGUF LoRAs in ``pocket_agent/data/`` (``extract-<identity>.gguf``); each
records the base model it was trained for (``pocket_agent.base_model_id``) and its task
(``pocket_agent.task``). ``extract`` uses the one shipped for the model it runs on unless
told otherwise (``adapter=None`` for the base model, or the path of another LoRA).

An adapter is loaded once per model at scale 0 and switched to scale 1 for the duration of a
task; other work on the same model (chat, tools, decisions) sees the base weights.
"""

from __future__ import annotations

import importlib.resources
import json
import math
import os
import threading
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from ..errors import AdapterError, InvalidInputError
from .base import LORA_BASE_KEY, LoraAdapter, Model
from .gguf_meta import GGUFFormatError, is_gguf_file, read_gguf_metadata
from .identity import model_identity
from .merged import check_merged_choice, merged_task
from .peft_lora import is_peft_adapter

TASK_KEY = "pocket_agent.task"
AdapterChoice = str | os.PathLike[str] | Literal["auto"] | None
"""How a task picks its adapter: ``"auto"`` (the one shipped for the model, if any), a LoRA
file's path (or a PEFT adapter folder's), or ``None`` (the base model)."""

GGUF_LORA_BACKENDS = ("llamacpp", "transformers")
NO_DEFAULT_ENV = "POCKET_AGENT_NO_DEFAULT_ADAPTER"

_loaded: weakref.WeakKeyDictionary[Model, dict[Path, LoraAdapter]] = weakref.WeakKeyDictionary()
_shipped_cache: dict[tuple[str, str], Path | None] = {}
_lock = threading.Lock()


def shipped_adapters() -> list[Path]:
    """The GGUF LoRAs shipped inside the package (``pocket_agent/data/*.gguf``)."""
    root = importlib.resources.files("pocket_agent") / "data"
    try:
        entries = list(root.iterdir())
    except (FileNotFoundError, NotADirectoryError, OSError):
        return []
    return sorted(Path(str(e)) for e in entries if e.name.endswith(".gguf") and e.is_file())


def adapter_record(path: str | os.PathLike[str]) -> dict[str, str]:
    """The ``pocket_agent.*`` metadata of a GGUF LoRA (task, base model, data, scores...);
    empty for a PEFT adapter folder, which records none."""
    p = Path(path)
    if is_peft_adapter(p):
        return {}
    if not is_gguf_file(p):
        raise AdapterError(f"{p} is not a GGUF file.")
    try:
        meta = read_gguf_metadata(p, None)
    except (GGUFFormatError, OSError) as exc:
        raise AdapterError(f"{p} is not a readable GGUF LoRA: {exc}") from exc
    prefix = "pocket_agent."
    return {
        k[len(prefix) :]: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items() if k.startswith(prefix)
    }


def recorded_number(record: Mapping[str, str], key: str, path: str | os.PathLike[str] | None) -> float | None:
    """The finite number an adapter records under ``pocket_agent.<key>``, or ``None`` when it
    records none (raises :class:`AdapterError` for anything else)."""
    value = record.get(key)
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise AdapterError(f"{path}: pocket_agent.{key} must be a finite number, got {value!r}; re-export the adapter.")
    return number


def find_shipped_adapter(model: Model, task: str) -> Path | None:
    """The shipped LoRA for ``task`` whose base-model identity is ``model``'s, if any."""
    if not model.capabilities.lora or model.backend not in GGUF_LORA_BACKENDS:
        return None  # MNN takes .mnn LoRAs: none is shipped yet
    return shipped_for_identity(model_identity(model), task)


def shipped_for_identity(ident: str, task: str) -> Path | None:
    """The shipped LoRA for ``task`` trained on the base model whose identity is ``ident``."""
    key = (ident, task)
    with _lock:
        if key in _shipped_cache:
            return _shipped_cache[key]
    found = None
    for path in shipped_adapters():
        try:
            meta = read_gguf_metadata(path, [LORA_BASE_KEY, TASK_KEY])
        except (GGUFFormatError, OSError):
            continue
        if meta.get(LORA_BASE_KEY) == ident and meta.get(TASK_KEY) == task:
            found = path
            break
    with _lock:
        _shipped_cache[key] = found
    return found


def check_adapter_choice(choice: object) -> None:
    """Raise :class:`InvalidInputError` unless ``choice`` is ``"auto"``, None or a path."""
    if choice is None or isinstance(choice, os.PathLike):
        return
    if not isinstance(choice, str) or not choice:
        raise InvalidInputError(f"adapter must be 'auto', None or the path of a GGUF LoRA file; got {choice!r}.")


_LEAVE = object()  # "auto" on a model with LoRAs the caller applied: touch nothing


def _ours(model: Model) -> list[LoraAdapter]:
    """The task adapters this module loaded into ``model`` that are still loaded."""
    with _lock:
        mine = list(_loaded.get(model, {}).values())
    return [a for a in mine if any(a is b for b in model.loras)]


def _resolve(model: Model, choice: AdapterChoice, task: str) -> Path | object | None:
    check_adapter_choice(choice)
    if choice is None:
        return None
    if isinstance(choice, str) and choice == "auto":
        if os.environ.get(NO_DEFAULT_ENV):
            return None
        ours = _ours(model)
        if any(a.scale != 0.0 and not any(a is o for o in ours) for a in model.loras):
            return _LEAVE  # the caller applied LoRAs of their own: leave the weights as they set them
        return find_shipped_adapter(model, task)
    path = Path(choice)
    if not path.is_file() and not is_peft_adapter(path):
        raise AdapterError(f"LoRA adapter file not found: {path} (a GGUF LoRA, or a PEFT adapter folder)")
    return path


def _loaded_adapter(model: Model, path: Path) -> LoraAdapter:
    with _lock:
        per_model = _loaded.setdefault(model, {})
        adapter = per_model.get(path)
        if adapter is not None and any(adapter is a for a in model.loras):
            return adapter
        adapter = model.load_lora(path, scale=0.0)
        per_model[path] = adapter
        return adapter


def _set_scales(model: Model, scales: dict[int, tuple[LoraAdapter, float]]) -> None:
    for adapter, scale in scales.values():
        if not model.closed and any(adapter is a for a in model.loras) and adapter.scale != scale:
            model.set_lora_scale(adapter, scale)


@contextmanager
def task_adapter(model: Model, choice: AdapterChoice, task: str) -> Iterator[LoraAdapter | None]:
    """Run a task on its LoRA: that one on, the other task adapters off, for the duration.

    The adapter is loaded into ``model`` the first time (at scale 0) and switched back
    afterwards, so tasks nest (an ``Agent`` step inside an ``extract_many`` loop runs on
    the tools adapter, then the extraction one is back on). Yields the adapter, or None
    when the base weights are used (``choice`` None, or ``"auto"`` with nothing shipped
    for this model), or when ``"auto"`` finds LoRAs the caller applied (left as they are).

    On a model with a task adapter merged into its weights (``load_model(merge_adapter=...)``)
    only that task runs, with nothing to switch (yields None); anything else raises
    :class:`AdapterError`.
    """
    if merged_task(model) is not None:
        check_merged_choice(model, choice, task)
        yield None
        return
    path = _resolve(model, choice, task)
    if path is _LEAVE:
        yield None
        return
    with model.lock:
        target = _loaded_adapter(model, path) if isinstance(path, Path) else None
        ours = _ours(model)
        before = {id(a): (a, a.scale) for a in ours}
        _set_scales(model, {id(a): (a, 1.0 if a is target else 0.0) for a in ours})
    try:
        yield target
    finally:
        with model.lock:
            _set_scales(model, before)
