"""pocket_agent: reliable structured work from tiny on-device language models.

Importing this package loads no model, opens no network connection and installs nothing;
models load on first use.
"""

from ._version import __version__
from .decision import Decision, decide, decide_many, load_decision_adapter, train_head
from .errors import (
    AdapterError,
    AgentError,
    ContextOverflowError,
    ExtractionError,
    GenerationError,
    InvalidInputError,
    MaxStepsExceeded,
    ModelError,
    ModelLoadError,
    ModelNotFoundError,
    OutputBudgetExceeded,
    PocketAgentError,
    SchemaError,
    ToolArgumentError,
    ToolError,
    ToolsFailedError,
    UnsupportedSchemaError,
)
from .extraction import ExtractOutcome, extract, extract_many, extract_stream
from .generate import GenerationResult, generate
from .grammars import Choice, Lark, Regex
from .options import Limits, Sampling
from .runtime import Model, get_default_model, load_model, set_default_model
from .tools import Agent, RunResult, Step, Tool, ToolCall, ToolResult, tool
from .usage import Usage

__all__ = [
    "AdapterError",
    "Agent",
    "AgentError",
    "Choice",
    "ContextOverflowError",
    "Decision",
    "ExtractOutcome",
    "ExtractionError",
    "GenerationError",
    "GenerationResult",
    "InvalidInputError",
    "Lark",
    "Limits",
    "MaxStepsExceeded",
    "Model",
    "ModelError",
    "ModelLoadError",
    "ModelNotFoundError",
    "OutputBudgetExceeded",
    "PocketAgentError",
    "Regex",
    "RunResult",
    "Sampling",
    "SchemaError",
    "Step",
    "Tool",
    "ToolArgumentError",
    "ToolCall",
    "ToolError",
    "ToolResult",
    "ToolsFailedError",
    "UnsupportedSchemaError",
    "Usage",
    "__version__",
    "decide",
    "decide_many",
    "extract",
    "extract_many",
    "extract_stream",
    "generate",
    "get_default_model",
    "load_decision_adapter",
    "load_model",
    "set_default_model",
    "tool",
    "train_head",
]
