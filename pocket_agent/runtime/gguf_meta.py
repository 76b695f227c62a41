"""A small pure-Python reader for GGUF metadata.

It reads the key/value header of a GGUF file without numpy, torch or the ``gguf``
package, so the library can look at a model (architecture, chat template) before it
starts a heavy conversion step, and the tensor table (names, types, offsets) for code
that rewrites a file (:mod:`pocket_agent.runtime._gguf_merge`). Tensor data is never read.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

GGUF_MAGIC = b"GGUF"

# GGUF metadata value types (gguf spec, version 2 and 3).
_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _FLOAT32, _BOOL = range(8)
_STRING, _ARRAY, _UINT64, _INT64, _FLOAT64 = 8, 9, 10, 11, 12

_SCALAR_FORMATS: dict[int, str] = {
    _UINT8: "B",
    _INT8: "b",
    _UINT16: "H",
    _INT16: "h",
    _UINT32: "I",
    _INT32: "i",
    _FLOAT32: "f",
    _BOOL: "?",
    _UINT64: "Q",
    _INT64: "q",
    _FLOAT64: "d",
}

# Arrays longer than this are skipped rather than decoded (token lists, merges, scores).
_MAX_ARRAY_DECODE = 64


class GGUFFormatError(ValueError):
    """The file is not a GGUF file this reader understands."""


def is_gguf_file(path: str | Path) -> bool:
    """Whether ``path`` is a regular file that starts with the GGUF magic bytes."""
    p = Path(path)
    if not p.is_file():
        return False
    try:
        with open(p, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


class _Reader:
    def __init__(self, f: BinaryIO, endian: str) -> None:
        self.f = f
        self.endian = endian

    def exact(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise GGUFFormatError("unexpected end of file in the GGUF header")
        return data

    def scalar(self, vtype: int) -> Any:
        fmt = self.endian + _SCALAR_FORMATS[vtype]
        return struct.unpack(fmt, self.exact(struct.calcsize(fmt)))[0]

    def u32(self) -> int:
        return int(self.scalar(_UINT32))

    def u64(self) -> int:
        return int(self.scalar(_UINT64))

    def string(self) -> str:
        n = self.u64()
        if n > 1 << 30:
            raise GGUFFormatError("implausible string length in the GGUF header")
        return self.exact(n).decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        n = self.u64()
        self.f.seek(n, 1)

    def value(self, vtype: int, decode: bool) -> Any:
        if vtype in _SCALAR_FORMATS:
            return self.scalar(vtype)
        if vtype == _STRING:
            if decode:
                return self.string()
            self.skip_string()
            return None
        if vtype == _ARRAY:
            etype = self.u32()
            count = self.u64()
            if etype not in _SCALAR_FORMATS and etype not in (_STRING, _ARRAY):
                raise GGUFFormatError(f"unknown GGUF array element type {etype}")
            if not decode or count > _MAX_ARRAY_DECODE:
                if etype in _SCALAR_FORMATS:
                    self.f.seek(count * struct.calcsize(_SCALAR_FORMATS[etype]), 1)
                else:
                    for _ in range(count):
                        self.value(etype, False)
                return None
            return [self.value(etype, True) for _ in range(count)]
        raise GGUFFormatError(f"unknown GGUF value type {vtype}")


def _open_header(f: BinaryIO, path: str | Path) -> tuple[_Reader, int]:
    """A reader positioned after the magic and version of an open GGUF file, and the version."""
    if f.read(4) != GGUF_MAGIC:
        raise GGUFFormatError(f"{path} is not a GGUF file (bad magic bytes)")
    raw_version = f.read(4)
    if len(raw_version) != 4:
        raise GGUFFormatError(f"{path} is truncated")
    version = struct.unpack("<I", raw_version)[0]
    if version in (2, 3):
        return _Reader(f, "<"), version
    swapped = struct.unpack(">I", raw_version)[0]
    if swapped in (2, 3):
        return _Reader(f, ">"), swapped
    raise GGUFFormatError(f"{path}: unsupported GGUF version {version}")


def read_gguf_metadata(path: str | Path, keys: Iterable[str] | None = None) -> dict[str, Any]:
    """Return GGUF metadata values.

    ``keys`` limits the result to those keys (reading stops once all were found);
    ``None`` returns every key, with long arrays (token lists, merges) as ``None``.

    Raises :class:`GGUFFormatError` when the file is not a GGUF file of version 2 or 3.
    """
    wanted = set(keys) if keys is not None else None
    out: dict[str, Any] = {}
    with open(path, "rb") as f:
        r, _ = _open_header(f, path)
        r.u64()  # tensor count
        kv_count = r.u64()
        for _ in range(kv_count):
            key = r.string()
            vtype = r.u32()
            decode = wanted is None or key in wanted
            value = r.value(vtype, decode)
            if decode:
                out[key] = value
                if wanted is not None and wanted.issubset(out):
                    break
    return out


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor of a GGUF file: ``dims`` in ggml order (fastest-varying first)."""

    name: str
    dims: tuple[int, ...]
    ggml_type: int
    offset: int  # from the start of the data section
    nbytes: int  # up to the next tensor (alignment padding included) or the end of the file

    @property
    def shape(self) -> tuple[int, ...]:
        """The numpy (row-major) shape: ``dims`` reversed."""
        return tuple(reversed(self.dims))


@dataclass(frozen=True)
class GGUFLayout:
    """Where things are in a little-endian GGUF file: the key/value section as raw bytes
    (``kv_start``..``kv_end``), the tensor table, and the aligned start of the data."""

    version: int
    kv_count: int
    kv_start: int
    kv_end: int
    tensors: tuple[GGUFTensorInfo, ...]
    alignment: int
    data_start: int


def read_gguf_layout(path: str | Path) -> GGUFLayout:
    """The tensor table of a little-endian GGUF file (no tensor data is read).

    Raises :class:`GGUFFormatError` for anything else (bad magic, version, big-endian).
    """
    size = Path(path).stat().st_size
    with open(path, "rb") as f:
        r, version = _open_header(f, path)
        if r.endian != "<":
            raise GGUFFormatError(f"{path} is a big-endian GGUF file")
        n_tensors = r.u64()
        kv_count = r.u64()
        kv_start = f.tell()
        alignment = 32
        for _ in range(kv_count):
            key = r.string()
            vtype = r.u32()
            value = r.value(vtype, key == "general.alignment")
            if key == "general.alignment" and isinstance(value, int) and value > 0:
                alignment = value
        kv_end = f.tell()
        raw: list[tuple[str, tuple[int, ...], int, int]] = []
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.u32()
            if n_dims > 8:
                raise GGUFFormatError(f"{path}: tensor {name!r} has {n_dims} dimensions")
            dims = tuple(r.u64() for _ in range(n_dims))
            raw.append((name, dims, r.u32(), r.u64()))
        data_start = -(-f.tell() // alignment) * alignment
    ends = sorted({offset for *_, offset in raw} | {size - data_start})
    tensors = []
    for name, dims, ggml_type, offset in raw:
        following = next(e for e in ends if e > offset) if offset < size - data_start else offset
        tensors.append(GGUFTensorInfo(name, dims, ggml_type, offset, following - offset))
    return GGUFLayout(version, kv_count, kv_start, kv_end, tuple(tensors), alignment, data_start)
