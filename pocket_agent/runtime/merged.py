"""Task adapters merged into the weights: a model that runs one task at the base weights' speed.

A LoRA applied at run time costs llama.cpp extra matrix products in every adapted layer
(for the shipped extraction adapter about 10% of prompt speed and 5% of a one-token step;
11% of an SROIE receipt end to end, AMD EPYC, 1 thread, BF16). ``load_model(merge_adapter=
"extract")`` instead writes the adapter into the weights of the copy the model runs from
(:mod:`.layout`), once, cached. Such a model serves that task and plain generation; the other
tasks refuse it (:func:`check_base_weights`), since their adapters and heads were trained on
the base weights.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from ..errors import AdapterError, InvalidInputError
from .base import Model
from .layout import CopyType, Layout, copy_type, weights_copy

logger = logging.getLogger("pocket_agent.merged")

MERGEABLE_TASKS: tuple[str, ...] = ("extract",)
MERGED_TASK = "merged_task"  # ModelInfo.extra keys of a merged model
MERGED_ADAPTER = "merged_adapter"


def merged_task(model: Model) -> str | None:
    """The task whose adapter is merged into ``model``'s weights, or None for base weights."""
    return model.info.extra.get(MERGED_TASK)


def check_base_weights(model: Model, purpose: str) -> None:
    """Raise :class:`AdapterError` when ``model`` runs merged task weights, for ``purpose``
    (``"decide"``, the ``tools`` adapter...) that needs the base weights."""
    task = merged_task(model)
    if task is not None:
        raise AdapterError(
            f"This model runs with the {task!r} adapter merged into its weights "
            f"(load_model(merge_adapter=...)), so it serves {task!r} only; {purpose} needs the base weights. "
            "Use a model loaded without merge_adapter for it (load_model(), or model=None)."
        )


def check_merged_choice(model: Model, choice: object, task: str) -> None:
    """Refuse running ``task`` with adapter ``choice`` on a merged model unless the merged
    adapter is the one asked for (``"auto"`` or its path)."""
    merged = merged_task(model)
    if merged is None:
        return
    if task != merged:
        check_base_weights(model, f"the {task!r} task")
    if isinstance(choice, str) and choice == "auto":
        return
    if isinstance(choice, (str, os.PathLike)) and Path(choice).resolve() == Path(model.info.extra[MERGED_ADAPTER]):
        return
    asked = "the base weights (adapter=None)" if choice is None else f"the adapter {choice}"
    raise AdapterError(
        f"This model has the {merged!r} adapter {model.info.extra[MERGED_ADAPTER]} merged into its weights; "
        f"it cannot run {task!r} on {asked}. Load the model without merge_adapter for that."
    )


def merge_plan(
    source: Path, adapter: str | os.PathLike[str], layout: Layout, identity_of: Callable[[], str]
) -> tuple[Path, CopyType, Path, str] | None:
    """What ``load_model(merge_adapter=adapter)`` loads: ``(merged copy, its type, the LoRA,
    its task)``, or None when a task's adapter is not merged here (nothing shipped for the
    model, ``$POCKET_AGENT_NO_DEFAULT_ADAPTER``, or a layout that writes no copy): the model
    then loads as usual and applies the adapter at run time.

    ``identity_of`` gives the source model's identity (:func:`.identity.model_identity`);
    it is called only when an adapter has to be matched or checked.
    """
    from .task_adapters import NO_DEFAULT_ENV, adapter_record, shipped_for_identity

    by_task = isinstance(adapter, str) and adapter in MERGEABLE_TASKS
    if not by_task and not isinstance(adapter, (str, os.PathLike)):
        raise InvalidInputError(
            f"merge_adapter must be one of {MERGEABLE_TASKS} or the path of a GGUF LoRA, got {adapter!r}."
        )
    # merging re-lays the weights out anyway: under "auto" any 4/5-bit GGUF gets the default model's copy
    kind = copy_type(source, layout, is_default_model=True)
    if by_task:
        task = str(adapter)
        if os.environ.get(NO_DEFAULT_ENV) or kind is None:
            return None
        lora = shipped_for_identity(identity_of(), task)
        if lora is None:
            logger.info("No %s adapter is shipped for %s: it loads with its base weights.", task, source.name)
            return None
    else:
        lora = Path(adapter).expanduser()
        if not lora.is_file():
            raise AdapterError(f"LoRA adapter file not found: {lora} (merge_adapter takes {MERGEABLE_TASKS} or a path)")
        record = adapter_record(lora)
        task = record.get("task", "")
        if task not in MERGEABLE_TASKS:
            raise AdapterError(
                f"merge_adapter takes an extraction LoRA (pocket_agent.task = 'extract'); {lora.name} records "
                f"task {task or 'none'!r}. Apply other LoRAs at run time (model.load_lora)."
            )
        base = record.get("base_model_id")
        if base is not None and base != identity_of():
            raise AdapterError(f"The LoRA {lora.name} was trained for another base model than {source.name}.")
        if kind is None:
            raise AdapterError(
                f"Cannot merge {lora.name} into {source.name}: merging writes a BF16 or Q8_0 copy, which "
                f"layout={layout!r} or this file's type (not 4/5-bit) rules out. Apply it at run time instead."
            )
    try:
        copy = weights_copy(source, kind, merge=lora.resolve())
    except OSError as exc:  # a read-only cache, a full disk: speed changes, never whether a model loads
        if by_task:
            logger.warning("Applying the %s adapter at run time: its merged copy could not be written (%s).", task, exc)
            return None
        raise AdapterError(f"Cannot write the copy of {source.name} with {lora.name} merged: {exc}") from exc
    return copy, kind, lora.resolve(), task
