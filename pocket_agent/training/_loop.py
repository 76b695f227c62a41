"""The optimisation loop every adapter shares: epochs of seeded batches, validation checks,
early stopping on the validation loss, and a saved state to resume from."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np

from ..errors import InvalidInputError
from ._progress import Progress
from ._resume import load_state, save_state

B = TypeVar("B")
T = TypeVar("T")


def length_batches(
    items: Sequence[T], length: Callable[[T], int], budget: int, rng: random.Random | None
) -> list[list[T]]:
    """Items grouped by similar length, each group within ``budget`` padded tokens; the
    groups in a seeded random order (``rng``) or by length (None)."""
    groups: list[list[T]] = []
    cur: list[T] = []
    for it in sorted(items, key=length):
        if cur and length(it) * (len(cur) + 1) > budget:
            groups.append(cur)
            cur = []
        cur.append(it)
    if cur:
        groups.append(cur)
    if rng is not None:
        rng.shuffle(groups)
    return groups


def check_settings(settings: object, *, ints: Sequence[str], numbers: Sequence[str]) -> None:
    """Raise :class:`InvalidInputError` unless ``settings.val_fraction`` lies in (0, 1), the
    ``ints`` fields are positive integers and the ``numbers`` fields positive finite numbers."""
    fraction = getattr(settings, "val_fraction", 0.5)
    if not 0.0 < fraction < 1.0:
        raise InvalidInputError("val_fraction must be between 0 and 1.")
    for name in ints:
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInputError(f"{name} must be a positive integer, got {value!r}.")
    for name in numbers:
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise InvalidInputError(f"{name} must be a positive number, got {value!r}.")


def peak_rss_mb() -> float:
    """The process's peak resident memory so far, in MB (what training needed at most)."""
    try:
        import resource
    except ImportError:  # not on Windows
        return math.nan
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024.0


@dataclass(frozen=True)
class LoopSettings:
    epochs: int
    evals_per_epoch: int
    patience: int
    seed: int


@dataclass
class LoopResult:
    """The best trainable state seen (by validation loss), and how training went."""

    best: dict[str, Any]
    best_loss: float
    base_loss: float
    steps: int
    history: list[dict[str, float]] = field(default_factory=list)


@dataclass
class Trainable(Generic[B]):
    """What the loop needs from a task.

    ``batches(rng)`` gives one epoch's batches in a seeded order; ``step(batch)`` runs one
    optimisation step and returns its loss; ``evaluate()`` returns the validation numbers
    (``val_loss`` first); ``snapshot()`` copies the trainable tensors and ``restore`` puts
    a snapshot back; ``optimizer`` is saved with the state so a resumed run continues it.
    """

    batches: Callable[[random.Random], Sequence[B]]
    step: Callable[[B], float]
    evaluate: Callable[[], dict[str, float]]
    snapshot: Callable[[], dict[str, Any]]
    restore: Callable[[dict[str, Any]], None]
    optimizer: Any


def run_loop(
    task: Trainable[B], settings: LoopSettings, progress: Progress, *, state_dir: Path | None, key: str
) -> LoopResult:
    """Train until ``settings.epochs`` are done or the validation loss stops improving.

    The state is saved in ``state_dir`` after every validation check; a later call with the
    same ``key`` (settings and data) continues from it, replaying the interrupted epoch's
    batch order and skipping the batches already trained.
    """
    rng = random.Random(settings.seed)  # noqa: S311 (a seeded batch order, not a secret)
    saved = load_state(state_dir, key)
    if saved is not None:
        task.restore(saved["current"])
        task.optimizer.load_state_dict(saved["optimizer"])
        rng.setstate(saved["epoch_rng"])
        start_epoch, skip, step, bad = saved["epoch"], saved["done_batches"], saved["step"], saved["bad"]
        best, best_loss, history, stopped = saved["best"], saved["best_loss"], saved["history"], saved["stopped"]
    else:
        first = task.evaluate()
        history = [{"step": 0.0, **first}]
        best, best_loss = task.snapshot(), first["val_loss"]
        start_epoch, skip, step, bad, stopped = 0, 0, 0, 0, False
    base_loss = history[0]["val_loss"] if history else math.nan
    for epoch in range(start_epoch, settings.epochs):
        if stopped:
            break
        epoch_rng = rng.getstate()  # replaying it gives this epoch's batch order again
        groups = task.batches(rng)
        n = len(groups)
        checks = {max(1, round(n * (k + 1) / settings.evals_per_epoch)) for k in range(settings.evals_per_epoch)}
        running: list[float] = []
        for g, batch in enumerate(groups, start=1):
            if g <= skip:  # trained before the state was saved
                continue
            running.append(task.step(batch))
            step += 1
            progress(f"epoch {epoch + 1}/{settings.epochs}", g, n, {"loss": float(np.mean(running[-20:]))})
            if g not in checks:
                continue
            numbers = task.evaluate()
            history.append({"step": float(step), **numbers})
            progress("validation", 1, 1, numbers)
            if numbers["val_loss"] < best_loss - 1e-4:
                best, best_loss, bad = task.snapshot(), numbers["val_loss"], 0
            else:
                bad += 1
            stopped = bad >= settings.patience
            last = g == n
            save_state(
                state_dir,
                {
                    "config": key,
                    "current": task.snapshot(),
                    "optimizer": task.optimizer.state_dict(),
                    "epoch": epoch + 1 if last else epoch,
                    "done_batches": 0 if last else g,
                    "epoch_rng": rng.getstate() if last else epoch_rng,
                    "step": step,
                    "bad": bad,
                    "best": best,
                    "best_loss": best_loss,
                    "history": history,
                    "stopped": stopped,
                },
            )
            if stopped:
                break
        skip = 0
    return LoopResult(best=best, best_loss=best_loss, base_loss=base_loss, steps=step, history=history)
