"""The weight layout a GGUF model runs in: Q4_1 files re-laid out as BF16 or Q8_0, once, cached.

llama.cpp's x86 kernels for Q4_1 (the embedded default model's quantization) evaluate
prompts at about half the speed of its Q8_0 kernels on the same CPU (bench/extract.md,
"Reading it"), and on a CPU with AVX512-BF16 its BF16 kernels evaluate them faster still
(AMD EPYC, 1 thread, SmolLM2-135M with the extraction adapter, rounds interleaved:
347 tok/s against 266 for Q8_0 and ~140 for Q4_1; a one-token step 16.8 ms against 13.7,
since BF16 reads twice the bytes). The library's work (extraction, decisions, agent turns)
is mostly prompt, so BF16 wins there: ~10% less time per SROIE receipt. Both copies are the
same model within rounding: Q8_0 stores every Q4_1 weight within 1/254 of its 32-weight
block's range, BF16 within 1/256 of the weight itself. A copy is written once into the cache
(``$POCKET_AGENT_CACHE/gguf``; Q8_0 about 1.6x the source's size, BF16 about 3.1x) by
llama.cpp's own quantizer, and reused while the source file is unchanged.

``layout`` (``load_model``'s argument, else ``$POCKET_AGENT_LAYOUT``):

- ``"auto"`` (default): the embedded default model runs as BF16 where llama.cpp's build
  uses AVX512-BF16 (its system info), else as Q8_0; any other file as it is. One copy, one
  context: the default model serves ``extract``, ``decide`` and ``Agent`` with their adapters
  switched at run time (465 MB peak RSS for all three in one process, BF16; 344 MB Q8_0).
- ``"lean"`` / ``"original"``: every file runs as it is (the Q4_1 file: 300 MB peak RSS for
  all three, nothing written to the cache; prompts about half as fast as from a copy).
- ``"speed"``: as ``"auto"``, and ``extract(model=None)`` runs on a second model with the
  extraction adapter merged into its weights (``merge_adapter``), split where BF16 is native
  (below), elsewhere its Q8_0 copy evaluating prompts in a second context with flash attention
  (``LlamaCppModel(generation_weights=<the same file>)``): extraction ~15-20% faster per receipt,
  about twice the memory (both copies of the merged model, two KV caches, beside the shared one).
- ``"bf16"`` / ``"q8_0"``: every Q4_0/Q4_1/Q5_0/Q5_1 GGUF runs as a copy of that type.
- ``"split"``: prompts run on the BF16 copy and generation on the Q8_0 copy (both written;
  ``LlamaCppModel(generation_weights=...)``). A prompt is bound by arithmetic, where BF16 is
  fastest (and llama.cpp's flash attention, which the prompt context uses, 1.2x faster on a
  500-token prompt), a one-token step by reading every weight once, where Q8_0's half the
  bytes win; the prompt's keys and values move to the generation context (~10-20 ms for 500
  tokens). SROIE, AMD EPYC, 1 thread: see ``bench/extract.md``. Such a model applies no LoRA
  at run time (merge it instead) and holds both copies and two KV caches.
- ``"original"``: every file runs as it is.

A copy that cannot be written (read-only cache, full disk) is logged and the source is
loaded as it is: the layout changes speed, never whether a model loads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from ..errors import InvalidInputError
from ._files import cache_root, file_lock
from .gguf_meta import GGUFFormatError, read_gguf_metadata

logger = logging.getLogger("pocket_agent.layout")

Layout = Literal["auto", "lean", "speed", "bf16", "q8_0", "split", "original"]
LAYOUTS: tuple[Layout, ...] = ("auto", "lean", "speed", "bf16", "q8_0", "split", "original")
SEPARATE_EXTRACTION: tuple[Layout, ...] = ("speed", "split")
"""Layouts under which ``extract(model=None)`` runs on a model of its own, the extraction adapter
merged into its weights; under the others the one default model serves every task."""
CopyType = Literal["bf16", "q8_0"]
LAYOUT_ENV = "POCKET_AGENT_LAYOUT"

# llama.cpp ``llama_ftype`` values (general.file_type) that a Q8_0 or BF16 copy holds
# without further loss: 4- and 5-bit blocks of 32 weights (Q4_0, Q4_1, Q5_0, Q5_1).
_RELAYOUT_FROM = frozenset({2, 3, 8, 9})
_FTYPES: dict[CopyType, int] = {"q8_0": 7, "bf16": 32}
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
        logger.warning("Ignoring %s=%r: use one of %s.", LAYOUT_ENV, raw, ", ".join(LAYOUTS))
    return "auto"


def gguf_file_type(path: Path) -> int | None:
    """``general.file_type`` of a GGUF file (a ``llama_ftype``), or None when absent or unreadable."""
    try:
        value = read_gguf_metadata(path, keys=["general.file_type"]).get("general.file_type")
    except (OSError, GGUFFormatError):
        return None
    return int(value) if isinstance(value, int) else None


def native_bf16() -> bool:
    """Whether the llama.cpp build this process loads computes in BF16 natively (AVX512-BF16)."""
    from .llamacpp import system_info  # llama.cpp is imported only when a GGUF is loaded

    return "AVX512_BF16 = 1" in system_info()


def copy_type(path: Path, layout: Layout, is_default_model: bool) -> CopyType | None:
    """The type of copy ``path`` should run as under ``layout``, or None to load it as it is."""
    if layout in ("original", "lean") or (layout in ("auto", "speed") and not is_default_model):
        return None
    if gguf_file_type(path) not in _RELAYOUT_FROM:
        return None
    if layout == "q8_0":
        return "q8_0"
    if layout in ("bf16", "split"):
        return "bf16"
    return "bf16" if native_bf16() else "q8_0"  # auto, speed


def generation_copy(layout: Layout, kind: CopyType | None, *, merged: bool) -> CopyType | None:
    """The type of the copy generation runs on where it runs in a context of its own, or None
    for one context.

    ``"split"``: Q8_0 beside the BF16 prompt copy. ``"speed"``, for a model with an adapter
    merged (its tasks never apply a LoRA at run time, which two sets of weights cannot): the
    same, where BF16 is native; elsewhere its Q8_0 copy itself, in a second context, so that
    prompts still run with flash attention (15% faster on a 511-token prompt, AMD EPYC).
    ``"auto"`` keeps one copy and one context (memory first)."""
    if layout == "split" and kind == "bf16":
        return "q8_0"
    if layout == "speed" and merged and kind is not None:
        return "q8_0"
    return None


def describe_copy(layout: Layout, kind: CopyType, generation: CopyType | None = None) -> str:
    """How a loaded model's ``layout`` info reads: the layout asked for and the copy it ran."""
    if generation == kind:
        return f"{describe_copy(layout, kind)}, prompts in a flash-attention context"
    if generation is not None:
        return f"{layout}: {kind.upper()} copy for prompts, {generation.upper()} copy for generation"
    if layout not in ("auto", "speed"):
        return f"{layout}: {kind.upper()} copy"
    why = "llama.cpp computes BF16 natively here" if kind == "bf16" else "no native BF16 here"
    return f"{layout}: {kind.upper()} copy ({why})"


