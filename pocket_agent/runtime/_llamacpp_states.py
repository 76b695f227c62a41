"""Inner-layer hidden states from llama.cpp, on a context of their own.

A :class:`StateReader` owns a second llama.cpp context on the same weights, created with
a :class:`~pocket_agent.runtime._llamacpp_tap.LayerTap` as its evaluation callback. The
callback costs a Python call per graph node, which the generating context must not pay,
hence the separate context (its KV cache is the only extra memory).

Every evaluation stops after the requested block, so the cache of this context is valid
only up to that block: sequence 0 keeps a *base* (the longest prefix shared with the
previous call, typically the chat-template header) together with the depth it was
computed to, and every request runs on sequences 1.. that are copied from the base and
removed afterwards. Several requests share one decode when their sequences and tokens
fit.

Its KV cache grows with use, as the main context's does (:mod:`._llamacpp_eval`): it starts
with :data:`FIRST_CELLS` cells (a question, its options and a short context; 11.5 MB for
SmolLM2-135M, where the whole window would take 90 MB) and is made again, larger, when a call
needs more. Its decodes run on the thread count the governor picks (:mod:`._threads`), one-token
decodes on one thread: this context uses flash attention, whose one-token results depend on
the thread count.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import BackendError
from ._llamacpp_context import context_params
from ._llamacpp_tap import LayerTap, load_ggml_base
from ._threads import ThreadGovernor
from .base import LayerStates, LoraAdapter, StatesRequest, common_prefix_length

N_SEQ = 16  # sequence 0 is the base; 1..15 carry requests
FIRST_CELLS = 512


@dataclass
class _Job:
    """One request laid out for decoding after the base."""

    index: int  # of the request this job answers (a request may be split into several jobs)
    request: StatesRequest
    start: int  # first prefix position not taken from the base
    seqs: list[int] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return len(self.request.prefix) - self.start + sum(len(b) for b in self.request.branches)

    @property
    def n_seqs(self) -> int:
        return max(1, len(self.request.branches))


class StateReader:
    """Reads the output of one transformer block for token sequences (see module doc)."""

    def __init__(
        self,
        lc: Any,
        model: Any,
        *,
        n_ctx: int,
        n_batch: int,
        threads: int,
        n_embd: int,
        adaptive_threads: bool = True,
    ) -> None:
        self._lc = lc
        self._model = model
        self._tap = LayerTap(load_ggml_base(lc), lc.ggml_backend_sched_eval_callback, n_embd)
        self._n_embd = n_embd
        self._n_batch = n_batch
        self._threads = threads
        self._max_cells = n_ctx
        self._ctx: Any = None
        self._mem: Any = None
        self.capacity = 0
        self._governor = ThreadGovernor(
            threads, lambda n: lc.llama_set_n_threads(self._ctx, n, n), adaptive=adaptive_threads, single_on_one=True
        )
        self._create(min(n_ctx, max(FIRST_CELLS, n_batch)))
        self._batch = lc.llama_batch_init(n_batch, 0, N_SEQ)
        self._base: list[int] = []
        self._base_depth = -1
        self._loras: list[tuple[int, float]] = []

    def _create(self, cells: int) -> None:
        """A context of ``cells`` KV cells in place of the current one (whose cache is dropped)."""
        lc = self._lc
        # n_ubatch = n_batch: the tap sees every row of a decode at once. Flash attention is
        # on whatever the generating context uses, so the features (and the heads trained
        # on them) do not depend on that setting.
        cparams = context_params(
            lc, n_ctx=cells, n_batch=self._n_batch, n_seq=N_SEQ, threads=self._threads, flash_attn=True
        )
        cparams.cb_eval = self._tap.callback
        cparams.cb_eval_user_data = None
        ctx = lc.llama_init_from_model(self._model, cparams)
        if not ctx:
            raise BackendError("llama.cpp could not create the context that reads layer states.")
        if self._ctx:
            lc.llama_free(self._ctx)
        self._ctx, self._mem = ctx, lc.llama_get_memory(ctx)
        self.capacity = int(lc.llama_n_ctx(ctx))
        current = self._governor.current
        if current != self._threads:
            lc.llama_set_n_threads(ctx, current, current)
        self._loras = []
        self._base = []
        self._base_depth = -1

    def _reserve(self, cells: int) -> None:
        """Grow the cache to ``cells`` cells if it holds fewer (what it held is evaluated again)."""
        if cells > self.capacity and self.capacity < self._max_cells:
            self._create(min(self._max_cells, max(2 * self.capacity, cells)))

    # -- state of the base ---------------------------------------------------------------

    def _clear(self) -> None:
        self._lc.llama_memory_clear(self._mem, True)
        self._base = []
        self._base_depth = -1

    def _set_loras(self, loras: Sequence[tuple[LoraAdapter, float]]) -> None:
        wanted = [(id(a.handle), s) for a, s in loras if s != 0.0]
        if wanted == self._loras:
            return
        lc = self._lc
        active = [(a, s) for a, s in loras if s != 0.0]
        n = len(active)
        arr = (lc.llama_adapter_lora_p_ctypes * max(n, 1))(*[a.handle for a, _ in active])
        scales = (ctypes.c_float * max(n, 1))(*[s for _, s in active])
        if lc.llama_set_adapters_lora(self._ctx, arr if n else None, n, scales if n else None) != 0:
            raise BackendError("llama.cpp could not apply the LoRA adapters to the state reader.")
        self._loras = wanted
        self._clear()

    def drop_lora(self, adapter: LoraAdapter) -> None:
        """Un-apply ``adapter`` (about to be freed) if this context uses it."""
        if any(h == id(adapter.handle) for h, _ in self._loras):
            self._set_loras([])

    # -- decoding ------------------------------------------------------------------------

    def _decode(self, items: Sequence[tuple[int, int, Sequence[int]]], layer: int) -> NDArray[np.float32]:
        """Decode ``(token, pos, seq_ids)`` items; return the block's rows for them."""
        b = self._batch
        for i, (tok, pos, seqs) in enumerate(items):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = len(seqs)
            for k, s in enumerate(seqs):
                b.seq_id[i][k] = s
            b.logits[i] = 0
        b.n_tokens = len(items)
        self._tap.layer = layer
        self._tap.stop = True
        rc = self._governor.run(len(items), lambda: self._lc.llama_decode(self._ctx, b))
        rows, error = self._tap.rows, self._tap.error
        self._tap.layer = None
        if rc != 0 or error is not None or rows is None or rows.shape[0] != len(items):
            self._clear()
            why = error or (f"llama_decode returned {rc}" if rc else "the block's output was not observed")
            raise BackendError(f"Reading the states of layer {layer} failed: {why}.")
        return rows

    def _extend_base(self, tokens: list[int], layer: int) -> None:
        keep = common_prefix_length(self._base, tokens) if self._base_depth >= layer else 0
        if keep < len(self._base):
            self._lc.llama_memory_seq_rm(self._mem, 0, keep, -1)
            del self._base[keep:]
        if keep == 0:
            self._clear()
        for c0 in range(keep, len(tokens), self._n_batch):
            chunk = tokens[c0 : c0 + self._n_batch]
            self._decode([(t, c0 + j, (0,)) for j, t in enumerate(chunk)], layer)
            self._base.extend(chunk)
            self._base_depth = layer if self._base_depth < 0 else min(self._base_depth, layer)

    def read(
        self, requests: Sequence[StatesRequest], layer: int, loras: Sequence[tuple[LoraAdapter, float]]
    ) -> list[LayerStates]:
        # the base: the common prefix of all requests, short of any position whose state is wanted
        shared = list(requests[0].prefix)
        for req in requests:
            shared = shared[: common_prefix_length(shared, req.prefix)]
        for req in requests:
            limit = min(req.prefix_positions, default=len(req.prefix) if req.branches else len(req.prefix) - 1)
            shared = shared[:limit]
        groups = self._groups(requests, len(shared))
        self._reserve(len(shared) + max(sum(j.n_tokens for j in g) for g in groups))
        self._set_loras(loras)
        self._extend_base(shared, layer)
        parts: list[list[LayerStates]] = [[] for _ in requests]
        for group in groups:
            self._run_group(group, layer, parts)
        return [LayerStates(prefix=ps[0].prefix, branches=[b for st in ps for b in st.branches]) for ps in parts]

    def _groups(self, requests: Sequence[StatesRequest], n_base: int) -> list[list[_Job]]:
        """The requests laid out as jobs after a base of ``n_base`` tokens, in groups that share a decode."""
        # a request with more branches than free sequences runs as several parts
        jobs: list[_Job] = []
        per = N_SEQ - 1
        for i, req in enumerate(requests):
            if len(req.branches) <= per:
                jobs.append(_Job(i, req, n_base))
                continue
            for k in range(0, len(req.branches), per):
                part = StatesRequest(req.prefix, req.branches[k : k + per], req.prefix_positions if k == 0 else [])
                jobs.append(_Job(i, part, n_base))
        groups: list[list[_Job]] = [[]]
        for job in jobs:
            group = groups[-1]
            if group and (
                sum(j.n_seqs for j in group) + job.n_seqs > per
                or sum(j.n_tokens for j in group) + job.n_tokens > self._n_batch
            ):
                groups.append([])
            groups[-1].append(job)
        return groups

    def _run_group(self, group: list[_Job], layer: int, parts: list[list[LayerStates]]) -> None:
        lc = self._lc
        items: list[tuple[int, int, Sequence[int]]] = []
        # where each wanted row sits in ``items``: (job slot, kind, branch, offset)
        prefix_rows: list[dict[int, int]] = []
        branch_rows: list[list[list[int]]] = []
        next_seq = 1
        for job in group:
            job.seqs = list(range(next_seq, next_seq + job.n_seqs))
            next_seq += job.n_seqs
            req = job.request
            wanted = set(req.prefix_positions)
            rows: dict[int, int] = {}
            for p in range(job.start, len(req.prefix)):
                if p in wanted:
                    rows[p] = len(items)
                items.append((req.prefix[p], p, job.seqs))
            prefix_rows.append(rows)
            per_branch = []
            for k, br in enumerate(req.branches):
                idx = []
                for j, t in enumerate(br):
                    idx.append(len(items))
                    items.append((t, len(req.prefix) + j, (job.seqs[k],)))
                per_branch.append(idx)
            branch_rows.append(per_branch)
        try:
            for job in group:
                for s in job.seqs:
                    lc.llama_memory_seq_cp(self._mem, 0, s, -1, -1)
            outs = [self._decode(items[c0 : c0 + self._n_batch], layer) for c0 in range(0, len(items), self._n_batch)]
        finally:
            for job in group:
                for s in job.seqs:
                    lc.llama_memory_seq_rm(self._mem, s, -1, -1)
        rows_all = np.concatenate(outs, axis=0) if len(outs) > 1 else outs[0]
        for job, prow, brows in zip(group, prefix_rows, branch_rows, strict=True):
            pref = np.stack([rows_all[prow[p]] for p in job.request.prefix_positions]) if prow else None
            parts[job.index].append(
                LayerStates(
                    prefix=pref if pref is not None else np.zeros((0, self._n_embd), dtype=np.float32),
                    branches=[rows_all[idx].copy() for idx in brows],
                )
            )

    def close(self) -> None:
        lc = self._lc
        if self._batch is not None:
            lc.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            lc.llama_free(self._ctx)
            self._ctx = None
