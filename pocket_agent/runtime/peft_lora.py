"""LoRA adapters trained with PEFT, turned into the GGUF LoRAs the runtime applies.

A PEFT adapter is a folder with ``adapter_config.json`` and ``adapter_model.safetensors``
(``PeftModel.save_pretrained``). Its tensors are named after the Hugging Face modules
(``base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight``, ``lora_A`` of shape
``(r, in)``, ``lora_B`` of shape ``(out, r)``); PEFT adds ``scaling * B (A x)`` to the
layer's output, ``scaling = lora_alpha / r`` (``lora_alpha / sqrt(r)`` with ``use_rslora``;
``alpha_pattern`` and ``rank_pattern`` set it per module).

llama.cpp wants ``blk.N.<name>.weight.lora_a`` / ``.lora_b`` and adds
``scale * alpha / r * B (A x)``, with one ``adapter.lora.alpha`` for the whole file. The
conversion writes ``alpha = scaling * r`` when that is the same for every module (PEFT's
usual case) and otherwise folds each module's ``scaling`` into its ``lora_b`` and writes
``alpha = 0`` (llama.cpp then scales by 1). For the llama architecture the GGUF stores the
q and k projections with their rows permuted for llama.cpp's rope (what llama.cpp's own
converters do to the weights); ``lora_b`` of ``q_proj``/``k_proj`` gets the same
permutation, which :mod:`._hf_lora` undoes again on the Transformers backend.

Only numpy and safetensors (base dependencies) are used: the file is written here, without
the ``gguf`` package, so ``model.load_lora(folder)`` works on a plain install.
"""

from __future__ import annotations

import json
import math
import re
import struct
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import AdapterError
from ._hf_lora import GGUF_TO_HF, PERMUTED_QK_ARCHITECTURES
from .gguf_meta import GGUF_MAGIC, GGUFFormatError, is_gguf_file, read_gguf_metadata

if TYPE_CHECKING:
    from .base import Model

__all__ = [
    "CONFIG_FILE",
    "HF_TO_GGUF",
    "PERMUTED_QK_ARCHITECTURES",
    "WEIGHTS_FILE",
    "PeftFactor",
    "PeftLora",
    "gguf_tensors",
    "head_counts",
    "is_peft_adapter",
    "peft_as_gguf",
    "peft_to_gguf",
    "permute_rows",
    "read_peft_lora",
    "write_gguf_lora_file",
]

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

# Hugging Face module path inside a decoder layer -> GGUF tensor name (every projection
# llama.cpp's LoRA loader knows in a dense decoder block).
HF_TO_GGUF: dict[str, str] = {hf: gguf for gguf, hf in GGUF_TO_HF.items()}

_TENSOR = re.compile(
    r"(?:^|\.)layers\.(\d+)\.(self_attn\.[qkvo]_proj|mlp\.(?:gate|up|down)_proj)\.lora_([AB])(?:\.[\w-]+)?\.weight$"
)
_QK = ("self_attn.q_proj", "self_attn.k_proj")
_GGUF_VERSION = 3
_ALIGN = 32
_STRING, _FLOAT32, _F32_TENSOR = 8, 6, 0


@dataclass(frozen=True)
class PeftFactor:
    """One adapted projection: ``lora_a`` ``(r, in)``, ``lora_b`` ``(out, r)``, PEFT's scaling."""

    block: int
    module: str
    lora_a: np.ndarray
    lora_b: np.ndarray
    scaling: float


@dataclass(frozen=True)
class PeftLora:
    """A PEFT LoRA folder as read: its factors in Hugging Face row order and its config."""

    path: Path
    factors: list[PeftFactor]
    config: dict[str, Any]


def is_peft_adapter(path: str | Path) -> bool:
    """Whether ``path`` is a folder holding a PEFT adapter (``adapter_config.json``)."""
    p = Path(path)
    return p.is_dir() and (p / CONFIG_FILE).is_file()


def _read_config(folder: Path) -> dict[str, Any]:
    try:
        config = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{folder / CONFIG_FILE} is not readable JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise AdapterError(f"{folder / CONFIG_FILE} is not a PEFT adapter config (not a JSON object).")
    kind = config.get("peft_type")
    if str(kind).upper() != "LORA":
        raise AdapterError(f"{folder} is a PEFT {kind!r} adapter; only LoRA adapters (peft_type LORA) can be applied.")
    if config.get("use_dora"):
        raise AdapterError(f"{folder} is a DoRA adapter (use_dora); llama.cpp applies plain LoRA only.")
    if not (folder / WEIGHTS_FILE).is_file():
        pickled = (folder / "adapter_model.bin").is_file()
        extra = " (it has adapter_model.bin: save it with safe_serialization=True)" if pickled else ""
        raise AdapterError(f"{folder} has no {WEIGHTS_FILE}{extra}.")
    return config


