"""pocket_agent: reliable structured work from tiny on-device language models.

Importing this package loads no model, opens no network connection and installs nothing;
models load on first use.
"""

from .decision import Decision, decide, decide_many, train_head
from .errors import (
    AdapterError,
    ContextOverflowError,
    ExtractionError,
    GenerationError,
    InvalidInputError,
    ModelError,
    ModelLoadError,
    ModelNotFoundError,
    OutputBudgetExceeded,
    PocketAgentError,
    SchemaError,
    ToolArgumentError,
    ToolError,
    UnsupportedSchemaError,
)
from .extraction import ExtractOutcome, extract, extract_many, extract_stream
from .generate import GenerationResult, SamplingParams, generate
from .runtime import Model, get_default_model, load_model, set_default_model
from .tools import Agent, MaxStepsExceeded, RunResult, Step, Tool, ToolCall, tool

__version__ = "0.1.0"

__all__ = [
    "AdapterError",
    "Agent",
    "ContextOverflowError",
    "Decision",
    "ExtractOutcome",
    "ExtractionError",
    "GenerationError",
    "GenerationResult",
    "InvalidInputError",
    "MaxStepsExceeded",
    "Model",
    "ModelError",
    "ModelLoadError",
    "ModelNotFoundError",
    "OutputBudgetExceeded",
    "PocketAgentError",
    "RunResult",
    "SamplingParams",
    "SchemaError",
    "Step",
    "Tool",
    "ToolArgumentError",
    "ToolCall",
    "ToolError",
    "UnsupportedSchemaError",
    "__version__",
    "decide",
    "decide_many",
    "extract",
    "extract_many",
    "extract_stream",
    "generate",
    "get_default_model",
    "load_model",
    "set_default_model",
    "tool",
    "train_head",
]
