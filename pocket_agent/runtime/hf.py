"""Hugging Face checkpoints (and GGUF files, converted once) through PyTorch transformers.

This backend is for training adapters and for models shipped as safetensors folders; on a
CPU it is several times slower than llama.cpp. torch and transformers come with the
``train`` extra and are imported only when a model is loaded here.

A GGUF file is converted to a float32 checkpoint with
:func:`pocket_agent.convert.hf_checkpoint` (cached); the model then reports the GGUF's
name, architecture and vocabulary exactly as the llama.cpp backend does, so adapters and
identities carry over between the two.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import (
    AdapterError,
    BackendError,
    BackendUnavailableError,
    ConversionError,
    ModelLoadError,
    ModelNotFoundError,
)
from ._cpu import default_threads
from ._hf_checkpoint import hf_checkpoint
from ._hf_lora import LoraWeights, read_gguf_lora
from ._hf_tokens import HFTokenizer
from .base import (
    Capabilities,
    EvalOutput,
    LayerStates,
    LoraAdapter,
    Model,
    ModelInfo,
    StatesRequest,
    common_prefix_length,
)
from .chat_template import ChatTemplate, chatml_template
from .gguf_meta import is_gguf_file

TRAIN_HINT = "pip install 'pocket-agent-mnn[train]'"
DEFAULT_N_CTX = 4096
DEFAULT_N_BATCH = 512
SOURCE_FILE = "pocket_agent_source.json"

# transformers model_type -> GGUF general.architecture, where the two names differ.
MODEL_TYPE_TO_GGUF_ARCH: dict[str, str] = {
    "qwen2_moe": "qwen2moe",
    "qwen3_moe": "qwen3moe",
    "gemma3_text": "gemma3",
    "gpt_oss": "gpt-oss",
}


def _torch() -> Any:
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as exc:
        raise BackendUnavailableError(f"The Transformers backend needs torch and transformers: {TRAIN_HINT}") from exc
    return torch


class _Stop(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised by a forward hook to end a forward pass after the block whose state is read."""

    def __init__(self, hidden: Any) -> None:
        super().__init__()
        self.hidden = hidden