def _pattern_value(patterns: Any, module_name: str, default: float) -> float:
    """PEFT's ``rank_pattern``/``alpha_pattern`` look-up: the first key that matches the end of
    the module's name (as a regular expression), else ``default``."""
    if isinstance(patterns, dict):
        for key, value in patterns.items():
            if re.match(rf"(.*\.)?({key})$", module_name):
                return float(value)
    return default


def _scaling(config: dict[str, Any], module_name: str, rank: int) -> float:
    alpha = _pattern_value(config.get("alpha_pattern"), module_name, float(config.get("lora_alpha", 8)))
    return alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank


def read_peft_lora(folder: str | Path) -> PeftLora:
    """Read a PEFT LoRA folder; :class:`AdapterError` for anything llama.cpp cannot apply
    (DoRA, trained biases or embeddings, other modules than the block projections)."""
    from safetensors.numpy import load_file

    path = Path(folder).expanduser()
    if not is_peft_adapter(path):
        raise AdapterError(f"{path} is not a PEFT adapter folder (no {CONFIG_FILE}).")
    config = _read_config(path)
    try:
        tensors = load_file(str(path / WEIGHTS_FILE))
    except Exception as exc:
        raise AdapterError(f"{path / WEIGHTS_FILE} is not a readable safetensors file: {exc}") from exc
    parts: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for name, value in tensors.items():
        m = _TENSOR.search(name)
        if m is None:
            raise AdapterError(
                f"The PEFT adapter {path} has a tensor this runtime cannot apply: {name} (only LoRA on the "
                f"{', '.join(HF_TO_GGUF)} projections of decoder blocks, without bias, is supported)."
            )
        parts.setdefault((int(m.group(1)), m.group(2)), {})[m.group(3)] = np.asarray(value, dtype=np.float32)
    if not parts:
        raise AdapterError(f"The PEFT adapter {path} holds no LoRA tensors.")
    factors = []
    for (block, module), ab in sorted(parts.items()):
        a, b = ab.get("A"), ab.get("B")
        if a is None or b is None or a.ndim != 2 or b.ndim != 2 or b.shape[1] != a.shape[0] or a.shape[0] == 0:
            shapes = {k: v.shape for k, v in ab.items()}
            raise AdapterError(
                f"The PEFT adapter {path} has mismatched lora_A/lora_B for layer {block} {module}: {shapes}"
            )
        name = f"model.layers.{block}.{module}"
        factors.append(PeftFactor(block, module, a, b, _scaling(config, name, int(a.shape[0]))))
    return PeftLora(path=path, factors=factors, config=config)


