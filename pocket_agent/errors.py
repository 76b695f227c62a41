"""Every error pocket_agent raises on purpose, in one module.

``except PocketAgentError`` catches all of them; each message says what went wrong and what
to change. Every error pickles and unpickles equal (type, message and attributes), so it can
leave a worker process (multiprocessing, Ray, Dask).

Hierarchy::

    PocketAgentError
    ├── ModelError                    a model could not be found, read or used
    │   ├── ModelNotFoundError        (also FileNotFoundError)
    │   ├── ModelLoadError
    │   ├── BackendUnavailableError   (also ImportError)
    │   ├── ModelStateError
    │   ├── TokenError                (also ValueError)
    │   ├── ContextOverflowError      .needed, .n_ctx
    │   ├── BackendError
    │   └── AdapterError
    ├── ConversionError
    ├── SchemaError                   (also ValueError)
    │   └── UnsupportedSchemaError    .feature, .path
    ├── GenerationError
    │   ├── OutputBudgetExceeded      .partial, .tokens
    │   ├── ConstraintError           .detail
    │   │   └── TokenRejectedError    .token, .position
    │   └── ExtractionError           .last_output, .errors
    ├── ToolError
    │   └── ToolArgumentError         (also ValueError)
    ├── AgentError
    │   ├── MaxStepsExceeded          .steps, .messages
    │   └── ToolsFailedError          .steps, .messages
    └── InvalidInputError             (also ValueError)
"""

from __future__ import annotations

from typing import Any


def _restore(cls: type[PocketAgentError], args: tuple[Any, ...], state: dict[str, Any]) -> PocketAgentError:
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err


class PocketAgentError(Exception):
    """Base class of every error pocket_agent raises on purpose."""

    def __reduce__(self) -> tuple[Any, ...]:
        # The default reduction calls cls(*args), which fails for errors whose constructors
        # take keyword-only attributes; rebuild from the message and the attributes instead.
        return (_restore, (type(self), self.args, dict(self.__dict__)))

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.args == other.args and self.__dict__ == other.__dict__  # type: ignore[union-attr]

    def __hash__(self) -> int:
        return hash((type(self), self.args))


# --- models and runtimes -------------------------------------------------------------


class ModelError(PocketAgentError):
    """A model could not be found, read or used."""


class ModelNotFoundError(ModelError, FileNotFoundError):
    """The model path does not exist, or a folder holds no model build."""


class ModelLoadError(ModelError):
    """The model file exists but the backend could not load it (corrupt, wrong format)."""


class BackendUnavailableError(ModelError, ImportError):
    """The backend's Python package (llama-cpp-python or MNN) is not installed."""


class ModelStateError(ModelError):
    """The model was used in a state that does not allow it (closed, not loaded, ...)."""


class TokenError(ModelError, ValueError):
    """Token ids that the model cannot evaluate: empty list, out of vocabulary range."""


class ContextOverflowError(ModelError):
    """The tokens do not fit in the model's context window."""

    def __init__(self, message: str, *, needed: int, n_ctx: int) -> None:
        super().__init__(message)
        self.needed = needed
        self.n_ctx = n_ctx


class BackendError(ModelError):
    """The native backend reported a failure (decode error, adapter rejected, ...)."""


class AdapterError(ModelError):
    """A LoRA or decision adapter could not be loaded or does not fit the model."""


class ConversionError(PocketAgentError):
    """Converting a model between formats failed."""


# --- grammars and generation ---------------------------------------------------------


class SchemaError(PocketAgentError, ValueError):
    """The output type (schema, regex, grammar) is invalid."""


class UnsupportedSchemaError(SchemaError):
    """The schema uses a feature the grammar engine cannot enforce.

    ``feature`` names the feature and ``path`` is the JSON path where it appears.
    """

    def __init__(self, message: str, *, feature: str | None = None, path: str | None = None) -> None:
        super().__init__(message)
        self.feature = feature
        self.path = path


class GenerationError(PocketAgentError):
    """Generation could not produce a complete, valid output."""


class OutputBudgetExceeded(GenerationError):  # noqa: N818 - reads as the event it reports
    """``max_tokens`` ran out before the output was complete; ``partial`` holds the text so far."""

    def __init__(self, message: str, *, partial: str, tokens: int) -> None:
        super().__init__(message)
        self.partial = partial
        self.tokens = tokens


class ConstraintError(GenerationError):
    """The grammar matcher cannot go on (resource limit hit, internal error, misuse).

    ``detail`` holds the grammar engine's error text.
    """

    def __init__(self, message: str, *, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


class TokenRejectedError(ConstraintError):
    """A token was fed to the matcher that the grammar does not allow at that point.

    ``token`` is the rejected id, ``position`` how many tokens the matcher had consumed
    before it; the matcher itself is left unchanged (still usable).
    """

    def __init__(self, message: str, *, token: int, position: int, detail: str = "") -> None:
        super().__init__(message, detail=detail)
        self.token = token
        self.position = position


class ExtractionError(GenerationError):
    """The model's output parsed but failed validation after every retry."""

    def __init__(self, message: str, *, last_output: Any = None, errors: Any = None) -> None:
        super().__init__(message)
        self.last_output = last_output
        self.errors = errors


# --- tools ----------------------------------------------------------------------------


class ToolError(PocketAgentError):
    """A tool failed while running."""


class ToolArgumentError(ToolError, ValueError):
    """Arguments for a tool call do not match the tool's schema."""


# --- the agent loop --------------------------------------------------------------------


class AgentError(PocketAgentError):
    """The agent loop could not finish."""


class MaxStepsExceeded(AgentError):  # noqa: N818 - reads like OutputBudgetExceeded
    """The model was still calling tools after ``max_steps`` turns.

    ``steps`` holds every :class:`~pocket_agent.Step` taken (tool calls, results, usage) and
    ``messages`` the conversation so far, so a caller can inspect it or continue it.
    """

    def __init__(self, message: str, *, steps: list[Any], messages: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.steps = steps
        self.messages = messages or []


class ToolsFailedError(AgentError):
    """The agent's tools failed again after a retry, and the agent has an ``output`` type, so
    no answer object can be given (an agent answering in text says so in ``final`` instead).

    ``steps`` and ``messages`` hold the run; each failed call's error is on its step's results.
    """

    def __init__(self, message: str, *, steps: list[Any], messages: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.steps = steps
        self.messages = messages or []


# --- arguments --------------------------------------------------------------------------


class InvalidInputError(PocketAgentError, ValueError):
    """An argument given to a public function is invalid (wrong type, empty, ...)."""


__all__ = [
    "AdapterError",
    "AgentError",
    "BackendError",
    "BackendUnavailableError",
    "ConstraintError",
    "ContextOverflowError",
    "ConversionError",
    "ExtractionError",
    "GenerationError",
    "InvalidInputError",
    "MaxStepsExceeded",
    "ModelError",
    "ModelLoadError",
    "ModelNotFoundError",
    "ModelStateError",
    "OutputBudgetExceeded",
    "PocketAgentError",
    "SchemaError",
    "TokenError",
    "TokenRejectedError",
    "ToolArgumentError",
    "ToolError",
    "ToolsFailedError",
    "UnsupportedSchemaError",
]
