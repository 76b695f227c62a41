"""The weight layout a GGUF model runs in: Q4_1 files re-laid out as Q8_0, once, cached.

llama.cpp's x86 kernels for Q4_1 (the embedded default model's quantization) evaluate
prompts at about half the speed of its Q8_0 kernels on the same CPU (bench/extract.md,
"Reading it"). Q8_0 stores every Q4_1 weight within 1/254 of its 32-weight block's range,
so a Q8_0 copy is the same model within rounding: the extraction benchmark gives identical
fields on 40 SROIE receipts. The copy is written once into the cache (``$POCKET_AGENT_CACHE/gguf``,
about 1.6x the source's size) by llama.cpp's own quantizer, and reused while the source
file is unchanged.

``layout`` (``load_model``'s argument, else ``$POCKET_AGENT_LAYOUT``):

- ``"auto"`` (default): the embedded default model runs as Q8_0; any other file as it is.
- ``"q8_0"``: every Q4_0/Q4_1/Q5_0/Q5_1 GGUF runs as a Q8_0 copy.
- ``"original"``: every file runs as it is.

A copy that cannot be written (read-only cache, full disk) is logged and the source is
loaded as it is: the layout changes speed, never whether a model loads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Literal

from ..errors import InvalidInputError
from ._files import cache_root, file_lock
from .gguf_meta import GGUFFormatError, read_gguf_metadata

logger = logging.getLogger("pocket_agent.layout")

Layout = Literal["auto", "q8_0", "original"]
LAYOUTS: tuple[Layout, ...] = ("auto", "q8_0", "original")
LAYOUT_ENV = "POCKET_AGENT_LAYOUT"

# llama.cpp ``llama_ftype`` values (general.file_type) that a Q8_0 copy holds without
# further loss: 4- and 5-bit blocks of 32 weights (Q4_0, Q4_1, Q5_0, Q5_1).
_RELAYOUT_FROM = frozenset({2, 3, 8, 9})
_FTYPE_Q8_0 = 7
# Bump when the way copies are written changes; older copies are then rewritten.
_RECIPE = 1


def layout_setting(argument: str | None) -> Layout:
    """The layout asked for: ``argument``, else ``$POCKET_AGENT_LAYOUT``, else ``"auto"``."""
    if argument is not None:
        if argument not in LAYOUTS:
            raise InvalidInputError(f"layout must be one of {', '.join(map(repr, LAYOUTS))}, got {argument!r}.")
        return argument  # type: ignore[return-value]
    raw = os.environ.get(LAYOUT_ENV, "").strip().lower()
    if raw in LAYOUTS:
        return raw  # type: ignore[return-value]
    if raw:
        logger.warning("Ignoring %s=%r: use auto, q8_0 or original.", LAYOUT_ENV, raw)
    return "auto"


def gguf_file_type(path: Path) -> int | None:
    """``general.file_type`` of a GGUF file (a ``llama_ftype``), or None when absent or unreadable."""
    try:
        value = read_gguf_metadata(path, keys=["general.file_type"]).get("general.file_type")
    except (OSError, GGUFFormatError):
        return None
    return int(value) if isinstance(value, int) else None


def wants_q8_0(path: Path, layout: Layout, is_default_model: bool) -> bool:
    """Whether ``path`` should run as a Q8_0 copy under ``layout``."""
    if layout == "original" or (layout == "auto" and not is_default_model):
        return False
    return gguf_file_type(path) in _RELAYOUT_FROM


def runtime_gguf(path: Path, layout: Layout, *, is_default_model: bool, cache_dir: str | Path | None = None) -> Path:
    """The GGUF file llama.cpp should load for ``path``: a cached Q8_0 copy or ``path`` itself."""
    if not wants_q8_0(path, layout, is_default_model):
        return path
    try:
        return q8_0_copy(path, cache_dir=cache_dir)
    except OSError as exc:
        logger.warning("Loading %s as it is: its Q8_0 copy could not be written (%s).", path, exc)
        return path


def q8_0_copy(source: Path, *, cache_dir: str | Path | None = None) -> Path:
    """A Q8_0 copy of ``source`` in the cache, written by llama.cpp's quantizer when missing or stale."""
    from .llamacpp import quantize_gguf  # llama.cpp is imported only when a GGUF is loaded

    folder = cache_root(cache_dir) / "gguf"
    folder.mkdir(parents=True, exist_ok=True)
    # one copy per source file: two GGUFs of the same name in different folders do not collide
    tag = hashlib.sha256(str(source.resolve()).encode("utf-8")).hexdigest()[:8]
    target = folder / f"{source.stem}.{tag}.q8_0.gguf"
    stamp_path = target.with_suffix(".json")
    st = source.stat()
    stamp = {"source": str(source.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "recipe": _RECIPE}
    with file_lock(folder / f".{source.stem}.{tag}.lock"):
        if target.is_file() and _read_stamp(stamp_path) == stamp:
            return target
        partial = target.with_suffix(".partial")
        quantize_gguf(source, partial, file_type=_FTYPE_Q8_0)
        os.replace(partial, target)
        stamp_path.write_text(json.dumps(stamp), encoding="utf-8")
    logger.info("Wrote a Q8_0 copy of %s to %s.", source, target)
    return target


def _read_stamp(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
