"""Dec adapters: a pointer head (``head.safetensors``) plus an optional LoRA, for one base model.

See ``FORMAT.md`` in this folder for the on-disk format.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import weakref
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import AdapterError
from ..runtime import LoraAdapter, Model
from ..runtime.identity import IDENTITY_SCHEME, model_identity
from ._features import FeatureSpec
from ._head import LinearHead
from ._layout import DEFAULT_FORMAT, PromptFormat

FORMAT_NAME = "pocket-agent-dec"
FORMAT_VERSION = 1
HEAD_FILE = "head.safetensors"
LORA_FILES = {"llamacpp": "lora.gguf", "mnn": "lora.mnn"}
_loaded: weakref.WeakKeyDictionary[Model, DecisionAdapter] = weakref.WeakKeyDictionary()
"""The adapter loaded for each model (the runtime's Model knows nothing of decisions)."""


@dataclass
class DecisionAdapter:
    """A pointer head (and optionally a LoRA) trained for one base model.

    ``base_model_id`` is :func:`~pocket_agent.decision.model_identity` of the model it was
    trained on; :func:`load_decision_adapter` refuses any other model. ``metadata`` holds
    free-form provenance (``training`` is a JSON document of what it was trained on and
    how it scored).
    """

    head: LinearHead
    features: FeatureSpec
    prompt: PromptFormat
    base_model_id: str
    base_model_name: str = ""
    n_embd: int = 0
    lora_scale: float = 1.0
    lora_paths: dict[str, Path] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    source: Path | None = None
    lora: LoraAdapter | None = field(default=None, repr=False)
    _tmpdir: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def has_lora(self) -> bool:
        return bool(self.lora_paths)

    # -- serialisation ---------------------------------------------------------------

    def head_metadata(self) -> dict[str, str]:
        """The ``__metadata__`` block written into ``head.safetensors``."""
        meta = dict(self.metadata)
        meta.update(
            {
                "format": FORMAT_NAME,
                "format_version": str(FORMAT_VERSION),
                "base_model_id": self.base_model_id,
                "base_model_id_scheme": IDENTITY_SCHEME,
                "base_model_name": self.base_model_name,
                "n_embd": str(self.n_embd),
                "features": self.features.to_json(),
                "layer": str(self.features.layer),
                "marker": self.prompt.marker,
                "prompt_format": self.prompt.to_json(),
                "lora_scale": repr(float(self.lora_scale)),
                "lora": json.dumps(sorted(LORA_FILES[b] for b in self.lora_paths)),
                "head": "linear",
            }
        )
        return meta

    def head_bytes(self) -> bytes:
        """``head.safetensors`` as bytes."""
        from safetensors.numpy import save

        tensors = {
            "mean": np.ascontiguousarray(self.head.mean, dtype=np.float32),
            "scale": np.ascontiguousarray(self.head.scale, dtype=np.float32),
            "weight": np.ascontiguousarray(self.head.weight, dtype=np.float32),
            "bias": np.asarray([self.head.bias], dtype=np.float32),
        }
        return bytes(save(tensors, metadata=self.head_metadata()))

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the adapter: a ``.zip`` path makes a zip archive, any other path a folder.

        A path ending in ``.safetensors`` writes the bare head file (only for adapters
        without a LoRA).
        """
        p = Path(path)
        if p.suffix == ".safetensors":
            if self.lora_paths:
                raise AdapterError("An adapter with a LoRA must be saved as a folder or .zip, not a bare head file.")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(self.head_bytes())
            return p
        if p.suffix == ".zip":
            p.parent.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(p, "w", compression=zipfile.ZIP_DEFLATED) as zf:
                zf.writestr(HEAD_FILE, self.head_bytes())
                for backend, lp in self.lora_paths.items():
                    zf.write(lp, LORA_FILES[backend])
            return p
        if p.exists() and not p.is_dir():
            raise AdapterError(f"{p} exists and is not a folder; choose another output path.")
        p.mkdir(parents=True, exist_ok=True)
        (p / HEAD_FILE).write_bytes(self.head_bytes())
        for backend, lp in self.lora_paths.items():
            dst = p / LORA_FILES[backend]
            if lp.resolve() != dst.resolve():
                shutil.copyfile(lp, dst)
        return p

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> DecisionAdapter:
        """Read an adapter (folder, ``.zip`` or bare ``head.safetensors``) without a model."""
        p = Path(path).expanduser()
        if not p.exists():
            raise AdapterError(f"Decision adapter not found: {p}")
        lora_paths: dict[str, Path] = {}
        tmp: tempfile.TemporaryDirectory[str] | None = None
        if p.is_dir():
            head_file = p / HEAD_FILE
            if not head_file.is_file():
                raise AdapterError(f"{p} holds no {HEAD_FILE}; it is not a decision adapter.")
            data = head_file.read_bytes()
            for backend, name in LORA_FILES.items():
                if (p / name).is_file():
                    lora_paths[backend] = p / name
        elif zipfile.is_zipfile(p):
            with zipfile.ZipFile(p) as zf:
                names = set(zf.namelist())
                if HEAD_FILE not in names:
                    raise AdapterError(f"The archive {p} holds no {HEAD_FILE}; it is not a decision adapter.")
                data = zf.read(HEAD_FILE)
                wanted = [(b, n) for b, n in LORA_FILES.items() if n in names]
                if wanted:
                    tmp = tempfile.TemporaryDirectory(prefix="pocket-agent-dec-")
                    for backend, name in wanted:
                        target = Path(tmp.name) / name
                        target.write_bytes(zf.read(name))
                        lora_paths[backend] = target
        else:
            data = p.read_bytes()
        adapter = cls.from_head_bytes(data, where=str(p))
        adapter.lora_paths = lora_paths
        adapter.source = p
        adapter._tmpdir = tmp
        declared = adapter.metadata.get("lora")
        if declared:
            try:
                names = set(json.loads(declared))
            except ValueError:
                names = set()
            missing = sorted(names - {LORA_FILES[b] for b in lora_paths})
            if missing:
                raise AdapterError(f"The adapter {p} declares LoRA files {missing} that are not there.")
        return adapter

    @classmethod
    def from_head_bytes(cls, data: bytes, *, where: str = "<bytes>") -> DecisionAdapter:
        """Parse ``head.safetensors`` content."""
        from safetensors.numpy import load

        meta = safetensors_metadata(data, where)
        if meta.get("format") != FORMAT_NAME:
            raise AdapterError(f"{where} is not a pocket_agent decision head (format={meta.get('format')!r}).")
        try:
            version = int(meta.get("format_version", "0"))
        except ValueError:
            version = -1
        if version != FORMAT_VERSION:
            raise AdapterError(
                f"{where} uses decision-adapter format version {meta.get('format_version')!r}; this pocket_agent "
                f"reads version {FORMAT_VERSION}."
            )
        if meta.get("head", "linear") != "linear":
            raise AdapterError(f"{where} has a head of kind {meta.get('head')!r}; only 'linear' is supported.")
        for key in ("base_model_id", "features", "prompt_format"):
            if not meta.get(key):
                raise AdapterError(f"{where} lacks the metadata key {key!r}.")
        try:
            tensors = load(data)
        except Exception as exc:  # safetensors raises its own error types
            raise AdapterError(f"{where}: the head tensors cannot be read: {exc}") from exc
        try:
            mean, scale, weight = tensors["mean"], tensors["scale"], tensors["weight"]
        except KeyError as exc:
            raise AdapterError(f"{where} lacks the head tensor {exc}.") from exc
        bias = float(tensors["bias"].reshape(-1)[0]) if "bias" in tensors else 0.0
        if not (mean.ndim == scale.ndim == weight.ndim == 1 and mean.shape == scale.shape == weight.shape):
            raise AdapterError(f"{where}: head tensors mean/scale/weight must be vectors of one length.")
        features = FeatureSpec.from_json(meta["features"])
        prompt = PromptFormat.from_json(meta["prompt_format"])
        try:
            n_embd = int(meta.get("n_embd", "0"))
            lora_scale = float(meta.get("lora_scale", "1.0"))
        except ValueError as exc:
            raise AdapterError(f"{where}: malformed n_embd or lora_scale metadata: {exc}") from exc
        if n_embd and features.dim(n_embd) != weight.shape[0]:
            raise AdapterError(
                f"{where}: the head has {weight.shape[0]} weights but its features give {features.dim(n_embd)}."
            )
        head = LinearHead(
            mean=mean.astype(np.float32), scale=scale.astype(np.float32), weight=weight.astype(np.float32), bias=bias
        )
        return cls(
            head=head,
            features=features,
            prompt=prompt,
            base_model_id=meta["base_model_id"],
            base_model_name=meta.get("base_model_name", ""),
            n_embd=n_embd,
            lora_scale=lora_scale,
            metadata=meta,
        )

    # -- model binding ---------------------------------------------------------------

    def check_model(self, model: Model) -> None:
        """Raise :class:`AdapterError` unless ``model`` is the base model this adapter was made for."""
        ident = model_identity(model)
        if ident != self.base_model_id:
            raise AdapterError(
                f"This decision adapter was trained for base model {self.base_model_name or '?'} "
                f"(identity {self.base_model_id[:16]}...), but the loaded model {model.info.name!r} has identity "
                f"{ident[:16]}...; train a head for this model (pocket-agent decide train) or load its own adapter."
            )
        if self.n_embd and self.n_embd != model.info.n_embd:
            raise AdapterError(f"The adapter expects hidden size {self.n_embd}, the model has {model.info.n_embd}.")
        layer = self.features.inner_layer
        if layer is not None and not model.capabilities.layer_states:
            raise AdapterError(
                f"This adapter reads the hidden states of block {layer}, which the {model.backend} backend cannot "
                "return; load the GGUF build of the model (llama.cpp) to use it, or use method='cloze'."
            )
        if layer is not None and layer >= model.info.n_layer - 1:
            raise AdapterError(f"This adapter reads block {layer}, but the model has {model.info.n_layer} blocks.")
        if self.features.needs_hidden and not model.capabilities.hidden_states:
            raise AdapterError(
                f"This adapter reads hidden states, which the {model.backend} backend cannot return; use an "
                "adapter whose features are logits over a vocabulary subset ('logits@marker')."
            )
        if self.lora_paths and model.backend not in self.lora_paths:
            have = ", ".join(sorted(self.lora_paths))
            raise AdapterError(f"This adapter has a LoRA only for the {have} backend, not for {model.backend}.")

    def info(self) -> dict[str, Any]:
        """A JSON-able summary (for ``pocket-agent info`` and the CLI)."""
        training: Any = self.metadata.get("training")
        if isinstance(training, str):
            try:
                training = json.loads(training)
            except ValueError:
                pass
        return {
            "source": str(self.source) if self.source else None,
            "base_model_name": self.base_model_name,
            "base_model_id": self.base_model_id,
            "features": json.loads(self.features.to_json()),
            "prompt_format": json.loads(self.prompt.to_json()),
            "lora": sorted(self.lora_paths),
            "lora_scale": self.lora_scale,
            "training": training,
        }


def safetensors_metadata(data: bytes, where: str) -> dict[str, str]:
    if len(data) < 8:
        raise AdapterError(f"{where} is too short to be a safetensors file.")
    n = int.from_bytes(data[:8], "little")
    if n <= 0 or 8 + n > len(data):
        raise AdapterError(f"{where} is not a safetensors file (bad header length).")
    try:
        header = json.loads(data[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise AdapterError(f"{where} is not a safetensors file (header is not JSON).") from exc
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict):
        raise AdapterError(f"{where} has no safetensors metadata; it is not a decision head.")
    return {str(k): str(v) for k, v in meta.items()}


def load_decision_adapter(model: Model, path: str | os.PathLike[str] | DecisionAdapter) -> DecisionAdapter:
    """Load a Dec adapter into ``model`` and make ``decide()`` use it (``method="auto"`` -> pointer).

    ``path`` is an adapter folder, a ``.zip`` of one, a bare ``head.safetensors`` or an
    already read :class:`DecisionAdapter`. The adapter must have been made for this base
    model (same identity hash), else :class:`AdapterError`. A LoRA in the adapter never
    changes generation: for heads that read an inner block it is applied only to the
    context that reads layer states; for final-norm heads it is loaded switched off
    (scale 0) and switched on only while the pointer method runs. A previously loaded
    adapter is unloaded first; :func:`get_decision_adapter` returns the loaded one.
    """
    adapter = path if isinstance(path, DecisionAdapter) else DecisionAdapter.read(path)
    adapter.check_model(model)
    unload_decision_adapter(model)
    lora_path = adapter.lora_paths.get(model.backend)
    if lora_path is not None:
        if adapter.features.inner_layer is not None:
            # read only by the state reader: generation never sees it
            adapter.lora = model.open_lora(lora_path)
        else:
            adapter.lora = model.load_lora(lora_path, scale=0.0)
    _loaded[model] = adapter
    return adapter


def unload_decision_adapter(model: Model) -> None:
    """Remove the decision adapter (and its LoRA) from ``model``; ``auto`` then uses cloze."""
    current = get_decision_adapter(model)
    if current is None:
        return
    if current.lora is not None and current.lora in model.loras:
        model.remove_lora(current.lora)
    elif current.lora is not None and not model.closed:
        model.close_lora(current.lora)
    current.lora = None
    _loaded.pop(model, None)


def get_decision_adapter(model: Model) -> DecisionAdapter | None:
    """The adapter loaded into ``model``, or None."""
    return _loaded.get(model)


def new_adapter(
    model: Model,
    head: LinearHead,
    features: FeatureSpec,
    prompt: PromptFormat = DEFAULT_FORMAT,
    *,
    metadata: dict[str, str] | None = None,
) -> DecisionAdapter:
    """A head-only adapter bound to ``model``'s identity."""
    if head.dim != features.dim(model.info.n_embd):
        raise AdapterError(
            f"Head dimension {head.dim} does not match the features ({features.dim(model.info.n_embd)})."
        )
    return DecisionAdapter(
        head=head,
        features=features,
        prompt=prompt,
        base_model_id=model_identity(model),
        base_model_name=model.info.name,
        n_embd=model.info.n_embd,
        metadata=dict(metadata or {}),
    )
