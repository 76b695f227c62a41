"""Merge a GGUF LoRA into a GGUF model's weights, writing a new GGUF file (numpy only).

The tensors the LoRA adapts are written as float32 ``W + scale * alpha / r * B A``, exactly
the delta llama.cpp adds at run time; every other tensor and every key/value of the source
are copied byte for byte. The result is a mixed-type file meant for llama.cpp's quantizer,
which turns it into the BF16 or Q8_0 copy the model runs from (:mod:`.layout`).
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from ..errors import AdapterError
from .gguf_meta import GGUF_MAGIC, GGUFFormatError, GGUFLayout, GGUFTensorInfo, read_gguf_layout, read_gguf_metadata

# ggml_type ids this module reads (gguf spec)
F32, F16, Q4_0, Q4_1, Q8_0, BF16 = 0, 1, 2, 3, 8, 30
MERGEABLE_TYPES = frozenset({F32, F16, Q4_0, Q4_1, Q8_0, BF16})
_LORA_TYPES = frozenset({F32, F16, BF16})
_BLOCK = 32
_BLOCK_BYTES = {Q4_0: 18, Q4_1: 20, Q8_0: 34}


def dequantize(raw: bytes | memoryview | np.ndarray, ggml_type: int, count: int) -> np.ndarray:
    """``count`` float32 values from a tensor's bytes; F32, F16, BF16, Q8_0, Q4_0 and Q4_1."""
    buf = np.frombuffer(raw, dtype=np.uint8)
    if ggml_type == F32:
        return buf[: count * 4].view("<f4").astype(np.float32)
    if ggml_type == F16:
        return buf[: count * 2].view("<f2").astype(np.float32)
    if ggml_type == BF16:
        return (buf[: count * 2].view("<u2").astype(np.uint32) << 16).view(np.float32)
    if ggml_type not in _BLOCK_BYTES or count % _BLOCK:
        raise ValueError(f"cannot dequantize ggml type {ggml_type} ({count} values)")
    blocks = buf[: count // _BLOCK * _BLOCK_BYTES[ggml_type]].reshape(-1, _BLOCK_BYTES[ggml_type])
    scale = blocks[:, :2].copy().view("<f2").astype(np.float32)
    if ggml_type == Q8_0:
        return (blocks[:, 2:].view(np.int8).astype(np.float32) * scale).reshape(-1)
    packed = blocks[:, -16:]
    nibbles = np.concatenate([packed & 0x0F, packed >> 4], axis=1).astype(np.float32)  # low halves first
    if ggml_type == Q4_0:
        return ((nibbles - 8.0) * scale).reshape(-1)
    minimum = blocks[:, 2:4].copy().view("<f2").astype(np.float32)
    return (nibbles * scale + minimum).reshape(-1)


def _tensor_values(path: Path, layout: GGUFLayout, info: GGUFTensorInfo, data: np.ndarray) -> np.ndarray:
    count = int(np.prod(info.dims, dtype=np.int64))
    start = layout.data_start + info.offset
    try:
        return dequantize(data[start : start + info.nbytes], info.ggml_type, count).reshape(info.shape)
    except ValueError as exc:
        raise GGUFFormatError(f"{path}: tensor {info.name!r}: {exc}") from exc


def lora_deltas(lora: Path, scale: float = 1.0) -> dict[str, np.ndarray]:
    """``{tensor name: float32 delta}`` of a GGUF LoRA at ``scale`` (llama.cpp's arithmetic:
    ``scale * alpha / r * B @ A``, or ``scale * B @ A`` when alpha is 0)."""
    try:
        meta = read_gguf_metadata(lora, ["general.type", "adapter.type", "adapter.lora.alpha"])
        layout = read_gguf_layout(lora)
    except (GGUFFormatError, OSError) as exc:
        raise AdapterError(f"{lora} is not a readable GGUF LoRA: {exc}") from exc
    if meta.get("adapter.type") != "lora":
        raise AdapterError(f"{lora} is not a GGUF LoRA (adapter.type is {meta.get('adapter.type')!r}).")
    alpha = float(meta.get("adapter.lora.alpha") or 0.0)
    data = np.memmap(lora, dtype=np.uint8, mode="r")
    factors: dict[str, np.ndarray] = {}
    for info in layout.tensors:
        if info.ggml_type not in _LORA_TYPES or len(info.dims) != 2:
            raise AdapterError(f"{lora}: tensor {info.name!r} is not a 2-D F32/F16/BF16 LoRA factor.")
        factors[info.name] = _tensor_values(lora, layout, info, data)
    deltas: dict[str, np.ndarray] = {}
    for name, a in factors.items():
        if not name.endswith(".lora_a"):
            continue
        target = name[: -len(".lora_a")]
        b = factors.get(target + ".lora_b")
        if b is None or b.shape[1] != a.shape[0]:
            raise AdapterError(f"{lora}: {target}.lora_b is missing or does not match {name}.")
        rank = a.shape[0]
        factor = scale * alpha / rank if alpha else scale
        deltas[target] = (b.astype(np.float64) @ a.astype(np.float64) * factor).astype(np.float32)
    if not deltas:
        raise AdapterError(f"{lora} holds no LoRA factor pairs (*.lora_a / *.lora_b).")
    return deltas


def write_merged_gguf(source: Path, lora: Path, target: Path, *, scale: float = 1.0) -> None:
    """Write ``source`` with ``lora`` merged into its weights to ``target`` (adapted tensors
    float32, everything else as in ``source``). :class:`AdapterError` when the LoRA does not
    fit the model or adapts a tensor of a type this module cannot read."""
    deltas = lora_deltas(lora, scale)
    try:
        layout = read_gguf_layout(source)
    except (GGUFFormatError, OSError) as exc:
        raise AdapterError(f"Cannot merge into {source}: {exc}") from exc
    by_name = {t.name: t for t in layout.tensors}
    for name, delta in deltas.items():
        info = by_name.get(name)
        if info is None:
            raise AdapterError(f"{lora} adapts {name!r}, which {source.name} does not have.")
        if info.shape != delta.shape:
            raise AdapterError(f"{lora} adapts {name!r} as {delta.shape}, but it is {info.shape} in {source.name}.")
        if info.ggml_type not in MERGEABLE_TYPES:
            raise AdapterError(f"Cannot merge into {name!r} of {source.name}: ggml type {info.ggml_type} is not read.")
    data = np.memmap(source, dtype=np.uint8, mode="r")
    align = layout.alignment

    def padded(n: int) -> int:
        return -(-n // align) * align

    table = bytearray()
    offsets: list[int] = []
    offset = 0
    for info in layout.tensors:
        size = info.nbytes if info.name not in deltas else 4 * int(np.prod(info.dims, dtype=np.int64))
        encoded = info.name.encode("utf-8")
        table += struct.pack("<Q", len(encoded)) + encoded + struct.pack("<I", len(info.dims))
        table += struct.pack(f"<{len(info.dims)}Q", *info.dims)
        table += struct.pack("<IQ", F32 if info.name in deltas else info.ggml_type, offset)
        offsets.append(offset)
        offset = padded(offset + size)
    with open(target, "wb") as out:
        out.write(GGUF_MAGIC + struct.pack("<IQQ", layout.version, len(layout.tensors), layout.kv_count))
        out.write(data[layout.kv_start : layout.kv_end].tobytes())
        out.write(table)
        out.write(b"\0" * (padded(out.tell()) - out.tell()))
        data_start = out.tell()
        for info, start in zip(layout.tensors, offsets, strict=True):
            out.write(b"\0" * (data_start + start - out.tell()))
            if info.name in deltas:
                merged = _tensor_values(source, layout, info, data) + deltas[info.name]
                out.write(merged.astype("<f4").tobytes())
            else:
                begin = layout.data_start + info.offset
                out.write(data[begin : begin + info.nbytes].tobytes())