def runtime_weights(
    path: Path, layout: Layout, *, is_default_model: bool, cache_dir: str | Path | None = None
) -> tuple[Path, CopyType | None]:
    """The GGUF file llama.cpp should load for ``path`` and the type of copy it is: a cached
    copy, or ``(path, None)`` when it runs as it is (also when the copy cannot be written)."""
    kind = copy_type(path, layout, is_default_model)
    if kind is None:
        return path, None
    try:
        return weights_copy(path, kind, cache_dir=cache_dir), kind
    except OSError as exc:
        logger.warning("Loading %s as it is: its %s copy could not be written (%s).", path, kind.upper(), exc)
        return path, None


def runtime_gguf(path: Path, layout: Layout, *, is_default_model: bool, cache_dir: str | Path | None = None) -> Path:
    """The GGUF file llama.cpp should load for ``path``: a cached copy or ``path`` itself."""
    return runtime_weights(path, layout, is_default_model=is_default_model, cache_dir=cache_dir)[0]


def weights_copy(
    source: Path, kind: CopyType, *, cache_dir: str | Path | None = None, merge: Path | None = None
) -> Path:
    """A ``kind`` copy of ``source`` in the cache, written by llama.cpp's quantizer when missing or stale.

    ``merge``: a GGUF LoRA merged into the copy's weights first (:mod:`._gguf_merge`); the copy
    is then the adapted model, cached apart from the plain one and rewritten when either file changes.
    """
    from .llamacpp import quantize_gguf  # llama.cpp is imported only when a GGUF is loaded

    folder = cache_root(cache_dir) / "gguf"
    folder.mkdir(parents=True, exist_ok=True)
    # one copy per source file: two GGUFs of the same name in different folders do not collide
    tag = _path_tag(source)
    adapted = "" if merge is None else f".{merge.stem}-{_path_tag(merge)}"
    target = folder / f"{source.stem}.{tag}{adapted}.{kind}.gguf"
    stamp_path = target.with_suffix(".json")
    stamp = {**_file_stamp(source), "recipe": _RECIPE}
    if merge is not None:
        stamp["merged"] = _file_stamp(merge)
    with file_lock(folder / f".{source.stem}.{tag}.lock"):
        if target.is_file() and _read_stamp(stamp_path) == stamp:
            return target
        partial = target.with_suffix(".partial")
        if merge is None:
            quantize_gguf(source, partial, file_type=_FTYPES[kind])
        else:
            from ._gguf_merge import write_merged_gguf

            mixed = target.with_suffix(".merging")
            try:
                write_merged_gguf(source, merge, mixed)
                quantize_gguf(mixed, partial, file_type=_FTYPES[kind])
            finally:
                mixed.unlink(missing_ok=True)
        os.replace(partial, target)
        stamp_path.write_text(json.dumps(stamp), encoding="utf-8")
    merged = f" with {merge} merged" if merge else ""
    logger.info("Wrote a %s copy of %s%s to %s.", kind.upper(), source, merged, target)
    return target


