"""Merge a GGUF LoRA (or a PEFT adapter folder) into a Hugging Face checkpoint's weights.

For a backend that cannot apply our LoRAs at run time: MNN takes only its own split LoRA
format, whose export leaves out ``v_proj`` (which the shipped extraction adapter adapts).
The merged checkpoint is an ordinary one: :func:`pocket_agent.convert.convert_to_mnn` turns
it into a build that runs the adapted model with nothing applied at run time.

The delta is exactly what llama.cpp adds at run time (``alpha / r * B A``, q/k rows
un-permuted for llama, :mod:`pocket_agent.runtime._hf_lora`), added in float32.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from pocket_agent.errors import AdapterError, ConversionError
from pocket_agent.runtime.gguf_meta import is_gguf_file, read_gguf_metadata
from pocket_agent.runtime.peft_lora import PERMUTED_QK_ARCHITECTURES, head_counts, is_peft_adapter, peft_to_gguf

_SOURCE_FILE = "pocket_agent_source.json"  # written by the GGUF -> transformers step


def _architecture(checkpoint: Path, config: dict[str, Any]) -> str:
    """The GGUF architecture name the LoRA must be for (``llama`` for SmolLM2)."""
    source = checkpoint / _SOURCE_FILE
    if source.is_file():
        arch = json.loads(source.read_text(encoding="utf-8")).get("architecture")
        if isinstance(arch, str) and arch:
            return arch
    return str(config.get("model_type", ""))


def _read_lora(checkpoint: Path, config: dict[str, Any], lora: Path, shapes: dict[str, tuple[int, ...]]) -> Any:
    """The LoRA's factors (a GGUF LoRA, or a PEFT folder converted to one), checked against
    the checkpoint's weight ``shapes``."""
    if is_peft_adapter(lora):
        with tempfile.TemporaryDirectory(prefix="pocket-agent-peft-") as tmp:
            converted = peft_lora_to_gguf(lora, checkpoint, Path(tmp) / "adapter.gguf")
            return _read_lora(checkpoint, config, converted, shapes)
    from pocket_agent.runtime._hf_lora import read_gguf_lora

    def module(qualified: str) -> Any:
        shape = shapes.get(f"model.layers.{qualified}.weight")
        if shape is None or len(shape) != 2:
            return None
        import torch

        return SimpleNamespace(out_features=shape[0], in_features=shape[1], weight=SimpleNamespace(dtype=torch.float32))

    n_head = int(config.get("num_attention_heads", 0) or 0)
    return read_gguf_lora(
        lora,
        architecture=_architecture(checkpoint, config),
        n_head=n_head,
        n_head_kv=int(config.get("num_key_value_heads", n_head) or n_head),
        module=module,
    )


def peft_lora_to_gguf(adapter: str | Path, base: str | Path, output: str | Path) -> Path:
    """Write a LoRA trained with PEFT as a GGUF LoRA that llama.cpp applies at run time.

    Args:
        adapter: the folder ``PeftModel.save_pretrained`` wrote (``adapter_config.json``,
            ``adapter_model.safetensors``): LoRA on the attention and MLP projections.
        base: the model it is for, a GGUF file or a Hugging Face folder; its architecture
            and attention heads decide the tensor layout (q/k rows permuted for llama).
        output: the ``.gguf`` file to write.

    Returns:
        ``output``. ``model.load_lora(adapter)`` converts the same way as it loads, so the
        file is needed only to ship the adapter or to merge it elsewhere.

    Raises:
        AdapterError: the folder is not a PEFT LoRA that llama.cpp can apply (DoRA, biases,
            embeddings...) or ``base`` says nothing usable about its architecture.
    """
    src = Path(base).expanduser()
    if is_gguf_file(src):
        arch = read_gguf_metadata(src, ["general.architecture"]).get("general.architecture")
    elif (src / "config.json").is_file():
        arch = _architecture(src, json.loads((src / "config.json").read_text(encoding="utf-8")))
    else:
        raise AdapterError(f"{src} is neither a GGUF model nor a Hugging Face folder (config.json).")
    if not isinstance(arch, str) or not arch:
        raise AdapterError(f"{src} does not name its architecture.")
    n_head = n_head_kv = 0
    if arch in PERMUTED_QK_ARCHITECTURES:
        n_head, n_head_kv = head_counts(src, arch)
    out = Path(output).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    return peft_to_gguf(adapter, out, architecture=arch, n_head=n_head, n_head_kv=n_head_kv)


