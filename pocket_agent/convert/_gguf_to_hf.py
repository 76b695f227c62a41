"""Rebuild a plain transformers checkpoint from a GGUF file.

Run as a script in a subprocess by :func:`pocket_agent.convert.convert_to_mnn` and
:func:`pocket_agent.convert.hf_checkpoint`::

    python _gguf_to_hf.py MODEL.gguf OUT_DIR

It imports torch and transformers, so it is never imported by the library itself.
Exit status 3 means the GGUF's architecture cannot be converted; any other non-zero
status is a failure whose reason is on stderr.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

EXIT_UNSUPPORTED = 3


def _read_gguf_meta(path: Path) -> dict[str, Any]:
    """Read the few GGUF metadata keys this step needs, without the tensors."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    meta: dict[str, Any] = {}
    arch = reader.get_field("general.architecture")
    prefix = str(arch.contents()) if arch is not None else ""
    keys = ["general.architecture", "tokenizer.chat_template", "general.name", f"{prefix}.attention.key_length"]
    for key in keys:
        field = reader.get_field(key)
        if field is not None:
            meta[key] = field.contents()
    return meta


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: _gguf_to_hf.py MODEL.gguf OUT_DIR", file=sys.stderr)
        return 2
    gguf_path = Path(argv[0]).resolve()
    out_dir = Path(argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    meta = _read_gguf_meta(gguf_path)
    arch = str(meta.get("general.architecture", ""))
    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        print(
            f"GGUF architecture {arch!r} cannot be read by transformers "
            f"(supported: {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))})",
            file=sys.stderr,
        )
        return EXIT_UNSUPPORTED

    folder, name = str(gguf_path.parent), gguf_path.name
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    # transformers maps no GGUF key to head_dim for some architectures (qwen2, qwen3) and
    # falls back to the config class default (128): take it from attention.key_length.
    key_length = meta.get(f"{arch}.attention.key_length")
    if isinstance(key_length, int) and getattr(config, "head_dim", key_length) != key_length:
        config.head_dim = key_length
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # from_pretrained dequantises the GGUF tensors; save_pretrained refuses a model that
    # carries gguf quantisation metadata, so copy its weights into a plain model.
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, config=config, dtype=torch.float32)
    state = loaded.state_dict()
    del loaded
    config.dtype = torch.float32
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    missing, unexpected = plain.load_state_dict(state, strict=False)
    # Tied output weights may be reported as missing; anything else is a real mismatch.
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        print(f"state dict mismatch: missing={missing} unexpected={unexpected}", file=sys.stderr)
        return 1
    if config.tie_word_embeddings:
        plain.tie_weights()
    plain.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))

    template = meta.get("tokenizer.chat_template")
    info = {
        "architecture": arch,
        "model_type": config.model_type,
        "name": meta.get("general.name") if isinstance(meta.get("general.name"), str) else None,
        "chat_template": template if isinstance(template, str) else None,
    }
    with open(os.path.join(out_dir, "pocket_agent_source.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, ensure_ascii=False, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
