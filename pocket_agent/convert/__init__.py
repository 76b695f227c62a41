"""Model conversion: GGUF or Hugging Face folders to MNN LLM builds, GGUF to Hugging Face.

Importing this package is cheap: torch, transformers and llmexport are used only by
subprocesses that :func:`convert_to_mnn` starts. They come with the ``convert`` extra::

    pip install 'pocket-agent-mnn[convert]'
"""

from __future__ import annotations

from pocket_agent.convert._default import (
    DEFAULT_MODEL_NAME,
    default_gguf_path,
    ensure_default_mnn,
    sha256_file,
)
from pocket_agent.convert._merge import merge_lora, peft_lora_to_gguf
from pocket_agent.convert._mnn import (
    INSTALL_HINT,
    SUPPORTED_GGUF_ARCHITECTURES,
    SUPPORTED_MODEL_TYPES,
    add_convert_arguments,
    convert_to_mnn,
    main_convert,
    missing_convert_modules,
    read_chat_template_from_hf,
)
from pocket_agent.runtime._files import cache_root
from pocket_agent.runtime._hf_checkpoint import hf_checkpoint
from pocket_agent.runtime.gguf_meta import GGUFFormatError, is_gguf_file, read_gguf_metadata

__all__ = [
    "DEFAULT_MODEL_NAME",
    "INSTALL_HINT",
    "SUPPORTED_GGUF_ARCHITECTURES",
    "SUPPORTED_MODEL_TYPES",
    "GGUFFormatError",
    "add_convert_arguments",
    "cache_root",
    "convert_to_mnn",
    "default_gguf_path",
    "ensure_default_mnn",
    "hf_checkpoint",
    "is_gguf_file",
    "main_convert",
    "merge_lora",
    "missing_convert_modules",
    "peft_lora_to_gguf",
    "read_chat_template_from_hf",
    "read_gguf_metadata",
    "sha256_file",
]
