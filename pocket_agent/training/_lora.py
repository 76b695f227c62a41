"""LoRA layers for a Hugging Face causal LM, and their export to a GGUF LoRA file.

The layers are our own (a frozen ``nn.Linear`` plus ``B @ A`` scaled by ``alpha / rank``)
rather than peft's: they are a few lines, and the export must name every tensor the way
llama.cpp expects (``blk.N.<name>.weight.lora_a`` / ``.lora_b``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import AdapterError

# HF module name (inside a decoder layer) -> GGUF tensor name. attn_q / attn_k are left out:
# llama-architecture GGUFs store q/k rows permuted relative to HF, so their lora_b would have
# to be permuted too; the value, output and MLP projections carry the adaptation without it.
GGUF_NAMES = {
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
DEFAULT_TARGETS = tuple(GGUF_NAMES)


class LoraLinear(nn.Module):
    """``base(x) + (x A^T B^T) * alpha / rank`` with ``base`` frozen; B starts at zero."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, generator: torch.Generator) -> None:
        super().__init__()
        self.base = base
        self.rank = rank
        self.alpha = alpha
        a = torch.empty(rank, base.in_features)
        bound = 1.0 / math.sqrt(base.in_features)
        a.uniform_(-bound, bound, generator=generator)
        self.lora_a = nn.Parameter(a)
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.base(x) + (x @ self.lora_a.t() @ self.lora_b.t()) * (self.alpha / self.rank)
        return out


@dataclass(frozen=True)
class LoraConfig:
    """Where the LoRA goes and its size: blocks ``first_block``..``last_block`` (inclusive)."""

    rank: int = 8
    alpha: float = 16.0
    first_block: int = 0
    last_block: int = -1
    targets: tuple[str, ...] = DEFAULT_TARGETS

    def blocks(self, n_layer: int) -> range:
        last = self.last_block if self.last_block >= 0 else n_layer - 1
        return range(max(self.first_block, 0), min(last, n_layer - 1) + 1)


def attach_lora(layers: Sequence[nn.Module], config: LoraConfig, seed: int) -> dict[str, LoraLinear]:
    """Replace the target projections of the chosen blocks with :class:`LoraLinear`.

    Returns the new modules by GGUF base name (``blk.N.attn_v``). Every other parameter is
    frozen.
    """
    unknown = [t for t in config.targets if t not in GGUF_NAMES]
    if unknown:
        raise AdapterError(f"Unknown LoRA targets {unknown}; choose from {sorted(GGUF_NAMES)}.")
    for layer in layers:
        for p in layer.parameters():
            p.requires_grad_(False)
    gen = torch.Generator().manual_seed(seed)
    added: dict[str, LoraLinear] = {}
    for b in config.blocks(len(layers)):
        for target in config.targets:
            parent_name, _, attr = target.rpartition(".")
            parent = layers[b].get_submodule(parent_name)
            base = getattr(parent, attr)
            if isinstance(base, LoraLinear):
                raise AdapterError(f"Block {b} {target} already carries a LoRA.")
            lora = LoraLinear(base, config.rank, config.alpha, gen)
            setattr(parent, attr, lora)
            added[f"blk.{b}.{GGUF_NAMES[target]}"] = lora
    return added


def lora_parameters(loras: dict[str, LoraLinear]) -> Iterator[nn.Parameter]:
    for lora in loras.values():
        yield lora.lora_a
        yield lora.lora_b


def lora_state(loras: dict[str, LoraLinear]) -> dict[str, torch.Tensor]:
    """The trainable tensors by GGUF name (a copy)."""
    out: dict[str, torch.Tensor] = {}
    for name, lora in loras.items():
        out[f"{name}.weight.lora_a"] = lora.lora_a.detach().clone()
        out[f"{name}.weight.lora_b"] = lora.lora_b.detach().clone()
    return out


def load_lora_state(loras: dict[str, LoraLinear], state: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, lora in loras.items():
            lora.lora_a.copy_(state[f"{name}.weight.lora_a"])
            lora.lora_b.copy_(state[f"{name}.weight.lora_b"])


def write_gguf_lora(
    path: Path,
    state: dict[str, torch.Tensor],
    *,
    architecture: str,
    alpha: float,
    metadata: dict[str, str],
) -> Path:
    """Write ``state`` as a GGUF LoRA llama.cpp loads at run time.

    ``lora_a`` is stored as ``[rank, in]`` and ``lora_b`` as ``[out, rank]`` (numpy order;
    GGUF reverses the dimensions). ``metadata`` goes in as ``pocket_agent.*`` string keys:
    llama.cpp ignores extra keys, and they say what the adapter is for and which base it
    was trained on (``base_model_id`` becomes ``pocket_agent.base_model_id``, which
    ``Model.load_lora`` checks against the model it is loaded into).
    """
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(alpha))
    for key, value in sorted(metadata.items()):
        writer.add_string(f"pocket_agent.{key}", value)
    for name in sorted(state):
        writer.add_tensor(name, np.ascontiguousarray(state[name].numpy(), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def read_gguf_lora_metadata(path: Path) -> dict[str, str]:
    """The ``pocket_agent.*`` keys of a GGUF LoRA written by :func:`write_gguf_lora`."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    out: dict[str, str] = {}
    for key, field in reader.fields.items():
        if key.startswith("pocket_agent."):
            value: Any = field.contents()
            out[key.removeprefix("pocket_agent.")] = str(value)
    return out


def update_gguf_lora_metadata(path: Path, extra: dict[str, str]) -> Path:
    """Rewrite a GGUF LoRA from :func:`write_gguf_lora` with ``extra`` ``pocket_agent.*`` keys
    added or replaced (e.g. a routing constant calibrated after training); tensors unchanged."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    arch = str(reader.fields["general.architecture"].contents())
    alpha = float(reader.fields["adapter.lora.alpha"].contents())
    metadata = read_gguf_lora_metadata(path)
    metadata.update(extra)
    tensors = {t.name: np.array(t.data).reshape([int(d) for d in reversed(t.shape)]) for t in reader.tensors}
    del reader  # its memory map must be closed before the file is replaced
    tmp = path.with_name(path.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    for key, value in sorted(metadata.items()):
        writer.add_string(f"pocket_agent.{key}", value)
    for name in sorted(tensors):
        writer.add_tensor(name, np.ascontiguousarray(tensors[name], dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return path
