"""numpy statements of the numba kernels in `acceptance.kernels`, for tests only.

Each function here is the arithmetic a kernel compiles, written with numpy array calls in the
same order, so the tests can check a kernel against it (bit for bit where the order allows).
Nothing in the library calls them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specdepth.adaptive.acceptance.config import CAT, EPS, _clip, _logit, _sigmoid


def linear(top1: np.ndarray, entropy: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(B, J) w0 log t + w1 (-log(1 - t)) + w2 H + w3 with per-column weights w (J, 4): the
    regression's logit inside `acceptance.kernels.calibrate_kernel`."""
    t = _clip(top1, EPS, 1 - EPS)
    return w[:, 0] * np.log(t) - w[:, 1] * np.log1p(-t) + w[:, 2] * np.maximum(entropy, 0.0) + w[:, 3]


def seq_shift(model: Any, rows: np.ndarray, pred_cols: tuple[int, int]) -> np.ndarray:
    """(B,) `acceptance.kernels.seq_shift_kernel`'s (and `prior_kernel`'s) per-sequence shift: the log-odds
    of each sequence's Beta-Bernoulli posterior against the predictions in `pred_cols` of its
    `AcceptanceModel.seq_stats` row (0 when unknown, rows < 0, or nothing observed yet)."""
    out = np.zeros(len(rows))
    known = rows >= 0
    if not known.any():
        return out
    st = model.seq_stats[rows[known]]  # (b, SEQ_COLS)
    n = st[:, 0] + st[:, 1]
    g = st[:, pred_cols[0]] / np.maximum(st[:, pred_cols[0]] + st[:, pred_cols[1]], EPS)
    k = model.config.seq_strength
    theta = (st[:, 0] + k * g) / (n + k)
    out[known] = np.where(n > 0, _logit(theta) - _logit(g), 0.0)
    return out


def cat_shift(model: Any, rows: np.ndarray) -> np.ndarray:
    """(B,) `acceptance.kernels.seq_shift_kernel`'s position-1 shift: each sequence's last-step category's
    (`AcceptanceModel.cat_shift`); unknown sequences are category 0, no step yet."""
    cat = np.zeros(len(rows), np.int64)  # (B,)
    known = rows >= 0
    cat[known] = model.seq_stats[rows[known], CAT]
    return model.cat_shift[cat]


def fit_position(cells: np.ndarray, prior: np.ndarray, w: np.ndarray, ridge: float, newton_steps: int) -> np.ndarray:
    """`acceptance.kernels.fit_position_kernel`: MAP logistic regression on one position's binned
    statistics (weights (4,)), by damped Newton steps."""
    used = cells[:, 0] > 0
    n, acc = cells[used, 0], cells[used, 1]  # (m,)
    x = np.concatenate([cells[used, 2:] / n[:, None], np.ones((len(n), 1))], axis=1)  # (m, 4)
    w = w.copy()
    for _ in range(newton_steps):
        p = _sigmoid(x @ w)
        grad = x.T @ (acc - n * p) - ridge * (w - prior)
        hess = (x.T * (n * p * (1 - p))) @ x + ridge * np.eye(4)
        step = np.linalg.solve(hess, grad)
        step *= min(1.0, 4.0 / max(np.abs(step).max(), EPS))  # damp wild first steps
        w += step
        if np.abs(step).max() < 1e-7:
            break
    return w