class TransformersModel(Model):
    """A causal LM evaluated by PyTorch transformers on the CPU (float32).

    ``path`` is a Hugging Face checkpoint folder (``config.json``, ``*.safetensors``,
    ``tokenizer.json``) or a GGUF file, converted once into ``cache_dir`` (default
    ``$POCKET_AGENT_CACHE/hf`` or ``~/.cache/pocket_agent/hf``). LoRA adapters are GGUF
    LoRA files, applied as llama.cpp applies them. ``threads`` sets torch's thread count,
    which is process-wide. :attr:`hf_model` is the PyTorch module itself (for training).
    """

    backend = "transformers"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        n_ctx: int | None = None,
        threads: int | None = None,
        n_batch: int = DEFAULT_N_BATCH,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__()
        torch = _torch()
        self._torch = torch
        src = Path(path).expanduser()
        folder, gguf = _resolve_folder(src, cache_dir)
        config = _read_json_object(folder / "config.json")
        source = _read_json_object(folder / SOURCE_FILE) if (folder / SOURCE_FILE).is_file() else {}
        if not isinstance(config.get("model_type"), str):
            raise ModelLoadError(f"{folder / 'config.json'} is not a transformers config (it has no model_type).")
        threads = threads or default_threads()
        torch.set_num_threads(threads)
        self._hf = _load_transformers_model(folder)
        self._base = self._hf.get_decoder()
        self._layers = getattr(self._base, "layers", None)
        text_cfg = self._hf.config.get_text_config(decoder=True)
        self._n_layer = int(text_cfg.num_hidden_layers)
        self._n_embd = int(text_cfg.hidden_size)
        self._n_head = int(getattr(text_cfg, "num_attention_heads", 0) or 0)
        self._n_head_kv = int(getattr(text_cfg, "num_key_value_heads", 0) or self._n_head)
        self._n_batch = max(1, n_batch)

        self._tok = HFTokenizer(folder, int(getattr(text_cfg, "vocab_size", 0) or 0))
        self.vocab = self._tok.vocabulary(_eos_candidates(self._tok, folder, config))
        n_ctx_train = int(getattr(text_cfg, "max_position_embeddings", 0) or 0)
        if n_ctx is None:
            n_ctx = min(n_ctx_train, DEFAULT_N_CTX) if n_ctx_train > 0 else DEFAULT_N_CTX
        if n_ctx < 8:
            raise ModelLoadError(f"n_ctx must be at least 8, got {n_ctx}.")
        self._cache = self._new_cache()
        self._active: list[tuple[LoraWeights, float]] = []
        self._hooked: set[str] = set()
        self.capabilities = Capabilities(
            multi_sequence=False,
            hidden_states=True,
            lora=True,
            layer_states=self._n_layer > 1 and self._layers is not None,
        )
        model_type = str(config["model_type"])
        architecture = source.get("architecture") or MODEL_TYPE_TO_GGUF_ARCH.get(model_type, model_type)
        origin = gguf or folder
        # as llama.cpp names a GGUF: general.name, else the file name
        name = source.get("name") or (gguf.stem if gguf else folder.name)
        self._chat_template = self._read_chat_template(folder, source)
        self.info = ModelInfo(
            backend=self.backend,
            path=origin,
            name=str(name),
            architecture=str(architecture),
            n_vocab=self.vocab.size,
            n_ctx=n_ctx,
            n_ctx_train=n_ctx_train,
            n_embd=self._n_embd,
            file_size=gguf.stat().st_size if gguf else _weights_size(folder),
            chat_template_source=self._chat_template.source,
            extra={
                "threads": str(threads),
                "dtype": "float32",
                "model_type": model_type,
                "checkpoint": str(folder),
                "torch": str(torch.__version__),
            },
            n_layer=self._n_layer,
        )

    # -- metadata ----------------------------------------------------------------------

    def _read_chat_template(self, folder: Path, source: dict[str, Any]) -> ChatTemplate:
        v = self.vocab
        bos = v.token_bytes[v.bos_id].decode("utf-8", "replace") if v.bos_id is not None else ""
        eos = v.token_bytes[v.eos_ids[0]].decode("utf-8", "replace") if v.eos_ids else ""
        if isinstance(source.get("chat_template"), str):
            return ChatTemplate(
                source["chat_template"], source="gguf:tokenizer.chat_template", bos_token=bos, eos_token=eos
            )
        template = _hf_chat_template(folder)
        if template is not None:
            return ChatTemplate(template, source=f"{folder.name}:chat_template", bos_token=bos, eos_token=eos)
        return chatml_template(bos_token=bos)

    @property
    def chat_template(self) -> ChatTemplate:
        assert self._chat_template is not None
        return self._chat_template

    @property
    def hf_model(self) -> Any:
        """The underlying ``transformers`` model (``PreTrainedModel``), e.g. for training."""
        return self._hf

    # -- tokens ------------------------------------------------------------------------

    def tokenize(self, text: str | bytes, *, special: bool = False) -> list[int]:
        self._check_open()
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return self._tok.encode(data, special=special) if data else []

    # -- evaluation --------------------------------------------------------------------

    def _new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self._hf.config)

    def _forward(self, tokens: list[int], start: int, cache: Any) -> Any:
        """Run the decoder over ``tokens`` at positions ``start...``; return the final-norm states."""
        torch = self._torch
        ids = torch.tensor([tokens], dtype=torch.long)
        pos = torch.arange(start, start + len(tokens), dtype=torch.long).unsqueeze(0)
        out = self._base(input_ids=ids, position_ids=pos, cache=cache, use_cache=True)
        return out.last_hidden_state[0]

    def _logits(self, hidden: Any) -> np.ndarray:
        logits = self._hf.get_output_embeddings()(hidden)
        cap = getattr(self._hf.config.get_text_config(decoder=True), "final_logit_softcapping", None)
        if cap:
            logits = self._torch.tanh(logits / cap) * cap
        arr: np.ndarray = logits.float().numpy()
        n = self.vocab.size
        if arr.shape[1] > n:
            arr = arr[:, :n]
        elif arr.shape[1] < n:
            pad = np.full((arr.shape[0], n - arr.shape[1]), -np.inf, dtype=np.float32)
            arr = np.concatenate([arr, pad], axis=1)
        return np.ascontiguousarray(arr, dtype=np.float32)

    def _eval(self, tokens: list[int], positions: list[int], hidden: bool) -> EvalOutput:
        torch = self._torch
        start = len(self._cached)
        wanted = sorted(set(positions))
        rows: dict[int, Any] = {}
        try:
            with torch.inference_mode():
                for c0 in range(0, len(tokens), self._n_batch):
                    chunk = tokens[c0 : c0 + self._n_batch]
                    h = self._forward(chunk, start + c0, self._cache)
                    for p in wanted:
                        if c0 <= p < c0 + len(chunk):
                            rows[p] = h[p - c0]
                if positions:
                    stacked = torch.stack([rows[p] for p in positions])
                    logits = self._logits(stacked)
                    hid = stacked.float().numpy().astype(np.float32) if hidden else None
                else:
                    logits = np.zeros((0, self.vocab.size), dtype=np.float32)
                    hid = np.zeros((0, self._n_embd), dtype=np.float32) if hidden else None
        except BaseException as exc:
            # keep the cache equal to the tokens the base class records
            self._truncate(self._cache, start, self._cached[:start])
            if isinstance(exc, RuntimeError):
                raise BackendError(f"transformers failed to evaluate {len(tokens)} tokens: {exc}") from exc
            raise
        return EvalOutput(logits=logits, positions=list(positions), hidden=hid)

    def _truncate(self, cache: Any, n: int, tokens: list[int]) -> Any:
        """Make ``cache`` hold its first ``n`` positions (``tokens`` are those positions)."""
        from transformers.cache_utils import DynamicLayer

        layers = getattr(cache, "layers", None)
        if layers is not None and all(type(layer) is DynamicLayer for layer in layers):
            for layer in layers:
                if layer.is_initialized and layer.keys.shape[-2] > n:
                    layer.keys = layer.keys[..., :n, :]
                    layer.values = layer.values[..., :n, :]
            return cache
        # Sliding-window or other layer kinds cannot be cut back: rebuild from the tokens.
        fresh = self._new_cache()
        if n:
            with self._torch.inference_mode():
                for c0 in range(0, n, self._n_batch):
                    self._forward(tokens[c0 : c0 + self._n_batch], c0, fresh)
        if cache is self._cache:
            self._cache = fresh
        return fresh

    def _rollback(self, n: int) -> None:
        self._truncate(self._cache, n, self._cached[:n])

    def _reset(self) -> None:
        self._cache = self._new_cache()

    # -- inner layers ------------------------------------------------------------------

    def _block_states(self, tokens: list[int], start: int, cache: Any, layer: int) -> Any:
        """Outputs of block ``layer`` for ``tokens``; later blocks are not computed."""
        assert self._layers is not None

        def stop(_module: Any, _args: Any, output: Any) -> None:
            raise _Stop(output[0] if isinstance(output, tuple) else output)

        handle = self._layers[layer].register_forward_hook(stop)
        try:
            self._forward(tokens, start, cache)
        except _Stop as s:
            return s.hidden[0]
        finally:
            handle.remove()
        raise BackendError("The forward pass ended before the requested layer.")  # pragma: no cover

    def _layer_states(
        self, requests: list[StatesRequest], layer: int, loras: list[tuple[LoraAdapter, float]]
    ) -> list[LayerStates]:
        torch = self._torch
        saved = self._active
        self._active = [(a.handle, s) for a, s in loras if isinstance(a.handle, LoraWeights)]
        for weights, _ in self._active:
            self._hook(weights)
        cache = self._new_cache()
        ids: list[int] = []
        states: list[Any] = []
        results: list[LayerStates] = []
        try:
            with torch.inference_mode():
                for req in requests:
                    keep = common_prefix_length(ids, req.prefix)
                    cache = self._truncate(cache, keep, ids[:keep])
                    del ids[keep:], states[keep:]
                    if keep < len(req.prefix):
                        h = self._block_states(req.prefix[keep:], keep, cache, layer)
                        ids.extend(req.prefix[keep:])
                        states.extend(h)
                    base = len(ids)
                    prefix = _rows(torch, [states[p] for p in req.prefix_positions], self._n_embd)
                    branches = []
                    for br in req.branches:
                        branches.append(_rows(torch, list(self._block_states(br, base, cache, layer)), self._n_embd))
                        cache = self._truncate(cache, base, ids)
                    results.append(LayerStates(prefix=prefix, branches=branches))
        finally:
            self._active = saved
        return results

    # -- LoRA --------------------------------------------------------------------------

    def _linear(self, qualified: str) -> Any:
        if self._layers is None:
            return None
        blk, _, rest = qualified.partition(".")
        if not blk.isdigit() or int(blk) >= len(self._layers):
            return None
        mod = self._layers[int(blk)]
        for part in rest.split("."):
            mod = getattr(mod, part, None)
            if mod is None:
                return None
        return mod if isinstance(mod, self._torch.nn.Linear) else None

    def _hook(self, weights: LoraWeights) -> None:
        """Install (once per module) the forward hook that adds the active adapters' deltas."""
        for name in weights.factors:
            if name in self._hooked:
                continue
            linear = self._linear(name)
            linear.register_forward_hook(self._make_hook(name))
            self._hooked.add(name)

    def _make_hook(self, name: str) -> Any:
        def hook(_module: Any, args: Any, output: Any) -> Any:
            for weights, scale in self._active:
                factors = weights.factors.get(name)
                if factors is None or scale == 0.0:
                    continue
                a, b, factor = factors
                output = output + (scale * factor) * ((args[0] @ a.T) @ b.T)
            return output

        return hook

    def _load_lora(self, path: Path) -> object:
        weights = read_gguf_lora(
            path,
            architecture=self.info.architecture,
            n_head=self._n_head,
            n_head_kv=self._n_head_kv,
            module=self._linear,
        )
        self._hook(weights)
        return weights

    def _apply_loras(self) -> None:
        active = []
        for adapter in self._loras:
            if not isinstance(adapter.handle, LoraWeights):
                raise AdapterError("That adapter was not loaded by the Transformers backend.")
            if adapter.scale != 0.0:  # switched off: out of the forward pass
                active.append((adapter.handle, float(adapter.scale)))
        self._active = active
        # the KV cache is forgotten before the next evaluation if its weights differ (base)

    # -- lifecycle ---------------------------------------------------------------------

    def _close(self) -> None:
        self._loras.clear()
        self._open_loras.clear()
        self._active = []
        self._cache = None
        self._hf = None
        self._base = None
        self._layers = None


