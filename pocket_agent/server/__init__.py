"""``pocket-agent serve``: an OpenAI-compatible local server whose ``response_format`` and
``tools`` are enforced by pocket_agent's grammars (extra ``server``).

```python
from openai import OpenAI
client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
inv = client.chat.completions.parse(model="local", messages=[...], response_format=Invoice)
inv = client.responses.parse(model="local", input="...", text_format=Invoice)  # the Responses API
```

Importing :mod:`pocket_agent` does not import this package, and importing this package
does not import FastAPI until :func:`create_app` or :func:`serve` is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .cli import add_serve_parser, serve

if TYPE_CHECKING:
    from .app import ServerConfig, create_app

__all__ = ["ServerConfig", "add_serve_parser", "create_app", "serve"]


def __getattr__(name: str) -> Any:
    if name in ("ServerConfig", "create_app"):
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
