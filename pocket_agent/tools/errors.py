"""Errors specific to the agent loop."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import PocketAgentError

if TYPE_CHECKING:
    from .agent import Step


class AgentError(PocketAgentError):
    """The agent loop could not finish."""


class MaxStepsExceeded(AgentError):  # noqa: N818  (reads like OutputBudgetExceeded)
    """The model was still calling tools after ``max_steps`` turns.

    ``steps`` holds every step taken (tool calls, results, timings) and ``messages`` the
    conversation so far, so a caller can inspect it or continue it.
    """

    def __init__(self, message: str, *, steps: list[Step], messages: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.steps = steps
        self.messages = messages or []