def _rows(torch: Any, rows: list[Any], n_embd: int) -> np.ndarray:
    if not rows:
        return np.zeros((0, n_embd), dtype=np.float32)
    return np.ascontiguousarray(torch.stack(rows).float().numpy(), dtype=np.float32)


def _resolve_folder(src: Path, cache_dir: str | os.PathLike[str] | None) -> tuple[Path, Path | None]:
    """The checkpoint folder for ``src`` and, for a GGUF source, the GGUF file."""
    if not src.exists():
        raise ModelNotFoundError(f"Model not found: {src}")
    if src.is_file() and is_gguf_file(src):
        try:
            return hf_checkpoint(src, cache_dir=None if cache_dir is None else Path(cache_dir)), src
        except ConversionError as exc:
            raise ModelLoadError(f"The Transformers backend cannot load {src}: {exc}") from exc
    folder = src.parent if src.is_file() and src.name == "config.json" else src
    if not folder.is_dir() or not (folder / "config.json").is_file():
        raise ModelNotFoundError(
            f"{src} is not a Hugging Face checkpoint: expected a folder with config.json, *.safetensors and "
            f"tokenizer.json, or a .gguf file."
        )
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("pytorch_model*.bin")):
        raise ModelNotFoundError(f"{folder} holds no weights (*.safetensors or pytorch_model*.bin).")
    return folder, None


