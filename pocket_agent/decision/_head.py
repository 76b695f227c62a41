"""The pointer head: standardise each option's feature vector, score it linearly, softmax.

Training is plain numpy: multinomial logistic regression over a variable number of
options per question (softmax within each question), L2 penalty, Adam on the full batch,
early stopping on a held-out split, the penalty picked from a small grid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from ..errors import InvalidInputError

F32 = NDArray[np.float32]
F64 = NDArray[np.float64]


@dataclass
class LinearHead:
    """``score_i = weight · ((x_i - mean) * scale) + bias``; probabilities are the softmax over options."""

    mean: F32
    scale: F32
    weight: F32
    bias: float = 0.0

    @property
    def dim(self) -> int:
        return int(self.weight.shape[0])

    def scores(self, x: NDArray[np.floating]) -> F64:
        """Raw scores for ``x`` of shape ``[n_options, dim]``."""
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise InvalidInputError(f"Pointer head expects features of shape [n, {self.dim}], got {x.shape}.")
        z = (x.astype(np.float64) - self.mean) * self.scale
        return np.asarray(z @ self.weight.astype(np.float64) + self.bias, dtype=np.float64)


def softmax(s: NDArray[np.floating]) -> F64:
    """Numerically stable softmax of a 1-D score vector."""
    v = np.asarray(s, dtype=np.float64)
    v = v - v.max()
    e = np.exp(v)
    return np.asarray(e / e.sum(), dtype=np.float64)


@dataclass
class FitReport:
    """What :func:`fit_head` chose and how it scored."""

    l2: float
    iterations: int
    train_accuracy: float
    stop_accuracy: float
    grid: list[dict[str, float]] = field(default_factory=list)


class _Problem:
    """Questions flattened into rows; ``starts[q]`` is the first row of question ``q``."""

    def __init__(self, feats: Sequence[F32 | F64], labels: Sequence[int]) -> None:
        self.x = np.concatenate([np.asarray(f, dtype=np.float64) for f in feats], axis=0)
        sizes = np.array([len(f) for f in feats])
        self.starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self.qid = np.repeat(np.arange(len(feats)), sizes)
        self.target = self.starts + np.asarray(labels, dtype=np.int64)
        self.n_q = len(feats)

    def loss_grad(self, z: F64, w: F64, l2: float) -> tuple[float, F64]:
        s = z @ w
        smax = np.maximum.reduceat(s, self.starts)
        e = np.exp(s - smax[self.qid])
        denom = np.add.reduceat(e, self.starts)
        p = e / denom[self.qid]
        nll = float(np.mean(np.log(denom) + smax - s[self.target]))
        g_s = p.copy()
        g_s[self.target] -= 1.0
        grad = z.T @ g_s / self.n_q + l2 * w
        return nll + 0.5 * l2 * float(w @ w), grad

    def accuracy(self, z: F64, w: F64) -> float:
        s = z @ w
        smax = np.maximum.reduceat(s, self.starts)
        # first row reaching the max within each question
        is_max = s >= smax[self.qid]
        first_max = np.full(self.n_q, -1, dtype=np.int64)
        rows = np.nonzero(is_max)[0]
        for r in rows[::-1]:
            first_max[self.qid[r]] = r
        return float(np.mean(first_max == self.target))


def _adam(
    prob: _Problem,
    z: F64,
    l2: float,
    *,
    iters: int,
    lr: float,
    stop: tuple[_Problem, F64] | None,
    check_every: int,
    patience: int,
) -> tuple[F64, int, float]:
    w = np.zeros(z.shape[1])
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    b1, b2, eps = 0.9, 0.999, 1e-8
    best_w, best_it, best_loss = w.copy(), 0, np.inf
    bad = 0
    for it in range(1, iters + 1):
        _, g = prob.loss_grad(z, w, l2)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        w = w - lr * (m / (1 - b1**it)) / (np.sqrt(v / (1 - b2**it)) + eps)
        if stop is not None and it % check_every == 0:
            sp, sz = stop
            loss, _ = sp.loss_grad(sz, w, 0.0)
            if loss < best_loss - 1e-5:
                best_w, best_it, best_loss, bad = w.copy(), it, loss, 0
            else:
                bad += 1
                if bad >= patience:
                    break
    if stop is None:
        return w, iters, float("nan")
    return best_w, best_it, float(best_loss)


def fit_head(
    train_x: Sequence[F32 | F64],
    train_y: Sequence[int],
    *,
    stop_x: Sequence[F32 | F64],
    stop_y: Sequence[int],
    l2_grid: Sequence[float] = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0),
    max_iter: int = 2000,
    lr: float = 0.02,
    check_every: int = 10,
    patience: int = 10,
    refit: bool = True,
) -> tuple[LinearHead, FitReport]:
    """Fit a :class:`LinearHead`.

    ``train_x[q]`` is the ``[n_options, dim]`` feature matrix of question ``q`` and
    ``train_y[q]`` the index of its right option. For each L2 penalty the head is fitted
    on ``train`` with early stopping on the ``stop`` split (validation loss checked every
    ``check_every`` steps, ``patience`` checks without improvement); the penalty with the
    lowest stop-split loss wins. With ``refit`` the winner is refitted on train + stop for
    the chosen number of steps.
    """
    if not train_x or not stop_x:
        raise InvalidInputError("fit_head needs at least one training and one stopping question.")
    all_x = list(train_x) + list(stop_x)
    stacked = np.concatenate([np.asarray(f, dtype=np.float64) for f in train_x], axis=0)
    mean = stacked.mean(axis=0)
    std = stacked.std(axis=0)
    scale = 1.0 / np.where(std > 1e-6, std, 1.0)
    tr = _Problem(train_x, train_y)
    st = _Problem(stop_x, stop_y)
    z_tr = (tr.x - mean) * scale
    z_st = (st.x - mean) * scale
    grid: list[dict[str, float]] = []
    best: tuple[float, float, int] | None = None
    for l2 in l2_grid:
        w, it, loss = _adam(
            tr, z_tr, l2, iters=max_iter, lr=lr, stop=(st, z_st), check_every=check_every, patience=patience
        )
        acc = st.accuracy(z_st, w)
        grid.append({"l2": float(l2), "iterations": float(it), "stop_loss": loss, "stop_accuracy": acc})
        if best is None or loss < best[0]:
            best = (loss, float(l2), max(it, check_every))
    assert best is not None
    _, l2, iters = best
    if refit:
        full = _Problem(all_x, list(train_y) + list(stop_y))
        all_stacked = full.x
        mean = all_stacked.mean(axis=0)
        std = all_stacked.std(axis=0)
        scale = 1.0 / np.where(std > 1e-6, std, 1.0)
        z_full = (full.x - mean) * scale
        w, _, _ = _adam(full, z_full, l2, iters=iters, lr=lr, stop=None, check_every=check_every, patience=patience)
        train_acc = full.accuracy(z_full, w)
        stop_acc = next(g["stop_accuracy"] for g in grid if g["l2"] == l2)
    else:
        w, _, _ = _adam(tr, z_tr, l2, iters=iters, lr=lr, stop=None, check_every=check_every, patience=patience)
        train_acc = tr.accuracy(z_tr, w)
        stop_acc = st.accuracy(z_st, w)
    head = LinearHead(
        mean=mean.astype(np.float32), scale=scale.astype(np.float32), weight=w.astype(np.float32), bias=0.0
    )
    return head, FitReport(l2=l2, iterations=iters, train_accuracy=train_acc, stop_accuracy=stop_acc, grid=grid)
