"""Packed forward passes of a Hugging Face decoder for training.

A question of the pointer layout is one prompt (``prefix``) and one short continuation per
option (``branches``). Training evaluates all of them in one row: the prefix, then every
branch, with an attention mask that lets a branch see the prefix and itself only and
position ids that restart every branch right after the prefix. That is exactly what
llama.cpp computes for the branches as separate sequences, at the cost of one prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Packed:
    """One packed row: token ids, position ids, segment of every token (0 = prefix)."""

    tokens: list[int]
    positions: list[int]
    segments: list[int]
    marks: list[int]
    """Index (in the packed row) of the last token of every branch (its marker)."""


def pack(prefix: Sequence[int], branches: Sequence[Sequence[int]]) -> Packed:
    tokens = list(prefix)
    positions = list(range(len(prefix)))
    segments = [0] * len(prefix)
    marks = []
    for i, branch in enumerate(branches):
        tokens += branch
        positions += range(len(prefix), len(prefix) + len(branch))
        segments += [i + 1] * len(branch)
        marks.append(len(tokens) - 1)
    return Packed(tokens, positions, segments, marks)


@dataclass
class Batch:
    """Several packed rows, right-padded, with their attention mask ``[B, 1, T, T]``."""

    tokens: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    rows: list[Packed]


def collate(rows: Sequence[Packed], pad_id: int = 0) -> Batch:
    width = max(len(r.tokens) for r in rows)
    n = len(rows)
    tokens = torch.full((n, width), pad_id, dtype=torch.long)
    positions = torch.zeros((n, width), dtype=torch.long)
    seg = torch.full((n, width), -1, dtype=torch.long)
    for i, r in enumerate(rows):
        k = len(r.tokens)
        tokens[i, :k] = torch.tensor(r.tokens)
        positions[i, :k] = torch.tensor(r.positions)
        seg[i, :k] = torch.tensor(r.segments)
    idx = torch.arange(width)
    causal = idx[None, :] <= idx[:, None]  # [T(query), T(key)]
    q_seg = seg[:, :, None]
    k_seg = seg[:, None, :]
    visible = (k_seg == 0) | (k_seg == q_seg)
    mask = causal[None] & visible & (k_seg >= 0)
    # padding rows attend to themselves so softmax never sees an empty row
    mask |= torch.eye(width, dtype=torch.bool)[None] & (seg < 0)[:, :, None]
    return Batch(tokens=tokens, positions=positions, mask=mask[:, None], rows=list(rows))


def embed(model: Any, batch: Batch) -> torch.Tensor:
    """Token embeddings of a batch (the input of block 0)."""
    inner = model.model
    out: torch.Tensor = inner.embed_tokens(batch.tokens)
    return out


def run_blocks(model: Any, hidden: torch.Tensor, batch: Batch, blocks: range) -> torch.Tensor:
    """Run decoder blocks ``blocks`` on ``hidden`` (the input of ``blocks.start``)."""
    inner = model.model
    rope = inner.rotary_emb(hidden, position_ids=batch.positions)
    for b in blocks:
        hidden = inner.layers[b](
            hidden,
            attention_mask=batch.mask,
            position_ids=batch.positions,
            position_embeddings=rope,
        )
    return hidden