def _load_transformers_model(folder: Path) -> Any:
    torch = _torch()
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # a library load prints no bar
    try:
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, local_files_only=True)
    except (ValueError, KeyError, OSError) as exc:
        raise ModelLoadError(
            f"transformers cannot build a causal LM from {folder}: {exc}. Check that config.json's model_type "
            f"is one your transformers version knows and that the weights are complete."
        ) from exc
    finally:
        if bars:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]
    model.eval()  # type: ignore[no-untyped-call]
    return model


def _hf_chat_template(folder: Path) -> str | None:
    """``chat_template.jinja``, else ``tokenizer_config.json``'s ``chat_template`` (a string, or
    the ``default`` of a list of named templates)."""
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    cfg_file = folder / "tokenizer_config.json"
    if not cfg_file.is_file():
        return None
    template = _read_json_object(cfg_file).get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default", next(iter(named.values()), None))
    return template if isinstance(template, str) else None


def _read_json_object(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} does not hold a JSON object.")
    return data


def _eos_candidates(tok: HFTokenizer, folder: Path, config: dict[str, Any]) -> list[int]:
    """EOS ids in order of authority: the tokenizer's eos_token, generation_config, config."""
    out: list[int] = []
    first = tok.token_id(tok.special_text("eos_token"))
    if first is not None:
        out.append(first)
    gen = folder / "generation_config.json"
    sources = [_read_json_object(gen) if gen.is_file() else {}, config]
    for src in sources:
        value = src.get("eos_token_id")
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, int) and v not in out:
                out.append(v)
    return out


def _weights_size(folder: Path) -> int:
    files = [*folder.glob("*.safetensors"), *folder.glob("pytorch_model*.bin")]
    return sum(f.stat().st_size for f in files)
