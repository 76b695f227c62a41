"""Training state on disk, so that an interrupted training picks up where it stopped."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ..errors import InvalidInputError

STATE_FILE = "state.pt"


def config_key(settings: dict[str, Any], data: Any) -> str:
    """What must be equal for a saved state to be resumed: the settings and the data."""
    text = json.dumps(settings, sort_keys=True, default=str) + json.dumps(data, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def load_state(folder: Path | None, key: str) -> dict[str, Any] | None:
    """The state saved in ``folder`` by the same training, or None when there is none."""
    if folder is None or not (folder / STATE_FILE).is_file():
        return None
    import torch

    state: dict[str, Any] = torch.load(folder / STATE_FILE, weights_only=False)
    if state.get("config") != key:
        raise InvalidInputError(
            f"{folder} holds the state of a different training (other data or settings); "
            "use another folder or delete it to start over."
        )
    return state


def save_state(folder: Path | None, state: dict[str, Any]) -> None:
    """Write ``state`` atomically (a crash mid-write leaves the previous state)."""
    if folder is None:
        return
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (STATE_FILE + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, folder / STATE_FILE)
