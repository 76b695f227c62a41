"""GGUF models through llama-cpp-python's low-level API.

The high-level ``llama_cpp.Llama`` hides what the layers above need (several sequences
in one decode, KV-cache rollback, per-position hidden states), so this module drives
``llama_decode`` directly with one persistent context (whose KV cache grows with use:
:mod:`._llamacpp_eval`).
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import AdapterError, BackendError, ModelLoadError, ModelStateError
from ._cpu import cpu_flags, decide_extra_buffers, default_threads, extra_buffers_setting, note_decision
from ._cpu_load import cpu_load
from ._llamacpp_backend import (
    GGUF_MAGIC,
    check_gguf_file,
    ensure_backend,
    quantize_gguf,
    read_vocab,
    recent_errors,
    recent_log,
    stack_rows,
    system_info,
    token_text,
)
from ._llamacpp_context import context_params
from ._llamacpp_eval import FIRST_CELLS, EvalContext
from ._llamacpp_lanes import LANE_CTX, LaneContext
from ._llamacpp_states import StateReader
from .base import (
    Capabilities,
    EvalOutput,
    LayerStates,
    LogitsSelection,
    LoraAdapter,
    Model,
    ModelInfo,
    StatesRequest,
    common_prefix_length,
)
from .chat_template import ChatTemplate, chatml_template

logger = logging.getLogger("pocket_agent.llamacpp")

__all__ = ["GGUF_MAGIC", "LlamaCppModel", "quantize_gguf", "system_info"]

DEFAULT_N_CTX = 4096
DEFAULT_N_BATCH = 512
DEFAULT_N_SEQ = 8


class LlamaCppModel(Model):
    """A GGUF model evaluated by llama.cpp on the CPU.

    ``n_seq`` sequences share one unified KV cache of up to ``n_ctx`` cells (grown with use):
    sequence 0 is the main cache, the others hold branches for :meth:`eval_branches`.

    ``generation_weights``: a second GGUF of the same model (same architecture and
    vocabulary; ``layout="split"`` passes its Q8_0 copy) on which generation runs: prompts
    (``prefill``) are evaluated on ``path``'s weights, their keys and values move to a
    second context on these weights, and every later evaluation (sampled and forced
    tokens, branches) runs there. A one-token step reads every weight once, so fewer
    bytes per weight make it faster, while a prompt is bound by arithmetic, where BF16 is
    fastest on CPUs with AVX512-BF16 (:mod:`pocket_agent.runtime.layout`). Prompts are
    then evaluated with flash attention, 1.2x faster on a 500-token prompt and, for
    batches of two or more tokens, the same logits on any thread count; generation keeps
    ``flash_attn``. LoRA adapters cannot be applied at run time to such a model (merge
    them: ``merge_adapter``). ``generation_weights`` naming ``path`` itself keeps one set of
    weights with two contexts: prompts with flash attention, generation without (LoRAs
    then apply to both).
    """

    backend = "llamacpp"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        n_ctx: int | None = None,
        threads: int | None = None,
        n_batch: int = DEFAULT_N_BATCH,
        n_seq: int = DEFAULT_N_SEQ,
        flash_attn: bool = False,
        extra_buffers: bool | None = None,
        adaptive_threads: bool = True,
        generation_weights: str | os.PathLike[str] | None = None,
    ) -> None:
        """Load ``path``.

        ``threads`` is a ceiling: with ``adaptive_threads`` (the default) each evaluation
        size (one token, a short run, a prompt) runs on ``threads`` unless 1 thread has
        measured clearly faster lately (:mod:`pocket_agent.runtime._threads`); the
        outputs are the same either way. ``adaptive_threads=False`` always uses ``threads``,
        and so does ``flash_attn=True`` (its one-token logits change with the thread count).

        ``extra_buffers``: let llama.cpp put weights in its extra buffer types (AMX,
        repacked layouts). ``None`` (the default) decides from the CPU: off where llama.cpp
        would use Intel AMX, whose buffer crashes the process on the first prompt; the
        environment variable ``POCKET_AGENT_EXTRA_BUFFERS`` (``1``/``0``/``auto``) sets it
        for every load.

        ``generation_weights``: a second GGUF of the same model on which generation runs in a
        context of its own (see the class doc).
        """
        super().__init__()
        p = Path(path)
        check_gguf_file(p)
        cpu_load().mark()  # the first evaluation asks what else ran while the model loaded
        lc = ensure_backend()
        self._lc = lc
        self._model: Any = None
        self._main: EvalContext | None = None
        self._gen: EvalContext | None = None  # where generation runs: _main, or a context on the generation weights
        self._gen_model: Any = None
        self._main_tokens: list[int] = []  # what _main holds when generation runs elsewhere
        self._prompting = False
        self._states: StateReader | None = None
        self._lanes: LaneContext | None = None

        buffers = decide_extra_buffers(system_info(), cpu_flags(), extra_buffers_setting(extra_buffers))
        note_decision(buffers)
        mparams = lc.llama_model_default_params()
        mparams.n_gpu_layers = 0
        mparams.use_extra_bufts = buffers.use_extra_buffers
        self._model = model = self._load_weights(p, mparams)
        self._vocab_ptr = lc.llama_model_get_vocab(model)
        n_ctx_train = int(lc.llama_model_n_ctx_train(model))
        if n_ctx is None:
            n_ctx = min(n_ctx_train, DEFAULT_N_CTX) if n_ctx_train > 0 else DEFAULT_N_CTX
        if n_ctx < 8:
            raise ModelLoadError(f"n_ctx must be at least 8, got {n_ctx}.")
        threads = threads or default_threads()
        self._n_batch = max(1, min(n_batch, n_ctx))
        self._n_seq = max(1, n_seq)

        self._flash_attn = flash_attn
        # Flash attention splits a one-token step's keys across threads, so its logits depend
        # on the thread count (by up to ~0.8 measured): the count stays fixed there.
        self._adaptive_threads = adaptive_threads and not flash_attn
        self._threads = threads
        self._n_vocab_logits = int(lc.llama_vocab_n_tokens(self._vocab_ptr))
        self._n_embd = int(lc.llama_model_n_embd(model))
        self._n_layer = int(lc.llama_model_n_layer(model))
        self._open_contexts(p, n_ctx, mparams, generation_weights)
        self.vocab = read_vocab(lc, self._vocab_ptr)
        self.capabilities = Capabilities(
            multi_sequence=self._n_seq > 1, hidden_states=True, lora=True, layer_states=self._n_layer > 1
        )
        self.info = self._describe(p, n_ctx, n_ctx_train, buffers.reason)
        tmpl = self._read_chat_template()
        self._chat_template = tmpl
        self.info = ModelInfo(**{**self.info.__dict__, "chat_template_source": tmpl.source})

    def _load_weights(self, p: Path, mparams: Any) -> Any:
        """The llama.cpp model of the GGUF at ``p`` (its weights memory-mapped)."""
        recent_log.clear()
        model = self._lc.llama_model_load_from_file(str(p).encode("utf-8"), mparams)
        if not model:
            raise ModelLoadError(
                f"llama.cpp could not load {p}: the file is not a valid GGUF model "
                f"(corrupt, truncated or an unsupported architecture). llama.cpp said: {recent_errors()}"
            )
        return model

    def _open_contexts(
        self, p: Path, n_ctx: int, mparams: Any, generation_weights: str | os.PathLike[str] | None
    ) -> None:
        """The main context, and where generation runs in a context of its own, that one."""
        try:
            # split weights evaluate prompts with flash attention (see generation_weights)
            self._main = self._context(self._model, n_ctx, self._flash_attn or generation_weights is not None)
            self._gen = self._main
            if generation_weights is not None and Path(generation_weights).resolve() == p.resolve():
                self._gen = self._context(self._model, n_ctx, self._flash_attn)  # same weights, another context
            elif generation_weights is not None:
                self._gen = self._generation_context(Path(generation_weights), mparams, n_ctx)
        except BackendError as exc:
            self._close()
            raise ModelLoadError(f"llama.cpp could not create a context for {p}: {exc}") from exc
        except Exception:
            self._close()
            raise

    def _describe(self, p: Path, n_ctx: int, n_ctx_train: int, buffers: str) -> ModelInfo:
        """The model's :class:`ModelInfo` (its chat template filled in afterwards)."""
        main = self._main
        assert main is not None
        threads = self._threads
        return ModelInfo(
            backend=self.backend,
            path=p,
            name=self.metadata("general.name") or p.stem,
            architecture=self.metadata("general.architecture") or "unknown",
            n_vocab=self.vocab.size,
            n_ctx=n_ctx,
            n_ctx_train=n_ctx_train,
            n_embd=self._n_embd,
            file_size=p.stat().st_size,
            chat_template_source="",
            extra={
                "threads": f"{threads} (adaptive)" if self._adaptive_threads else str(threads),
                "quantization": self._file_type(),
                "extra buffers": buffers,
                "kv cache": f"{main.capacity} of {n_ctx} cells allocated, grown as prompts need more"
                + (f" ({self._kv_cell_bytes() / 1024:.0f} KB per cell)" if self._kv_cell_bytes() else ""),
            },
            n_layer=self._n_layer,
        )

    def _kv_cell_bytes(self) -> int:
        """Bytes one KV cell takes (keys and values, F16, every layer), from the metadata; 0 if unknown."""
        arch = self.metadata("general.architecture") or ""
        try:
            heads = int(self.metadata(f"{arch}.attention.head_count") or 0)
            kv_heads = int(self.metadata(f"{arch}.attention.head_count_kv") or heads)
        except ValueError:
            return 0
        return 2 * 2 * self._n_layer * kv_heads * (self._n_embd // heads) if heads else 0

    # -- metadata ----------------------------------------------------------------------

    def metadata(self, key: str) -> str | None:
        """A GGUF metadata value as text, or None when the key is absent."""
        lc = self._lc
        size = 256
        while True:
            buf = ctypes.create_string_buffer(size)
            n = lc.llama_model_meta_val_str(self._model, key.encode("utf-8"), buf, size)
            if n < 0:
                return None
            if n < size:
                return buf.value.decode("utf-8", errors="replace")
            size = n + 1

    def _file_type(self) -> str:
        buf = ctypes.create_string_buffer(256)
        self._lc.llama_model_desc(self._model, buf, 256)
        return buf.value.decode("utf-8", errors="replace")

    def _read_chat_template(self) -> ChatTemplate:
        raw = self.metadata("tokenizer.chat_template")
        bos = token_text(self.vocab, self.vocab.bos_id)
        eos = token_text(self.vocab, self.vocab.eos_ids[0] if self.vocab.eos_ids else None)
        if raw:
            return ChatTemplate(raw, source="gguf:tokenizer.chat_template", bos_token=bos, eos_token=eos)
        return chatml_template(bos_token=bos)

    @property
    def chat_template(self) -> ChatTemplate:
        assert self._chat_template is not None
        return self._chat_template

    # -- tokens --------------------------------------------------------------------------

    def tokenize(self, text: str | bytes, *, special: bool = False) -> list[int]:
        self._check_open()
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        if not data:
            return []
        cap = len(data) + 8
        arr = (self._lc.llama_token * cap)()
        n = self._lc.llama_tokenize(self._vocab_ptr, data, len(data), arr, cap, False, special)
        if n < 0:  # buffer too small: llama.cpp returns -needed
            cap = -n
            arr = (self._lc.llama_token * cap)()
            n = self._lc.llama_tokenize(self._vocab_ptr, data, len(data), arr, cap, False, special)
        if n < 0:
            raise BackendError(f"llama.cpp failed to tokenize {len(data)} bytes.")
        return list(arr[:n])

    # -- evaluation ----------------------------------------------------------------------

    # -- contexts --------------------------------------------------------------------------

    def _context(self, model: Any, n_ctx: int, flash_attn: bool) -> EvalContext:
        def params(cells: int) -> Any:
            return context_params(
                self._lc,
                n_ctx=cells,
                n_batch=self._n_batch,
                n_seq=self._n_seq,
                threads=self._threads,
                flash_attn=flash_attn,
            )

        return EvalContext(
            self._lc,
            model,
            params,
            n_ctx=n_ctx,
            threads=self._threads,
            adaptive_threads=self._adaptive_threads,
            n_vocab=self._n_vocab_logits,
            n_embd=self._n_embd,
            recent_errors=recent_errors,
            first_cells=max(FIRST_CELLS, self._n_batch),  # a batch always fits
        )

    def _generation_context(self, path: Path, mparams: Any, n_ctx: int) -> EvalContext:
        """A context on the generation weights at ``path`` (see ``__init__``), checked to be the same model."""
        lc = self._lc
        check_gguf_file(path)
        recent_log.clear()
        gen_model = lc.llama_model_load_from_file(str(path).encode("utf-8"), mparams)
        if not gen_model:
            raise ModelLoadError(f"llama.cpp could not load the generation weights {path}: {recent_errors()}")
        self._gen_model = gen_model
        shape = (
            int(lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(gen_model))),
            int(lc.llama_model_n_embd(gen_model)),
            int(lc.llama_model_n_layer(gen_model)),
        )
        if shape != (self._n_vocab_logits, self._n_embd, self._n_layer):
            raise ModelLoadError(
                f"The generation weights {path} are not the same model as the prompt weights "
                f"(vocabulary, width, layers {shape} against {(self._n_vocab_logits, self._n_embd, self._n_layer)})."
            )
        return self._context(gen_model, n_ctx, self._flash_attn)

    @property
    def split(self) -> bool:
        """Whether generation runs in another context than prompts (``generation_weights``)."""
        return self._gen is not self._main

    def _contexts(self) -> tuple[EvalContext, EvalContext]:
        if self._main is None or self._gen is None:
            raise ModelStateError("This model is closed.")
        return self._main, self._gen

    # -- evaluation ------------------------------------------------------------------------

    def prefill(self, tokens: Sequence[int], *, logits: LogitsSelection = "last", hidden: bool = False) -> EvalOutput:
        if not self.split:
            return super().prefill(tokens, logits=logits, hidden=hidden)
        with self.lock:
            self._prompting = True
            try:
                return super().prefill(tokens, logits=logits, hidden=hidden)
            finally:
                self._prompting = False

    def reusable_prefix(self, tokens: Sequence[int]) -> int:
        keep = super().reusable_prefix(tokens)
        if self.split:  # a prompt is evaluated on the prompt weights, after what that context holds
            keep = min(keep, common_prefix_length(self._main_tokens, tokens))
        return keep

    def _eval(self, tokens: list[int], positions: list[int], hidden: bool) -> EvalOutput:
        main, gen = self._contexts()
        start = len(self._cached)
        if gen is main or not self._prompting:
            return self._eval_on(gen, tokens, start, positions, hidden)
        # A prompt on split weights: evaluated on the prompt weights after the part of the
        # cache that context holds, then its keys and values replace the generation context's.
        cached = self._cached
        keep = common_prefix_length(self._main_tokens, cached)
        main.remove(0, keep)
        del self._main_tokens[keep:]
        redo = cached[keep:start]
        out = self._eval_on(main, [*redo, *tokens], keep, [p + len(redo) for p in positions], hidden)
        self._main_tokens.extend([*redo, *tokens])
        gen.take_seq(main)
        out.positions = list(positions)
        return out

    def _eval_on(self, c: EvalContext, tokens: list[int], start: int, positions: list[int], hidden: bool) -> EvalOutput:
        """Evaluate ``tokens`` on ``c`` at positions from ``start``; rows at ``positions`` (indices into ``tokens``)."""
        c.reserve(start + len(tokens))
        c.set_embeddings(hidden)
        wanted = set(positions)
        rows: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
        for c0 in range(0, len(tokens), self._n_batch):
            chunk = tokens[c0 : c0 + self._n_batch]
            items = [(t, start + c0 + j, 0, (c0 + j) in wanted) for j, t in enumerate(chunk)]
            try:
                c.decode(items)
            except BackendError:
                # keep the Python view of the cache equal to what llama.cpp holds
                c.remove(0, start)
                if c is self._main and self.split:
                    del self._main_tokens[start:]
                raise
            for j in range(len(chunk)):
                if (c0 + j) in wanted:
                    rows[c0 + j] = c.read_row(j, hidden)
        return stack_rows(rows, positions, hidden, self._n_vocab_logits)

    def _eval_branches(self, branches: list[list[int]], hidden: bool) -> list[EvalOutput]:
        if self._n_seq < 2:
            return super()._eval_branches(branches, hidden)
        _, gen = self._contexts()
        gen.set_embeddings(hidden)
        base = len(self._cached)
        results: list[EvalOutput] = []
        # Group branches so each group fits the free sequence ids and one batch.
        group: list[list[int]] = []
        groups: list[list[list[int]]] = []
        size = 0
        for br in branches:
            if len(br) > self._n_batch:
                raise BackendError(f"A branch of {len(br)} tokens exceeds the batch size {self._n_batch}.")
            if group and (len(group) >= self._n_seq - 1 or size + len(br) > self._n_batch):
                groups.append(group)
                group, size = [], 0
            group.append(br)
            size += len(br)
        groups.append(group)
        gen.reserve(base + max(sum(len(br) for br in grp) for grp in groups))
        for grp in groups:
            items: list[tuple[int, int, int, bool]] = []
            spans = []
            for k, br in enumerate(grp):
                seq = k + 1
                gen.copy_seq(0, seq)
                spans.append((len(items), len(br)))
                items.extend((t, base + j, seq, True) for j, t in enumerate(br))
            try:
                gen.decode(items)
                for s0, n in spans:
                    rows = {j: gen.read_row(s0 + j, hidden) for j in range(n)}
                    results.append(stack_rows(rows, list(range(n)), hidden, self._n_vocab_logits))
            finally:
                for k in range(len(grp)):
                    gen.remove(k + 1, -1)
        self.stats.tokens_evaluated += sum(len(b) for b in branches)
        self.stats.eval_calls += len(groups)
        return results

    def _rollback(self, n: int) -> None:
        if not self._contexts()[1].remove(0, n):
            raise BackendError(f"llama.cpp could not roll the cache back to {n} tokens.")

    def _reset(self) -> None:
        main, gen = self._contexts()
        gen.clear()
        if gen is not main:
            main.clear()
            self._main_tokens.clear()

    # -- lanes (see _llamacpp_lanes) ---------------------------------------------------------

    def _lane_max(self) -> int:
        return self._n_seq - 1

    def _lane_open(self, width: int) -> tuple[int, list[int]]:
        if width > self._n_seq - 1:
            raise ModelStateError(
                f"{width} lanes were asked for; this model was loaded with n_seq={self._n_seq}, which allows "
                f"{self._n_seq - 1}."
            )
        if self._lanes is not None and self._lanes.width < width:
            self._lanes.close()
            self._lanes = None
        if self._lanes is None:
            self._lanes = LaneContext(
                self._lc,
                self._model,
                width=width,
                n_ctx=min(LANE_CTX, self.n_ctx),
                n_batch=self._n_batch,
                threads=self._threads,
                adaptive_threads=self._adaptive_threads,
                flash_attn=self._flash_attn,
                n_vocab=self._n_vocab_logits,
            )
        self._lanes.set_loras([(a.handle, a.scale) for a in self._loras if a.scale != 0.0])
        return self._lanes.capacity, list(self._lanes.prefix)

    def _lane_context(self) -> LaneContext:
        if self._lanes is None:
            raise ModelStateError("No lanes are open.")
        return self._lanes

    def _lane_share(self, tokens: list[int]) -> list[int]:
        lanes = self._lane_context()
        lanes.share(tokens)
        return list(lanes.prefix)

    def _lane_start(self, lane: int, keep: int) -> None:
        self._lane_context().start(lane, keep)

    def _lane_decode(self, items: list[tuple[int, int, int, bool]]) -> list[np.ndarray]:
        rows = self._lane_context().decode(items)
        self.stats.tokens_evaluated += len(items)
        self.stats.eval_calls += 1
        return rows

    def _lane_drop(self, lane: int) -> None:
        self._lane_context().drop(lane)

    def _lane_adopt(self, lane: int) -> None:
        data = self._lane_context().export(lane)
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        try:
            self._contexts()[1].import_seq(buf, len(data))
        except BackendError as exc:
            raise BackendError(f"llama.cpp could not take a finished lane's keys and values: {exc}") from exc

    def _layer_states(
        self, requests: list[StatesRequest], layer: int, loras: list[tuple[LoraAdapter, float]]
    ) -> list[LayerStates]:
        if self._states is None:
            self._states = StateReader(
                self._lc,
                self._model,
                n_ctx=self.n_ctx,
                n_batch=self._n_batch,
                threads=self._threads,
                n_embd=self._n_embd,
                adaptive_threads=self._adaptive_threads,
            )
        return self._states.read(requests, layer, loras)

    # -- LoRA ------------------------------------------------------------------------------

    def _forget_open_lora(self, adapter: LoraAdapter) -> None:
        if self._states is not None:
            self._states.drop_lora(adapter)
        if self._lanes is not None:
            self._lanes.set_loras([])  # re-applied when lanes next open

    def _load_lora(self, path: Path) -> object:
        if self._gen_model is not None:
            raise AdapterError(
                f"This model runs split weights (prompts and generation on two copies, layout='split'), "
                f"which apply no LoRA at run time; {path.name} cannot be loaded on it. Merge an extraction "
                "adapter into the weights (load_model(merge_adapter=...)) or load the model with layout='bf16'."
            )
        recent_log.clear()
        handle = self._lc.llama_adapter_lora_init(self._model, str(path).encode("utf-8"))
        if not handle:
            raise AdapterError(f"llama.cpp rejected the LoRA adapter {path}: {recent_errors()}")
        return handle

    def _apply_loras(self) -> None:
        lc = self._lc
        # an adapter switched off (scale 0) stays loaded but out of the graph: no cost while off
        active = [a for a in self._loras if a.scale != 0.0]
        n = len(active)
        arr = (lc.llama_adapter_lora_p_ctypes * max(n, 1))(*[a.handle for a in active])
        scales = (ctypes.c_float * max(n, 1))(*[a.scale for a in active])
        main, gen = self._contexts()
        for c in (main, gen) if gen is not main else (main,):
            rc = c.set_loras(arr, scales, n)  # kept: a context that grows applies them again
            if rc != 0:
                raise AdapterError(f"llama.cpp could not apply the LoRA adapters (code {rc}).")
        # the KV cache is forgotten before the next evaluation if its weights differ (base)

    def _free_lora(self, adapter: LoraAdapter) -> None:
        self._lc.llama_adapter_lora_free(adapter.handle)

    # -- lifecycle -------------------------------------------------------------------------

    def _close(self) -> None:
        lc = self._lc
        if self._lanes is not None:
            self._lanes.close()
            self._lanes = None
        if self._states is not None:
            self._states.close()
            self._states = None
        for c in {id(c): c for c in (self._gen, self._main) if c is not None}.values():
            c.close()
        self._main = self._gen = None
        if self._gen_model:
            lc.llama_model_free(self._gen_model)
            self._gen_model = None
        for a in [*self._loras, *self._open_loras]:
            lc.llama_adapter_lora_free(a.handle)
        self._loras.clear()
        self._open_loras.clear()
        if self._model:
            lc.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: S110 - never raise from a finalizer
            pass
