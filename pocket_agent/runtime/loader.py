"""``load_model``: pick the backend from the source and load the model.

A ``.gguf`` file goes to llama.cpp; an MNN build (its ``config.json`` or the folder that
holds it) goes to MNN; a Hugging Face checkpoint folder goes to transformers (the
``train`` extra), which also loads a GGUF when asked with ``backend="transformers"``.
Without a source, ``POCKET_AGENT_MODEL`` is used, else the
embedded default model. :func:`get_default_model` keeps one process-wide model that
``extract``/``Agent``/``decide`` share (each switching its adapter on at run time); only the
``"speed"`` and ``"split"`` layouts give extraction a second model with its adapter merged.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from ..errors import InvalidInputError, ModelLoadError, ModelNotFoundError
from .base import Model
from .default_model import default_model_path
from .layout import (
    SEPARATE_EXTRACTION,
    CopyType,
    Layout,
    cached_identity,
    describe_copy,
    generation_copy,
    layout_setting,
    runtime_weights,
    weights_copy,
)
from .merged import MERGEABLE_TASKS, MERGED_ADAPTER, MERGED_TASK, merge_plan, merged_task

logger = logging.getLogger("pocket_agent.loader")

Backend = Literal["llamacpp", "mnn", "transformers"]
BACKENDS: tuple[Backend, ...] = ("llamacpp", "mnn", "transformers")
ENV_MODEL = "POCKET_AGENT_MODEL"
MNN_CONFIG = "config.json"

_default_lock = threading.Lock()
_default_model: Model | None = None
_task_models: dict[str, Model] = {}  # get_default_model(task): models with that task's adapter merged
_user_default = False  # set_default_model() was given a model: it serves every task


def resolve_source(source: str | os.PathLike[str] | None = None) -> Path:
    """The model path ``load_model`` would use for ``source``."""
    if source is None:
        env = os.environ.get(ENV_MODEL)
        return Path(env).expanduser() if env else default_model_path()
    if not isinstance(source, (str, os.PathLike)):
        raise InvalidInputError(f"source must be a path (str or PathLike), got {type(source).__name__}.")
    if isinstance(source, str) and not source.strip():
        raise InvalidInputError("source is an empty string; give a .gguf file or an MNN build folder.")
    return Path(source).expanduser()


def detect_backend(path: Path) -> tuple[Backend, Path]:
    """Which backend loads ``path``, and the exact file to give it."""
    if not path.exists():
        raise ModelNotFoundError(f"Model not found: {path}")
    if path.is_dir():
        cfg = path / MNN_CONFIG
        if cfg.is_file() and _looks_like_mnn_config(cfg):
            return "mnn", cfg
        if cfg.is_file() and _looks_like_hf_checkpoint(path):
            return "transformers", path
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return "llamacpp", ggufs[0]
        raise ModelNotFoundError(
            f"{path} holds no model build: expected an MNN build (config.json + llm.mnn), a Hugging Face "
            f"checkpoint (config.json + *.safetensors) or a single .gguf file"
            f"{'; found several .gguf files, name one' if ggufs else ''}."
        )
    if path.suffix.lower() == ".gguf":
        return "llamacpp", path
    if path.name.endswith(".json"):
        if _looks_like_mnn_config(path):
            return "mnn", path
        if path.name == MNN_CONFIG and _looks_like_hf_checkpoint(path.parent):
            return "transformers", path.parent
        raise ModelLoadError(f"{path} is not the config.json of an MNN LLM build (no llm_model/llm.mnn entry).")
    with path.open("rb") as f:
        if f.read(4) == b"GGUF":
            return "llamacpp", path
    raise ModelLoadError(f"{path} is neither a .gguf file nor the config.json of an MNN build.")


def _looks_like_hf_checkpoint(folder: Path) -> bool:
    """A transformers checkpoint: config.json with a ``model_type`` and weights beside it."""
    import json

    try:
        data = json.loads((folder / MNN_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        return False
    return any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin"))


def _looks_like_mnn_config(cfg: Path) -> bool:
    import json

    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict):
        return False
    if "llm_model" in data or "llm_weight" in data:
        return True
    return (cfg.parent / "llm.mnn").is_file()


def load_model(
    source: str | os.PathLike[str] | None = None,
    *,
    backend: Backend | None = None,
    threads: int | None = None,
    n_ctx: int | None = None,
    layout: str | None = None,
    merge_adapter: str | os.PathLike[str] | None = None,
    **backend_options: Any,
) -> Model:
    """Load a model.

    Args:
        source: a ``.gguf`` file, an MNN build's ``config.json`` or its folder, or a Hugging
            Face checkpoint folder. ``None`` uses ``$POCKET_AGENT_MODEL``, else the embedded
            default model.
        backend: ``"llamacpp"``, ``"mnn"`` or ``"transformers"`` to override detection; a
            GGUF loads with transformers only when asked (it is converted once, cached).
        threads: CPU threads (default: ``$POCKET_AGENT_THREADS``, else the cores this process
            may use: CPU affinity, the cgroup's CPU quota and ``$OMP_NUM_THREADS`` respected).
        n_ctx: context window in tokens (default: the model's, capped at 4096).
        layout: the weight layout a GGUF runs in on llama.cpp (see
            :mod:`pocket_agent.runtime.layout`): ``"auto"`` (default) runs the embedded
            default model (Q4_1) from one copy written once to the cache, BF16 where llama.cpp
            computes BF16 natively (AVX512-BF16), else Q8_0, which evaluates prompts 2-2.5x
            as fast as Q4_1 with the same model within rounding; ``"bf16"`` / ``"q8_0"`` do
            that for any 4/5-bit GGUF; ``"lean"``/``"original"`` loads files as they are (least
            memory); ``"speed"``: ``"auto"``, a merged model splitting prompts and generation;
            ``"split"``: prompts on a BF16, generation on a Q8_0 copy. Default: ``$POCKET_AGENT_LAYOUT``.
        merge_adapter: ``"extract"`` (the extraction LoRA shipped for this model) or the path
            of an extraction LoRA (GGUF, ``pocket-agent tune extract``), merged into the weights
            of the copy the model runs from (written once, cached; llama.cpp only). Extraction
            then runs at the base weights' speed (a LoRA applied at run time costs ~11% per
            SROIE receipt), and the model serves extraction and plain generation only:
            ``Agent`` and ``decide`` refuse it (their adapters need the base weights). With
            ``"extract"`` and nothing to merge (no adapter shipped for the model, a layout that
            writes no copy) the model loads as usual and ``extract`` applies the adapter at
            run time. ``extract(model=None)`` uses the default model loaded this way under the
            ``"speed"`` and ``"split"`` layouts only.
        backend_options: passed to the backend (``n_batch``, ``n_seq``, ``flash_attn``,
            ``extra_buffers`` and ``adaptive_threads`` for llama.cpp; ``memory``, ``precision``, ``config`` and
            ``adaptive_threads`` for MNN).
            ``extra_buffers=False`` keeps GGUF weights out of llama.cpp's extra buffer types
            (AMX, repacked layouts); the default decides from the CPU and turns them off
            where llama.cpp would use Intel AMX, which crashes on prompts
            (``$POCKET_AGENT_EXTRA_BUFFERS=1|0|auto`` sets it for every load). Transformers
            takes ``n_batch`` and ``cache_dir`` (where a GGUF's conversion is kept).
            ``adaptive_threads`` (default on) treats ``threads`` as a ceiling and runs each
            evaluation size on ``threads`` unless 1 thread measures clearly faster here; on MNN,
            whose thread count is fixed at load, a one-thread engine on the same weights is
            kept beside and each prompt runs on the engine that measures faster.
    """
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise InvalidInputError(f"threads must be a positive integer, got {threads!r}.")
    if n_ctx is not None and (isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 8):
        raise InvalidInputError(f"n_ctx must be an integer >= 8, got {n_ctx!r}.")
    chosen_layout = layout_setting(layout)
    path = resolve_source(source)
    detected, target = detect_backend(path)
    chosen = backend or detected
    if chosen not in BACKENDS:
        raise InvalidInputError(f"backend must be 'llamacpp', 'mnn' or 'transformers', got {backend!r}.")
    gguf_on_transformers = chosen == "transformers" and detected == "llamacpp"
    if chosen != detected and not gguf_on_transformers:
        raise InvalidInputError(f"{path} is a {detected} model; it cannot be loaded with backend={chosen!r}.")
    model: Model
    if chosen == "llamacpp":
        model = _load_gguf(target, chosen_layout, merge_adapter, threads=threads, n_ctx=n_ctx, **backend_options)
    elif merge_adapter is not None and merge_adapter not in MERGEABLE_TASKS:  # a task's adapter: applied at run time
        raise InvalidInputError(f"merge_adapter needs a GGUF model on llama.cpp; {chosen} applies LoRAs at run time.")
    elif chosen == "transformers":
        from .hf import TransformersModel

        model = TransformersModel(target, threads=threads, n_ctx=n_ctx, **backend_options)
    else:
        from .mnn import MnnModel

        model = MnnModel(target, threads=threads, n_ctx=n_ctx, **backend_options)
    return model


def _load_gguf(
    target: Path,
    chosen_layout: Layout,
    merge_adapter: str | os.PathLike[str] | None,
    *,
    threads: int | None,
    n_ctx: int | None,
    **backend_options: Any,
) -> Model:
    """``load_model`` for a GGUF on llama.cpp: the copy (or file) its layout runs, merged or not."""
    from .llamacpp import LlamaCppModel

    plan = None
    kind: CopyType | None
    lora: Path | None = None
    if merge_adapter is not None:
        plan = merge_plan(target, merge_adapter, chosen_layout, lambda: _source_identity(target))
    if plan is not None:
        weights, kind, lora, task = plan
        merged = {MERGED_TASK: task, MERGED_ADAPTER: str(lora)}
    else:
        weights, kind = runtime_weights(target, chosen_layout, is_default_model=_is_default_model(target))
        merged = {}
    gen_kind = generation_copy(chosen_layout, kind, merged=bool(merged))
    gen_weights = _generation_weights(target, gen_kind, lora)
    if gen_weights is None:
        gen_kind = None
    else:
        backend_options = {**backend_options, "generation_weights": gen_weights}
    model: Model = LlamaCppModel(weights, threads=threads, n_ctx=n_ctx, **backend_options)
    if kind is None:
        model.info = replace(model.info, extra={**model.info.extra, "layout": _as_it_is(chosen_layout, target)})
    else:  # the model is still the file the caller named; its weights run from the copy
        described = describe_copy(chosen_layout, kind, gen_kind)
        if merged:
            described += f", {merged[MERGED_TASK]} adapter merged"
        extra = {**model.info.extra, "weights": str(weights), "layout": described, **merged}
        if gen_weights is not None:
            extra["generation weights"] = str(gen_weights)
        model.info = replace(model.info, path=target, extra=extra)
    return model


def _as_it_is(layout: Layout, target: Path) -> str:
    """Why a GGUF runs as it is (the ``layout`` info of a model loaded from its own file)."""
    if layout in ("original", "lean"):
        return f"{layout}: the file as it is (asked for)"
    if layout in ("auto", "speed") and not _is_default_model(target):
        return f"{layout}: the file as it is (copies are made for the embedded default model only)"
    return f"{layout}: the file as it is (not a 4/5-bit GGUF, or its copy could not be written)"


def _generation_weights(source: Path, kind: CopyType | None, lora: Path | None) -> Path | None:
    """The copy split weights generate on (``lora`` merged in too), or None: one copy runs everything."""
    if kind is None:
        return None
    try:
        return weights_copy(source, kind, merge=lora)
    except OSError as exc:  # speed changes, never whether a model loads
        logger.warning(
            "Generating on the prompt weights: the %s copy of %s could not be written (%s).", kind, source, exc
        )
        return None


def _source_identity(path: Path) -> str:
    """The identity of the GGUF at ``path``: loaded as it is on a small context the first time, then cached."""
    from .identity import model_identity
    from .llamacpp import LlamaCppModel

    def probe_identity(source: Path) -> str:
        probe = LlamaCppModel(source, threads=1, n_ctx=64)
        try:
            return model_identity(probe)
        finally:
            probe.close()

    return cached_identity(path, probe_identity)


def _is_default_model(path: Path) -> bool:
    try:
        return path.resolve() == default_model_path().resolve()
    except (ModelNotFoundError, OSError):
        return False


def get_default_model(task: str | None = None) -> Model:
    """The process-wide default model, loaded on first use and then reused.

    ``extract``, ``decide`` and ``Agent`` share it, each switching its task adapter on at run
    time, so a process using all three holds one set of weights. ``task="extract"`` under the
    ``"speed"`` or ``"split"`` layout (``$POCKET_AGENT_LAYOUT``) gives instead a second model
    with the extraction adapter merged into its weights (``load_model(merge_adapter="extract")``:
    extraction ~15-20% faster per receipt, about twice the memory); where nothing can be
    merged there, or after :func:`set_default_model`, the shared model itself.
    """
    global _default_model
    with _default_lock:
        if task is not None and not _user_default and layout_setting(None) in SEPARATE_EXTRACTION:
            model = _task_models.get(task)
            if model is None or model.closed:
                model = load_model(merge_adapter=task)
                if merged_task(model) != task:  # nothing merged: share the one default model
                    if _default_model is None or _default_model.closed:
                        _default_model = model
                    else:
                        model.close()
                        model = _default_model
                _task_models[task] = model
            return model
        if _default_model is None or _default_model.closed:
            _default_model = load_model()
        return _default_model


def tasks_note(layout: Layout | None = None) -> str:
    """How the default model's tasks run under ``layout`` (default: the one in effect), for
    ``pocket-agent info``."""
    chosen = layout_setting(layout)
    if chosen in SEPARATE_EXTRACTION:
        return (
            f"extract(model=None) on a second model with the extraction adapter merged (layout {chosen!r}); "
            "decide and Agent on this one, their adapters switched at run time"
        )
    return (
        "extract, decide and Agent share these weights, each task's adapter switched on at run time "
        "(POCKET_AGENT_LAYOUT=speed: a second, merged model for extraction, faster, about twice the memory)"
    )


def set_default_model(model: Model | None) -> None:
    """Replace the process-wide default model (``None`` forgets it; the next use reloads).

    A model set here serves every task, extraction included (no merged extraction model).
    """
    global _default_model, _user_default
    with _default_lock:
        _default_model = model
        _user_default = model is not None
        _task_models.clear()


def resolve_model(model: Model | str | os.PathLike[str] | None) -> Model:
    """What every entry point does with its ``model=`` argument."""
    if model is None:
        return get_default_model()
    if isinstance(model, Model):
        return model
    if isinstance(model, (str, os.PathLike)):
        return load_model(model)
    raise InvalidInputError(f"model must be a loaded Model, a path or None, got {type(model).__name__}.")
