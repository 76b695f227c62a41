"""The Hugging Face checkpoint training runs on, for a loaded runtime model."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import InvalidInputError, ModelLoadError
from ..runtime import Model


def checkpoint_folder(model: Model, checkpoint: str | os.PathLike[str] | None) -> Path:
    """The HF folder holding ``model``'s weights: ``checkpoint`` when given, else the GGUF
    converted once into the cache (:func:`pocket_agent.convert.hf_checkpoint`)."""
    if checkpoint is not None:
        folder = Path(checkpoint)
        if not (folder / "config.json").is_file():
            raise InvalidInputError(f"{folder} is not a Hugging Face checkpoint folder (no config.json).")
        return folder
    if model.backend != "llamacpp":
        raise InvalidInputError(
            f"Training needs the model's weights as a Hugging Face checkpoint; a {model.backend} model has none. "
            "Load the GGUF build, or pass checkpoint= (the safetensors folder of the same model)."
        )
    from ..convert import hf_checkpoint

    return hf_checkpoint(model.path)


def load_torch_model(folder: Path, threads: int | None) -> Any:
    """The float32 causal LM in ``folder``, in eval mode, on the CPU."""
    import torch
    from transformers import AutoModelForCausalLM

    if threads is not None:
        torch.set_num_threads(max(1, threads))
    try:
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"transformers could not load {folder}: {exc}") from exc
    model.eval()  # type: ignore[no-untyped-call]
    return model