def permute_rows(rows: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """llama.cpp's q/k row permutation (``LlamaModel.permute`` of its converter): Hugging Face
    row order to the order a llama-architecture GGUF stores; the inverse of
    :func:`pocket_agent.runtime._hf_lora.reverse_permute_rows`."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    if n_head <= 0 or rows.shape[0] % (2 * n_head):
        raise AdapterError(f"Cannot permute {rows.shape[0]} rows for {n_head} heads.")
    w = rows.reshape(n_head, 2, rows.shape[0] // n_head // 2, *rows.shape[1:])
    return np.ascontiguousarray(w.swapaxes(1, 2).reshape(rows.shape))


def gguf_tensors(
    lora: PeftLora, *, architecture: str, n_head: int = 0, n_head_kv: int = 0
) -> tuple[dict[str, np.ndarray], float]:
    """The GGUF LoRA tensors (``blk.N.attn_q.weight.lora_a`` ...) and ``adapter.lora.alpha``."""
    alphas = {f.scaling * f.lora_a.shape[0] for f in lora.factors}
    uniform = len(alphas) == 1 and next(iter(alphas)) != 0.0
    alpha = next(iter(alphas)) if uniform else 0.0
    out: dict[str, np.ndarray] = {}
    for f in lora.factors:
        b = f.lora_b if uniform else f.lora_b * np.float32(f.scaling)
        gguf_name = HF_TO_GGUF[f.module]
        if architecture in PERMUTED_QK_ARCHITECTURES and gguf_name in ("attn_q", "attn_k"):
            b = permute_rows(b, n_head, n_head if gguf_name == "attn_q" else n_head_kv)
        out[f"blk.{f.block}.{gguf_name}.weight.lora_a"] = f.lora_a
        out[f"blk.{f.block}.{gguf_name}.weight.lora_b"] = b
    return out, float(alpha)


def _string(text: str) -> bytes:
    encoded = text.encode("utf-8")
    return struct.pack("<Q", len(encoded)) + encoded


def write_gguf_lora_file(
    path: Path, tensors: dict[str, np.ndarray], *, architecture: str, alpha: float, strings: dict[str, str]
) -> Path:
    """Write a GGUF LoRA (``general.type=adapter``, ``adapter.type=lora``, float32 tensors) with
    numpy only; ``strings`` are extra string keys (``pocket_agent.*``)."""
    keys = {"general.architecture": architecture, "general.type": "adapter", "adapter.type": "lora", **strings}
    head = bytearray(GGUF_MAGIC + struct.pack("<IQQ", _GGUF_VERSION, len(tensors), len(keys) + 1))
    for key, value in keys.items():
        head += _string(key) + struct.pack("<I", _STRING) + _string(value)
    head += _string("adapter.lora.alpha") + struct.pack("<If", _FLOAT32, alpha)
    offset, blobs = 0, []
    for name in sorted(tensors):
        data = np.ascontiguousarray(tensors[name], dtype="<f4")
        head += _string(name) + struct.pack("<I", data.ndim) + struct.pack(f"<{data.ndim}Q", *reversed(data.shape))
        head += struct.pack("<IQ", _F32_TENSOR, offset)
        blobs.append(data.tobytes())
        offset += -(-data.nbytes // _ALIGN) * _ALIGN
    head += b"\0" * (-len(head) % _ALIGN)
    with open(path, "wb") as out:
        out.write(head)
        for blob in blobs:
            out.write(blob + b"\0" * (-len(blob) % _ALIGN))
    return path


def peft_to_gguf(
    folder: str | Path, output: str | Path, *, architecture: str, n_head: int = 0, n_head_kv: int = 0
) -> Path:
    """Write the PEFT LoRA in ``folder`` as a GGUF LoRA at ``output`` for a model of this GGUF
    ``architecture`` (``n_head``/``n_head_kv``: its attention heads, needed for q/k of llama)."""
    lora = read_peft_lora(folder)
    tensors, alpha = gguf_tensors(lora, architecture=architecture, n_head=n_head, n_head_kv=n_head_kv)
    base = lora.config.get("base_model_name_or_path")
    strings = {"pocket_agent.peft_base_model": str(base)} if base else {}
    return write_gguf_lora_file(Path(output), tensors, architecture=architecture, alpha=alpha, strings=strings)


def head_counts(source: Path, architecture: str) -> tuple[int, int]:
    """``(n_head, n_head_kv)`` of a GGUF model file or a Hugging Face folder (``config.json``)."""
    if is_gguf_file(source):
        keys = [f"{architecture}.attention.head_count", f"{architecture}.attention.head_count_kv"]
        try:
            meta = read_gguf_metadata(source, keys)
        except (GGUFFormatError, OSError) as exc:
            raise AdapterError(f"Cannot read the attention heads of {source}: {exc}") from exc
        n_head, n_head_kv = meta.get(keys[0]), meta.get(keys[1], meta.get(keys[0]))
    else:
        try:
            config = json.loads((source / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise AdapterError(f"Cannot read the attention heads of {source}: {exc}") from exc
        config = config.get("text_config", config) if isinstance(config, dict) else {}
        n_head = config.get("num_attention_heads")
        n_head_kv = config.get("num_key_value_heads", n_head)
    if not isinstance(n_head, int) or not isinstance(n_head_kv, int):
        raise AdapterError(f"{source} does not say its attention head counts as single numbers.")
    return n_head, n_head_kv


@contextmanager
def peft_as_gguf(model: Model, folder: Path) -> Iterator[Path]:
    """A temporary GGUF LoRA of the PEFT adapter in ``folder``, for ``model`` (removed after)."""
    if model.backend not in ("llamacpp", "transformers"):
        raise AdapterError(
            f"The {model.backend} backend cannot apply a LoRA at run time; merge the PEFT adapter into the "
            "weights instead: pocket_agent.convert.merge_lora(checkpoint, adapter_folder, out), then convert_to_mnn."
        )
    arch = model.info.architecture
    lora = read_peft_lora(folder)
    n_head = n_head_kv = 0
    if arch in PERMUTED_QK_ARCHITECTURES and any(f.module in _QK for f in lora.factors):
        n_head, n_head_kv = head_counts(Path(model.info.path), arch)
    tensors, alpha = gguf_tensors(lora, architecture=arch, n_head=n_head, n_head_kv=n_head_kv)
    with tempfile.TemporaryDirectory(prefix="pocket-agent-peft-") as tmp:
        yield write_gguf_lora_file(Path(tmp) / "adapter.gguf", tensors, architecture=arch, alpha=alpha, strings={})
