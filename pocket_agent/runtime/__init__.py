"""Runtime layer: one model protocol, three backends (llama.cpp for GGUF, MNN for MNN builds,
transformers for Hugging Face checkpoints and training).

Nothing outside this package imports ``llama_cpp``, ``MNN`` or ``torch``; backends are
imported only when a model of their kind is loaded.
"""

from .base import (
    Capabilities,
    EvalOutput,
    EvalStats,
    LayerStates,
    LoraAdapter,
    Model,
    ModelInfo,
    StatesRequest,
    StreamDecoder,
    Vocabulary,
    common_prefix_length,
)
from .branches import branch_logits, branches_reliable
from .chat_template import ChatTemplate, chatml_template
from .default_model import default_model_path
from .loader import (
    detect_backend,
    get_default_model,
    load_model,
    resolve_model,
    resolve_source,
    set_default_model,
)
from .scripted import ScriptedModel

__all__ = [
    "Capabilities",
    "ChatTemplate",
    "EvalOutput",
    "EvalStats",
    "LayerStates",
    "LoraAdapter",
    "Model",
    "ModelInfo",
    "ScriptedModel",
    "StatesRequest",
    "StreamDecoder",
    "Vocabulary",
    "branch_logits",
    "branches_reliable",
    "chatml_template",
    "common_prefix_length",
    "default_model_path",
    "detect_backend",
    "get_default_model",
    "load_model",
    "resolve_model",
    "resolve_source",
    "set_default_model",
]
