"""Supervised LoRA fine-tuning: teach the model the answer tokens after a prompt.

Used by the generation tasks (``extract``, ``tools``): each example is the exact prompt token ids
inference evaluates and the answer token ids the model should write after it. The loss is
the cross-entropy of the answer tokens only. As for the Dec adapter, blocks below the LoRA
are frozen and their output is computed once per example.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InvalidInputError
from ._loop import LoopSettings, Trainable, check_settings, length_batches, run_loop
from ._lora import LoraConfig, attach_lora, load_lora_state, lora_parameters, lora_state
from ._packed import Packed, collate, embed, pack, run_blocks
from ._progress import Progress
from ._resume import config_key


@dataclass(frozen=True)
class SftTraining:
    """How a generation adapter is trained.

    Args:
        lora_blocks: how many of the last blocks carry the LoRA (the ones below are frozen
            and computed once per example).
        rank, alpha: LoRA size and scale.
        epochs, batch_tokens, lr: optimisation.
        val_fraction, patience, evals_per_epoch: early stopping on held-out examples.
        seed: split, initialisation and order.
        threads: torch threads (None: torch's default).
    """

    lora_blocks: int = 10
    rank: int = 8
    alpha: float = 16.0
    epochs: int = 3
    batch_tokens: int = 4096
    lr: float = 5e-4
    val_fraction: float = 0.15
    patience: int = 2
    evals_per_epoch: int = 2
    seed: int = 0
    threads: int | None = None

    def __post_init__(self) -> None:
        check_settings(
            self,
            ints=("lora_blocks", "rank", "epochs", "batch_tokens", "patience", "evals_per_epoch"),
            numbers=("alpha", "lr"),
        )


@dataclass
class SftExample:
    prompt: list[int]
    answer: list[int]


@dataclass
class SftOutcome:
    state: dict[str, Any]
    first_block: int
    steps: int
    n_train: int
    n_val: int
    best_val_loss: float
    base_val_loss: float
    seconds: float
    history: list[dict[str, float]] = field(default_factory=list)


@dataclass
class _Row:
    example: SftExample
    packed: Packed
    frozen: Any = None


def _groups(rows: Sequence[_Row], budget: int, rng: random.Random | None) -> list[list[_Row]]:
    return length_batches(rows, lambda r: len(r.packed.tokens), budget, rng)


def train_sft(
    hf: Any,
    examples: Sequence[SftExample],
    training: SftTraining,
    progress: Progress,
    *,
    state_dir: Path | None = None,
) -> SftOutcome:
    """Train a LoRA on ``hf`` (a transformers causal LM) so it writes each answer after its prompt.

    ``state_dir`` saves the training state after every validation check and resumes from it.
    """
    import torch

    t0 = time.perf_counter()
    if len(examples) < 5:
        raise InvalidInputError(f"{len(examples)} examples are too few to train an adapter; give at least 5.")
    for i, ex in enumerate(examples):
        if not ex.prompt or not ex.answer:
            raise InvalidInputError(f"examples[{i}] has an empty prompt or answer.")
    n_layer = len(hf.model.layers)
    first = max(0, n_layer - training.lora_blocks)
    order = np.random.default_rng(training.seed).permutation(len(examples))
    n_val = max(1, round(len(examples) * training.val_fraction))
    val = [_Row(examples[i], pack(examples[i].prompt + examples[i].answer, [])) for i in order[:n_val]]
    train = [_Row(examples[i], pack(examples[i].prompt + examples[i].answer, [])) for i in order[n_val:]]
    torch.manual_seed(training.seed)
    with torch.no_grad():
        rows = [*train, *val]
        done = 0
        for group in _groups(rows, training.batch_tokens, None):
            batch = collate([r.packed for r in group])
            h = run_blocks(hf, embed(hf, batch), batch, range(0, first))
            for i, r in enumerate(group):
                r.frozen = h[i, : len(r.packed.tokens)].clone()
            done += len(group)
            progress("frozen blocks", done, len(rows), {})
    loras = attach_lora(
        hf.model.layers, LoraConfig(rank=training.rank, alpha=training.alpha, first_block=first), training.seed
    )
    for p in hf.parameters():
        if not any(p is q for q in lora_parameters(loras)):
            p.requires_grad_(False)
    opt = torch.optim.AdamW(list(lora_parameters(loras)), lr=training.lr, weight_decay=0.0)
    norm, head = hf.model.norm, hf.lm_head

    def loss_of(group: list[_Row]) -> tuple[Any, int]:
        batch = collate([r.packed for r in group])
        h = torch.zeros((len(group), batch.tokens.shape[1], hf.config.hidden_size))
        for i, r in enumerate(group):
            h[i, : r.frozen.shape[0]] = r.frozen
        out = run_blocks(hf, h, batch, range(first, n_layer))
        picked, targets = [], []
        for i, r in enumerate(group):
            p = len(r.example.prompt)
            picked.append(out[i, p - 1 : p - 1 + len(r.example.answer)])
            targets += r.example.answer
        logits = head(norm(torch.cat(picked)))
        total = torch.nn.functional.cross_entropy(logits, torch.tensor(targets), reduction="sum")
        return total, len(targets)

    def evaluate() -> float:
        total, count = 0.0, 0
        with torch.no_grad():
            for group in _groups(val, training.batch_tokens, None):
                s, n = loss_of(group)
                total += float(s)
                count += n
        return total / max(count, 1)

    def step(group: list[_Row]) -> float:
        s, n = loss_of(group)
        loss = s / n
        opt.zero_grad()
        loss.backward()
        opt.step()
        return float(loss.detach())

    def snapshot() -> dict[str, Any]:
        return {"lora": lora_state(loras)}

    task = Trainable(
        batches=lambda rng: _groups(train, training.batch_tokens, rng),
        step=step,
        evaluate=lambda: {"val_loss": evaluate()},
        snapshot=snapshot,
        restore=lambda state: load_lora_state(loras, state["lora"]),
        optimizer=opt,
    )
    settings = LoopSettings(training.epochs, training.evals_per_epoch, training.patience, training.seed)
    key = config_key(
        {k: v for k, v in asdict(training).items() if k != "threads"}, [[e.prompt, e.answer] for e in examples]
    )
    outcome = run_loop(task, settings, progress, state_dir=state_dir, key=key)
    load_lora_state(loras, outcome.best["lora"])
    return SftOutcome(
        state=outcome.best["lora"],
        first_block=first,
        steps=outcome.steps,
        n_train=len(train),
        n_val=len(val),
        best_val_loss=outcome.best_loss,
        base_val_loss=outcome.base_loss,
        seconds=time.perf_counter() - t0,
        history=outcome.history,
    )
