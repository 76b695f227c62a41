"""Train the Dec adapter: a LoRA and a pointer head, jointly, on a CPU.

Every question is laid out exactly as ``decide`` lays it out (the prompt once, every
option as its own continuation closed by a marker), tokenized by the runtime model, so
training and inference evaluate the same ids. Training runs on the model's Hugging Face
checkpoint (float32 torch):

1. blocks below the LoRA are frozen, so their output is computed once per question and
   cached; only the LoRA blocks run forward and backward in each step;
2. the head reads either the hidden state after block ``layer`` at each option's marker
   (``objective="hidden"``) or the mean log-probability of each option's text through the
   model's own output head (``objective="cloze"``); LoRA and head are trained together with
   cross-entropy over each question's options, and the LoRA with the best validation loss
   is kept (early stopping);
3. the LoRA is exported as a GGUF LoRA; for ``hidden`` the head is refitted on llama.cpp's
   own features with that LoRA applied (llama.cpp quantises activations, so its features
   differ from torch's by ~3%: the shipped head must match what inference computes).
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..decision import FeatureSpec, PromptFormat
from ..decision._features import FINAL_NORM
from ..decision._head import LinearHead, fit_head
from ..decision._layout import DEFAULT_FORMAT, branch_layout
from ..decision.adapter import DecisionAdapter, new_adapter
from ..decision.core import Question, pointer_features
from ..decision.train import Example, as_examples, default_layer
from ..errors import InvalidInputError
from ..runtime import Model, resolve_model
from ..runtime.identity import model_identity
from ._checkpoint import checkpoint_folder, load_torch_model
from ._loop import LoopSettings, Trainable, check_settings, length_batches, peak_rss_mb, run_loop
from ._lora import LoraConfig, attach_lora, load_lora_state, lora_parameters, lora_state, write_gguf_lora
from ._packed import Packed, collate, embed, pack, run_blocks
from ._progress import Progress, ProgressBar
from ._resume import config_key


@dataclass(frozen=True)
class DecideTraining:
    """How a Dec adapter is trained.

    Args:
        objective: what the head reads. ``"hidden"``: the hidden state after block
            ``layer`` at the marker closing each option (the LoRA sits on the
            ``lora_blocks`` blocks up to ``layer``). ``"cloze"``: the mean log-probability
            the model gives each option's text (the LoRA sits on the last ``lora_blocks``
            blocks and trains through the model's own output head, so the adapter starts
            from what the model already knows about the answer).
        layer: the block whose output the head reads (``"auto"``: 60% of the depth, as
            ``train_head``).
        lora_blocks: how many blocks up to ``layer`` carry the LoRA (the ones below are
            frozen and computed once per question).
        rank, alpha: LoRA size and scale (``alpha / rank`` multiplies ``B @ A``).
        epochs: most passes over the training questions.
        batch_tokens: packed tokens per optimisation step (questions are grouped by length).
        lr, head_lr: AdamW learning rates of the LoRA and of the head.
        weight_decay: AdamW weight decay of the LoRA.
        head_init: ``"fresh"`` (zero weights; the standardisation of the base features) or
            ``"fitted"`` (the head fitted on the base features of the training questions).
        val_fraction: share of the questions held out for early stopping and the reported
            validation accuracy.
        patience: evaluations without a better validation loss before stopping.
        evals_per_epoch: validation checks per epoch.
        seed: split, initialisation and batch order.
        threads: torch threads (None: torch's default).
    """

    objective: str = "hidden"
    layer: int | str = "auto"
    lora_blocks: int = 8
    rank: int = 8
    alpha: float = 16.0
    epochs: int = 3
    batch_tokens: int = 2048
    lr: float = 2e-4
    head_lr: float = 1e-3
    weight_decay: float = 0.01
    head_init: str = "fresh"
    val_fraction: float = 0.15
    patience: int = 3
    evals_per_epoch: int = 2
    seed: int = 0
    threads: int | None = None
    prompt_format: PromptFormat = DEFAULT_FORMAT

    def __post_init__(self) -> None:
        check_settings(
            self,
            ints=("lora_blocks", "rank", "epochs", "batch_tokens", "patience", "evals_per_epoch"),
            numbers=("alpha", "lr", "head_lr"),
        )
        if self.objective not in ("hidden", "cloze"):
            raise InvalidInputError(f"objective must be 'hidden' or 'cloze', got {self.objective!r}.")
        if self.head_init not in ("fresh", "fitted"):
            raise InvalidInputError(f"head_init must be 'fresh' or 'fitted', got {self.head_init!r}.")


@dataclass
class DecideResult:
    """A trained Dec adapter (LoRA + head) and how it scored."""

    adapter: DecisionAdapter
    val_accuracy: float
    """Runtime-model accuracy of the final adapter on the held-out questions."""
    base_val_accuracy: float
    """The same questions with a head refitted on the base model's features (no LoRA)."""
    n_train: int
    n_val: int
    steps: int
    seconds: float
    peak_rss_mb: float
    history: list[dict[str, float]] = field(default_factory=list)

    def summary(self) -> str:
        return "\n".join(
            [
                f"trained on {self.n_train} questions, validated on {self.n_val} ({self.seconds:.0f} s, "
                f"{self.steps} steps, peak memory {self.peak_rss_mb:.0f} MB)",
                f"Dec adapter (LoRA + head): {self.val_accuracy:.3f}; head on the base model: "
                f"{self.base_val_accuracy:.3f}",
            ]
        )


@dataclass
class _Item:
    example: Example
    packed: Packed
    predictions: list[tuple[list[int], list[int]]]
    """Per option: the packed positions whose logits predict its text tokens, and those tokens."""
    frozen: Any = None  # torch tensor [len, n_embd]: the input of the first LoRA block


def _item(example: Example, prefix: list[int], branches: list[list[int]], n_text: list[int]) -> _Item:
    packed = pack(prefix, branches)
    predictions = []
    start = len(prefix)
    for branch, n in zip(branches, n_text, strict=True):
        positions = [len(prefix) - 1] + [start + j for j in range(n - 1)]
        predictions.append((positions, branch[:n]))
        start += len(branch)
    return _Item(example, packed, predictions)


def _split(rows: list[Example], training: DecideTraining) -> tuple[list[Example], list[Example]]:
    n_val = max(1, round(len(rows) * training.val_fraction))
    if len(rows) - n_val < 4:
        raise InvalidInputError(f"{len(rows)} examples are too few to train an adapter; give at least 10.")
    order = np.random.default_rng(training.seed).permutation(len(rows))
    return [rows[i] for i in order[n_val:]], [rows[i] for i in order[:n_val]]


def _batches(items: Sequence[_Item], budget: int, rng: random.Random | None) -> list[list[_Item]]:
    return length_batches(items, lambda it: len(it.packed.tokens), budget, rng)


def train_decide_adapter(
    examples: Iterable[Example | Mapping[str, object]],
    model: Model | str | os.PathLike[str] | None = None,
    *,
    training: DecideTraining | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    resume: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
    metadata: Mapping[str, object] | None = None,
) -> DecideResult:
    """Train a Dec adapter (LoRA + pointer head) for ``model`` on labelled questions.

    ``examples`` are ``{question, options, answer, context?}`` rows (as for
    ``train_head``). ``checkpoint`` is the Hugging Face folder of the same weights (by
    default the GGUF is converted once into the cache). ``resume`` is a folder where the
    training state is saved after every validation check and picked up from on the next
    call with the same arguments. Returns a :class:`DecideResult`; ``result.adapter.save(path)``
    writes the adapter (a folder or ``.zip`` with ``head.safetensors`` and ``lora.gguf``).
    """
    import torch

    t0 = time.perf_counter()
    training = training or DecideTraining()
    m = resolve_model(model)
    if not m.capabilities.layer_states or not m.capabilities.lora:
        raise InvalidInputError(
            f"A Dec adapter with a LoRA is read through inner-block states and a LoRA; the {m.backend} backend "
            "has neither. Train on the GGUF build of the model."
        )
    rows = as_examples(examples)
    layer = default_layer(m) if training.layer == "auto" else training.layer
    if isinstance(layer, str) or not 0 <= layer < m.info.n_layer - 1:
        raise InvalidInputError(f"layer must be a block index below {m.info.n_layer - 1}, got {training.layer!r}.")
    cloze = training.objective == "cloze"
    top = m.info.n_layer - 1 if cloze else layer  # the last block the LoRA and the features need
    first = max(0, top - training.lora_blocks + 1)
    spec = (
        FeatureSpec(parts=("option_logprob",), layer=FINAL_NORM)
        if cloze
        else FeatureSpec(parts=("hidden@marker",), layer=layer)
    )
    fmt = training.prompt_format
    bar = progress or ProgressBar(enabled=False)
    train_rows, val_rows = _split(rows, training)

    def items_for(part: list[Example]) -> list[_Item]:
        out = []
        for e in part:
            lay = branch_layout(m, fmt, e.question, e.options, e.context)
            out.append(_item(e, lay.prefix, lay.branches, lay.n_text))
        return out

    train_items, val_items = items_for(train_rows), items_for(val_rows)

    torch.manual_seed(training.seed)
    hf = load_torch_model(checkpoint_folder(m, checkpoint), training.threads)
    n_layer = len(hf.model.layers)
    if n_layer != m.info.n_layer or hf.config.hidden_size != m.info.n_embd:
        raise InvalidInputError(
            f"The checkpoint ({n_layer} blocks, width {hf.config.hidden_size}) is not the runtime model "
            f"({m.info.n_layer} blocks, width {m.info.n_embd})."
        )

    def features(out: Any, it: _Item) -> Any:
        """``[n_options, dim]`` features of one question from its packed block outputs."""
        if not cloze:
            return out[it.packed.marks]
        rows = []
        for positions, tokens in it.predictions:
            logp = torch.log_softmax(hf.lm_head(hf.model.norm(out[positions])), dim=-1)
            rows.append(logp[torch.arange(len(tokens)), torch.tensor(tokens)].mean())
        return torch.stack(rows)[:, None]

    # 1. frozen blocks once; base features for the initial head
    base_feats: dict[int, np.ndarray] = {}
    all_items = [*train_items, *val_items]
    with torch.no_grad():
        done = 0
        for group in _batches(all_items, training.batch_tokens, None):
            batch = collate([it.packed for it in group])
            h = run_blocks(hf, embed(hf, batch), batch, range(0, first))
            out = run_blocks(hf, h, batch, range(first, top + 1))
            for i, it in enumerate(group):
                it.frozen = h[i, : len(it.packed.tokens)].clone()
                base_feats[id(it)] = features(out[i], it).numpy().astype(np.float32)
            done += len(group)
            bar("frozen blocks", done, len(all_items), {})
    head0, _ = fit_head(
        [base_feats[id(it)] for it in train_items],
        [it.example.answer for it in train_items],
        stop_x=[base_feats[id(it)] for it in val_items],
        stop_y=[it.example.answer for it in val_items],
        refit=False,
    )

    # 2. LoRA + head, jointly
    loras = attach_lora(
        hf.model.layers,
        LoraConfig(rank=training.rank, alpha=training.alpha, first_block=first, last_block=top),
        training.seed,
    )
    mean = torch.tensor(head0.mean, dtype=torch.float32)
    scale = torch.tensor(head0.scale, dtype=torch.float32)
    # A head fitted on the training questions already explains them, so a LoRA trained
    # under it only learns to memorise them; "fresh" starts from zero weights instead.
    start = head0.weight if training.head_init == "fitted" or cloze else np.zeros_like(head0.weight)
    weight = torch.nn.Parameter(torch.tensor(start, dtype=torch.float32))
    opt = torch.optim.AdamW(
        [
            {"params": list(lora_parameters(loras)), "lr": training.lr, "weight_decay": training.weight_decay},
            {"params": [weight], "lr": training.head_lr, "weight_decay": 0.0},
        ]
    )

    def forward(group: list[_Item]) -> tuple[Any, int]:
        batch = collate([it.packed for it in group])
        width = batch.tokens.shape[1]
        h = torch.zeros((len(group), width, hf.config.hidden_size))
        for i, it in enumerate(group):
            h[i, : it.frozen.shape[0]] = it.frozen
        out = run_blocks(hf, h, batch, range(first, top + 1))
        loss = torch.zeros(())
        correct = 0
        for i, it in enumerate(group):
            scores = ((features(out[i], it) - mean) * scale) @ weight
            target = torch.tensor([it.example.answer])
            loss = loss + torch.nn.functional.cross_entropy(scores[None], target)
            correct += int(int(torch.argmax(scores)) == it.example.answer)
        return loss / len(group), correct

    def step(group: list[_Item]) -> float:
        loss, _ = forward(group)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return float(loss.detach())

    def evaluate() -> dict[str, float]:
        total, correct = 0.0, 0
        with torch.no_grad():
            for group in _batches(val_items, training.batch_tokens, None):
                loss, c = forward(group)
                total += float(loss) * len(group)
                correct += c
        return {"val_loss": total / len(val_items), "val_accuracy": correct / len(val_items)}

    def snapshot() -> dict[str, Any]:
        return {"lora": lora_state(loras), "weight": weight.detach().clone()}

    def restore(state: dict[str, Any]) -> None:
        load_lora_state(loras, state["lora"])
        with torch.no_grad():
            weight.copy_(state["weight"])

    task = Trainable(
        batches=lambda rng: _batches(train_items, training.batch_tokens, rng),
        step=step,
        evaluate=evaluate,
        snapshot=snapshot,
        restore=restore,
        optimizer=opt,
    )
    settings = LoopSettings(training.epochs, training.evals_per_epoch, training.patience, training.seed)
    state_dir = Path(resume) if resume is not None else None
    outcome = run_loop(task, settings, bar, state_dir=state_dir, key=_config_key(training, rows))
    best_state, history, step_count = outcome.best["lora"], outcome.history, outcome.steps

    # 3. export the best LoRA, refit the head on the runtime's features with it applied
    record: dict[str, object] = {
        "task": "decide",
        "examples": len(rows),
        "n_train": len(train_rows),
        "n_val": len(val_rows),
        "seed": training.seed,
        "objective": training.objective,
        "layer": spec.layer,
        "lora_blocks": [first, top],
        "rank": training.rank,
        "alpha": training.alpha,
        "lora_targets": list(LoraConfig().targets),
        "steps": step_count,
        "history": history,
        "best_val_loss_torch": round(outcome.best_loss, 4),
        "trained_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "training": {k: v for k, v in asdict(training).items() if k != "prompt_format"},
        **{str(k): v for k, v in (metadata or {}).items()},
    }
    tmp = tempfile.TemporaryDirectory(prefix="pocket-agent-dec-")
    lora_path = write_gguf_lora(
        Path(tmp.name) / "lora.gguf",
        best_state,
        architecture=m.info.architecture,
        alpha=training.alpha,
        metadata={
            "task": "decide",
            "base_model_id": model_identity(m),
            "base_model_name": m.info.name,
            "rank": str(training.rank),
            "steps": str(step_count),
        },
    )
    n_tr = len(train_rows)
    val_gold = [e.answer for e in val_rows]

    def accuracy(head: LinearHead, fs: list[np.ndarray]) -> float:
        preds = [int(np.argmax(head.scores(f))) for f in fs]
        return float(np.mean([p == g for p, g in zip(preds, val_gold, strict=True)]))

    if cloze:
        # One feature: any positive weight ranks the options alike, so the head trained in
        # torch is kept and only the validation questions are read on the runtime.
        questions = [Question(e.question, list(e.options), e.context) for e in val_rows]
        base_feats_rt = pointer_features(m, spec, fmt, questions)
        loaded = m.load_lora(lora_path)  # final-norm features: the LoRA applies to the generating context
        try:
            feats = pointer_features(m, spec, fmt, questions)
        finally:
            m.remove_lora(loaded)
        trained_weight = outcome.best["weight"].numpy().astype(np.float32)
        head = LinearHead(mean=head0.mean, scale=head0.scale, weight=trained_weight)
        val_acc, base_acc = accuracy(head, feats), accuracy(head0, base_feats_rt)
    else:
        # llama.cpp quantises activations: refit the head on the runtime's own features
        questions = [Question(e.question, list(e.options), e.context) for e in [*train_rows, *val_rows]]
        base_feats_rt = pointer_features(m, spec, fmt, questions)
        opened = m.open_lora(lora_path)
        try:
            feats = pointer_features(m, spec, fmt, questions, lora=(opened, 1.0))
        finally:
            m.close_lora(opened)

        def refit(fs: list[np.ndarray]) -> LinearHead:
            head, _ = fit_head(
                fs[:n_tr], [e.answer for e in train_rows], stop_x=fs[n_tr:], stop_y=val_gold, refit=False
            )
            return head

        head = refit(feats)
        val_acc, base_acc = accuracy(head, feats[n_tr:]), accuracy(refit(base_feats_rt), base_feats_rt[n_tr:])
    record["val_accuracy"] = round(val_acc, 4)
    record["base_head_val_accuracy"] = round(base_acc, 4)
    record["seconds"] = round(time.perf_counter() - t0, 1)
    record["peak_rss_mb"] = round(peak_rss_mb(), 1)
    adapter = new_adapter(
        m, head, spec, fmt, metadata={"training": json.dumps(record, ensure_ascii=False, sort_keys=True)}
    )
    adapter.lora_paths = {"llamacpp": lora_path}
    adapter.lora_scale = 1.0
    adapter._tmpdir = tmp
    return DecideResult(
        adapter=adapter,
        val_accuracy=val_acc,
        base_val_accuracy=base_acc,
        n_train=len(train_rows),
        n_val=len(val_rows),
        steps=step_count,
        seconds=time.perf_counter() - t0,
        peak_rss_mb=peak_rss_mb(),
        history=history,
    )


def _config_key(training: DecideTraining, rows: Sequence[Example]) -> str:
    """What must be equal for a saved state to be resumed."""
    settings = {k: v for k, v in asdict(training).items() if k not in ("threads", "prompt_format")}
    return config_key(settings, [[e.question, list(e.options), e.answer, e.context] for e in rows])
