"""Adapters trained on a CPU (extra ``train``: torch, transformers).

- :func:`train_decide_adapter`: the Dec adapter (a LoRA and a pointer head, trained
  together) for ``decide``; ``pocket-agent tune decide DATA.jsonl -o OUT.zip``.
- :func:`train_extract_adapter`: a LoRA that teaches ``extract`` one schema from
  ``{text, output}`` examples; ``pocket-agent tune extract DATA.jsonl --schema S -o OUT.gguf``.
- :func:`train_tools_adapter`: a LoRA that teaches an ``Agent`` its turns (tool calls or a
  final answer) from ``{messages, tools, output}`` examples;
  ``pocket-agent tune tools DATA.jsonl -o OUT.gguf``.

Training runs on the model's Hugging Face checkpoint (converted once from the GGUF when
none is given) and exports GGUF LoRA files that llama.cpp applies at run time.
The names below need torch and are imported on first use, so ``pocket-agent --help``
works without the extra.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._sft import SftTraining
    from .decide import DecideResult, DecideTraining, train_decide_adapter
    from .extract import AdapterResult, train_extract_adapter
    from .tools import train_tools_adapter

_WHERE = {
    "SftTraining": "._sft",
    "DecideResult": ".decide",
    "DecideTraining": ".decide",
    "train_decide_adapter": ".decide",
    "AdapterResult": ".extract",
    "train_extract_adapter": ".extract",
    "train_tools_adapter": ".tools",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'pocket_agent.training' has no attribute {name!r}")
    return getattr(importlib.import_module(where, __name__), name)


__all__ = [
    "AdapterResult",
    "DecideResult",
    "DecideTraining",
    "SftTraining",
    "train_decide_adapter",
    "train_extract_adapter",
    "train_tools_adapter",
]
