"""GGUF LoRA adapters applied to a transformers model, the way llama.cpp applies them.

A GGUF LoRA (``general.type=adapter``, ``adapter.type=lora``, ``adapter.lora.alpha``)
holds, per adapted weight ``blk.N.<name>.weight``, ``lora_a`` (numpy shape ``(r, in)``)
and ``lora_b`` (``(out, r)``). llama.cpp adds ``scale * alpha / r * B (A x)`` to the
weight's output (just ``scale * B (A x)`` when alpha is 0). For the llama architecture
the GGUF stores q and k projections with their rows permuted for llama.cpp's rope;
transformers un-permutes the weights when it reads the GGUF, so ``lora_b`` of
``attn_q``/``attn_k`` gets the same un-permutation here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import AdapterError

# GGUF tensor name -> module path inside a transformers decoder layer.
GGUF_TO_HF: dict[str, str] = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}

# GGUF architectures whose q/k rows transformers un-permutes (its LlamaTensorProcessor).
PERMUTED_QK_ARCHITECTURES: frozenset[str] = frozenset({"llama"})

_TENSOR = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.weight\.lora_(a|b)$")


@dataclass
class LoraWeights:
    """One loaded adapter: per layer-module name, ``(A, B, alpha / r)`` as torch tensors."""

    path: Path
    factors: dict[str, tuple[Any, Any, float]]


def reverse_permute_rows(rows: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """transformers' ``_reverse_permute_weights``: undo llama.cpp's q/k row permutation."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    dim = rows.shape[0] // n_head // 2
    w = rows.reshape(n_head, dim, 2, *rows.shape[1:])
    return w.swapaxes(2, 1).reshape(rows.shape)


def _field(reader: Any, key: str) -> Any:
    field = reader.get_field(key)
    return None if field is None else field.contents()


def _tensor_array(t: Any) -> np.ndarray:
    import gguf

    shape = tuple(reversed([int(x) for x in t.shape]))
    qtype = t.tensor_type
    if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        arr = np.asarray(t.data)
    else:
        arr = gguf.quants.dequantize(np.asarray(t.data), qtype)
    return np.ascontiguousarray(arr.reshape(shape), dtype=np.float32)


def read_gguf_lora(
    path: Path,
    *,
    architecture: str,
    n_head: int,
    n_head_kv: int,
    module: Callable[[str], Any],
) -> LoraWeights:
    """Read and check a GGUF LoRA against the model; ``module(name)`` returns the Linear or None."""
    try:
        import gguf
        import torch
    except ImportError as exc:  # pragma: no cover - the train extra brings both
        raise AdapterError(
            "Reading GGUF LoRA files needs the gguf package: pip install 'pocket-agent-mnn[train]'"
        ) from exc
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:
        raise AdapterError(f"{path} is not a readable GGUF file: {exc}") from exc
    kind = _field(reader, "general.type")
    if kind != "adapter" or _field(reader, "adapter.type") != "lora":
        raise AdapterError(f"{path} is not a GGUF LoRA adapter (general.type={kind!r}).")
    arch = _field(reader, "general.architecture")
    if arch != architecture:
        raise AdapterError(f"The LoRA {path} is for architecture {arch!r}; this model is {architecture!r}.")
    alpha = float(_field(reader, "adapter.lora.alpha") or 0.0)
    parts: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for t in reader.tensors:
        m = _TENSOR.match(t.name)
        if m is None or m.group(2) not in GGUF_TO_HF:
            raise AdapterError(f"The LoRA {path} has a tensor this backend cannot apply: {t.name}")
        parts.setdefault((int(m.group(1)), m.group(2)), {})[m.group(3)] = _tensor_array(t)
    factors: dict[str, tuple[Any, Any, float]] = {}
    for (blk, name), ab in sorted(parts.items()):
        if set(ab) != {"a", "b"}:
            raise AdapterError(f"The LoRA {path} has lora_a without lora_b (or the reverse) for blk.{blk}.{name}.")
        qualified = f"{blk}.{GGUF_TO_HF[name]}"
        linear = module(qualified)
        if linear is None:
            raise AdapterError(f"The LoRA {path} adapts blk.{blk}.{name}, which this model does not have.")
        a, b = ab["a"], ab["b"]
        rank = a.shape[0]
        if a.ndim != 2 or b.ndim != 2 or b.shape[1] != rank or rank == 0:
            raise AdapterError(f"The LoRA {path} has inconsistent ranks for blk.{blk}.{name}: A{a.shape}, B{b.shape}.")
        if a.shape[1] != linear.in_features or b.shape[0] != linear.out_features:
            raise AdapterError(
                f"The LoRA {path} does not fit blk.{blk}.{name}: A{a.shape} B{b.shape} for a "
                f"{linear.out_features}x{linear.in_features} weight."
            )
        if architecture in PERMUTED_QK_ARCHITECTURES and name == "attn_q":
            b = reverse_permute_rows(b, n_head, n_head)
        elif architecture in PERMUTED_QK_ARCHITECTURES and name == "attn_k":
            b = reverse_permute_rows(b, n_head, n_head_kv)
        factor = alpha / rank if alpha else 1.0
        dtype = linear.weight.dtype
        factors[qualified] = (
            torch.from_numpy(np.array(a, dtype=np.float32)).to(dtype),
            torch.from_numpy(np.array(b, dtype=np.float32)).to(dtype),
            factor,
        )
    return LoraWeights(path=path, factors=factors)