def cached_identity(source: Path, compute: Callable[[Path], str], *, cache_dir: str | Path | None = None) -> str:
    """``compute(source)`` (a model identity), kept in the cache beside the copies and reused
    while ``source`` is unchanged, so matching an adapter does not load the model every start."""
    folder = cache_root(cache_dir) / "gguf"
    record = folder / f"{source.stem}.{_path_tag(source)}.identity.json"
    stamp = _file_stamp(source)
    known = _read_stamp(record)
    if known is not None and known.get("file") == stamp and isinstance(known.get("identity"), str):
        return str(known["identity"])
    identity = compute(source)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"file": stamp, "identity": identity}), encoding="utf-8")
    except OSError as exc:  # a read-only cache: computed again next time
        logger.debug("Identity of %s not cached: %s", source, exc)
    return identity


def cache_usage(cache_dir: str | Path | None = None) -> tuple[int, int, Path]:
    """The derived copies in the cache: ``(count, bytes, folder)`` (each source path and each
    merged adapter has copies of its own; deleting the folder is safe, they are rewritten)."""
    folder = cache_root(cache_dir) / "gguf"
    try:
        copies = [f for f in folder.iterdir() if f.suffix == ".gguf" and f.is_file()]
    except OSError:
        return 0, 0, folder
    return len(copies), sum(f.stat().st_size for f in copies), folder


def _path_tag(path: Path) -> str:
    return hashlib.sha256(str(path.resolve()).encode("utf-8")).hexdigest()[:8]


def _file_stamp(path: Path) -> dict[str, object]:
    st = path.stat()
    return {"source": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def q8_0_copy(source: Path, *, cache_dir: str | Path | None = None) -> Path:
    """A Q8_0 copy of ``source`` in the cache (:func:`weights_copy`)."""
    return weights_copy(source, "q8_0", cache_dir=cache_dir)


def _read_stamp(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