def _header_shapes(shards: list[Path]) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for shard in shards:  # from the headers: no tensor is read
        with safe_open(str(shard), "np") as f:
            for name in f.keys():
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def lora_modules(checkpoint: str | Path, lora: str | Path) -> list[str]:
    """The linear layers a GGUF LoRA (or PEFT folder) changes in ``checkpoint``, as Hugging Face module paths
    below ``model.layers`` (``"20.self_attn.v_proj"``), in layer order.

    Raises:
        AdapterError: the LoRA is not a GGUF LoRA for this checkpoint.
        ConversionError: ``checkpoint`` is not a checkpoint folder.
    """
    src = Path(checkpoint).expanduser().resolve()
    shards = sorted(src.glob("*.safetensors"))
    if not (src / "config.json").is_file() or not shards:
        raise ConversionError(f"{src} is not a Hugging Face checkpoint folder (config.json and *.safetensors).")
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    return list(_read_lora(src, config, Path(lora), _header_shapes(shards)).factors)


def merge_lora(checkpoint: str | Path, lora: str | Path, output_dir: str | Path, *, scale: float = 1.0) -> Path:
    """Write ``checkpoint`` to ``output_dir`` with a GGUF LoRA merged into its weights.

    Args:
        checkpoint: a Hugging Face folder (``config.json`` and ``*.safetensors``), e.g. from
            :func:`pocket_agent.convert.hf_checkpoint`.
        lora: a GGUF LoRA file for the same architecture and shapes, or a PEFT adapter
            folder (converted with :func:`peft_lora_to_gguf` first).
        output_dir: a folder that does not exist yet.
        scale: the adapter's scale, as ``load_lora(path, scale=...)`` takes it.

    Returns:
        ``output_dir``.

    Raises:
        AdapterError: the LoRA is not a GGUF LoRA for this checkpoint.
        ConversionError: ``checkpoint`` is not a checkpoint folder, or ``output_dir`` exists.
    """
    from safetensors.numpy import load_file, save_file

    src = Path(checkpoint).expanduser().resolve()
    out = Path(output_dir).expanduser().resolve()
    shards = sorted(src.glob("*.safetensors"))
    if not (src / "config.json").is_file() or not shards:
        raise ConversionError(f"{src} is not a Hugging Face checkpoint folder (config.json and *.safetensors).")
    if out.exists():
        raise ConversionError(f"{out} already exists; merge_lora writes a new folder.")
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    shapes = _header_shapes(shards)  # the tensors are read once, below

    weights = _read_lora(src, config, Path(lora), shapes)
    staging = out.with_name(f".{out.name}.merging")
    if staging.exists():
        shutil.rmtree(staging)
    shutil.copytree(src, staging, ignore=shutil.ignore_patterns("*.safetensors"))
    merged = 0
    try:
        for shard in shards:
            tensors = load_file(shard)
            for qualified, (a, b, factor) in weights.factors.items():
                key = f"model.layers.{qualified}.weight"
                if key in tensors:
                    w = tensors[key]
                    delta = (scale * factor) * (b.float().numpy() @ a.float().numpy())
                    tensors[key] = (w.astype(np.float32) + delta).astype(w.dtype)
                    merged += 1
            save_file(tensors, str(staging / shard.name), metadata={"format": "pt"})
        if merged != len(weights.factors):
            raise AdapterError(f"{lora}: merged {merged} of {len(weights.factors)} adapted weights into {src}.")
        staging.rename(out)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return out
