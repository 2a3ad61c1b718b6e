"""Compiled loops for the acceptance model's per-call hot paths (numba).

`AcceptanceModel.calibrate` runs after every draft pass and at every causal verify call, and
`observe` once a step for every speculating policy; in numpy each is tens of small array calls,
paid whatever the batch. These kernels are the same arithmetic in one call each, in the same
order; `tests/adaptive/acceptance/test_acceptance.py` checks them against the numpy statements in
`kernels_reference` (and, for `observe_kernel`, against numpy tallies of random ragged steps).

Pure arithmetic on the arrays passed in: no state, clock or RNG.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True)
def calibrate_kernel(top1: np.ndarray, entropy: np.ndarray, w: np.ndarray, shift: np.ndarray,
                     first_shift: np.ndarray, eps: float) -> np.ndarray:
    """(B, J) sigmoid(clip(w0 log t - w1 log(1 - t) + w2 max(H, 0) + w3 + shift_r [+ first_r in
    column 0], +-30)), t = top1 clipped to [eps, 1 - eps]; 0 where top1 <= 0 (or NaN).

    Args:
        top1, entropy: (B, J) float64 features.
        w: (P, 4) float64 weights of columns 0..P-1; columns past P - 1 take row P - 1.
        shift: (B,) float64 per-sequence log-odds shift.
        first_shift: (B,) float64 more log-odds for column 0 (position 1) only.
    """
    B, J = top1.shape
    last = w.shape[0] - 1
    out = np.zeros((B, J))
    for r in range(B):
        for j in range(J):
            t = top1[r, j]
            if not t > 0.0:
                continue
            if t < eps:
                t = eps
            if t > 1.0 - eps:
                t = 1.0 - eps
            h = entropy[r, j]
            if h < 0.0:
                h = 0.0
            k = min(j, last)
            z = w[k, 0] * math.log(t) - w[k, 1] * math.log1p(-t) + w[k, 2] * h + w[k, 3] + shift[r]
            if j == 0:
                z += first_shift[r]
            if z < -30.0:
                z = -30.0
            elif z > 30.0:
                z = 30.0
            out[r, j] = 1.0 / (1.0 + math.exp(-z))
    return out


@njit(cache=True)
def seq_shift_kernel(rows: np.ndarray, seq_stats: np.ndarray, cat_shift: np.ndarray, strength: float, eps: float,
                     cat_col: int) -> tuple[np.ndarray, np.ndarray]:
    """(B,) `kernels_reference.seq_shift(model, rows, (2, 3))` and (B,) `cat_shift(model, rows)`:
    each sequence's Beta-Bernoulli log-odds shift on columns (0, 1) against (2, 3) (0 when unknown,
    rows < 0, or nothing observed yet), and its last-step category's shift (category 0 when unknown)."""
    B = rows.shape[0]
    shift, first = np.zeros(B), np.empty(B)
    for r in range(B):
        i, cat = rows[r], 0
        if i >= 0:
            cat = int(seq_stats[i, cat_col])
            shift[r] = _row_shift(seq_stats, i, 2, strength, eps)
        first[r] = cat_shift[cat]
    return shift, first


@njit(cache=True)
def _row_shift(seq_stats: np.ndarray, i: int, pred: int, strength: float, eps: float) -> float:
    """`kernels_reference.seq_shift` of seq_stats row i (known): the Beta-Bernoulli log-odds shift of
    its accepted / rejected counts (columns 0, 1) against the predictions in columns (pred, pred + 1);
    0 with nothing observed yet."""
    n = seq_stats[i, 0] + seq_stats[i, 1]
    if not n > 0:
        return 0.0
    g = seq_stats[i, pred] / max(seq_stats[i, pred] + seq_stats[i, pred + 1], eps)
    theta = (seq_stats[i, 0] + strength * g) / (n + strength)
    return _logit_at(theta) - _logit_at(g)


@njit(cache=True)
def _logit_at(p: float) -> float:
    """`acceptance.config._logit` of one number: clipped to [1e-4, 1 - 1e-4]."""
    p = min(max(p, 1e-4), 1.0 - 1e-4)
    return math.log(p) - math.log1p(-p)


@njit(cache=True)
def prior_kernel(rows: np.ndarray, seq_stats: np.ndarray, base: np.ndarray, strength: float, eps: float,
                 cat_col: int) -> np.ndarray:
    """(B, K) `AcceptanceModel.prior_conf`: sigmoid(clip(base[state_r] + shift_r, +-30)), state_r
    the sequence's last-step category (column `cat_col` of its seq_stats row; 0 for rows < 0,
    unknown sequences), shift_r its Beta-Bernoulli log-odds shift on columns (0, 1) against
    (4, 5) (`kernels_reference.seq_shift`; 0 when unknown or nothing observed yet).

    Args:
        rows: (B,) int64 seq_stats rows, -1 for unknown sequences.
        seq_stats: (rows, SEQ_COLS) float64.
        base: (S, K) float64 planning logits per state.
    """
    B, K = rows.shape[0], base.shape[1]
    out = np.empty((B, K))
    for r in range(B):
        state, shift = 0, 0.0
        i = rows[r]
        if i >= 0:
            state = int(seq_stats[i, cat_col])
            shift = _row_shift(seq_stats, i, 4, strength, eps)
        for j in range(K):
            z = min(max(base[state, j] + shift, -30.0), 30.0)
            out[r, j] = 1.0 / (1.0 + math.exp(-z))
    return out


@njit(cache=True)
def observe_kernel(top1: np.ndarray, entropy: np.ndarray, d: np.ndarray, a: np.ndarray, conf: np.ndarray,
                   g_conf: np.ndarray, g_rate: np.ndarray, first_base: np.ndarray, rows: np.ndarray,
                   pos: np.ndarray, z_edges: np.ndarray, h_edges: np.ndarray, eps: float, metrics: np.ndarray,
                   brier_sum: np.ndarray, seq_stats: np.ndarray, state_counts: np.ndarray, cells: np.ndarray,
                   cat_stats: np.ndarray) -> int:
    """One step's tallies of `AcceptanceModel.observe`, added in place; returns the number of
    conditional observations. Position j + 1 of row r is verified iff j < d_r, counted iff also
    j <= a_r, accepted (survived) iff j < a_r.

    Args:
        top1, entropy: (B, J) features; conf: (B, J) the model's confidences (for the calibration
            tally); g_conf: (B, J) the global model's; g_rate: (B, J) each row's planning rates;
            first_base: (B,) the model's confidence at position 1 before its last-step shift.
        d, a: (B,) verified and accepted counts; rows: (B,) rows of seq_stats; pos: (J,) regression
            index of each column.
        metrics: (2, bins, 3) [calibrated, raw] x bin x (n, sum predicted, sum realised);
            brier_sum: (2,); seq_stats: (rows, 7), column 6 the last step's category
            (`last_category`), also its planning state; state_counts: (S, P, 2); cells: (P, cells, 5);
            cat_stats: (categories, 3) n, accepted, sum first_base at position 1.
    """
    B, J = top1.shape
    nb = metrics.shape[1]
    nh = len(h_edges) + 1
    n_counted = 0
    for r in range(B):
        row = rows[r]
        cat = int(seq_stats[row, 6])  # also the planning state
        s_cal, s_raw = 1.0, 1.0
        for j in range(d[r]):
            y = 1.0 if j < a[r] else 0.0
            # calibration tally: predicted survival prod_{k <= j} c_k, realised 1[j < a]
            s_cal *= conf[r, j]
            t_raw = min(max(top1[r, j], 0.0), 1.0)
            s_raw *= t_raw
            for k in range(2):
                s = s_cal if k == 0 else s_raw
                b = min(int(s * nb), nb - 1)
                metrics[k, b, 0] += 1.0
                metrics[k, b, 1] += s
                metrics[k, b, 2] += y
                brier_sum[k] += (s - y) ** 2
            if j > a[r]:
                continue  # past the first rejection: never tested given its prefix
            n_counted += 1
            if j == 0:
                cat_stats[cat, 0] += 1.0
                cat_stats[cat, 1] += y
                cat_stats[cat, 2] += first_base[r]
            g, q = g_conf[r, j], g_rate[r, j]
            seq_stats[row, 0] += y
            seq_stats[row, 1] += 1.0 - y
            seq_stats[row, 2] += g
            seq_stats[row, 3] += 1.0 - g
            seq_stats[row, 4] += q
            seq_stats[row, 5] += 1.0 - q
            p = pos[j]
            state_counts[cat, p, 0] += 1.0
            state_counts[cat, p, 1] += y
            t = min(max(top1[r, j], eps), 1.0 - eps)
            pz = min(max(top1[r, j], 1e-4), 1.0 - 1e-4)
            z = math.log(pz) - math.log1p(-pz)
            zi = 0
            while zi < len(z_edges) and z_edges[zi] <= z:
                zi += 1
            h = entropy[r, j]
            hi = 0
            while hi < len(h_edges) and h_edges[hi] <= h:
                hi += 1
            c = zi * nh + hi
            cells[p, c, 0] += 1.0
            cells[p, c, 1] += y
            cells[p, c, 2] += math.log(t)
            cells[p, c, 3] += -math.log1p(-t)
            cells[p, c, 4] += max(h, 0.0)
        if d[r] > 0:
            seq_stats[row, 6] = last_category(d[r], a[r])
    return n_counted


@njit(cache=True)
def observe_step_kernel(top1: np.ndarray, entropy: np.ndarray, d: np.ndarray, a: np.ndarray, conf: np.ndarray,
                        w: np.ndarray, rows: np.ndarray, state_rates: np.ndarray, strength: float, z_edges: np.ndarray,
                        h_edges: np.ndarray, eps: float, metrics: np.ndarray, brier_sum: np.ndarray,
                        seq_stats: np.ndarray, state_counts: np.ndarray, cells: np.ndarray, cat_stats: np.ndarray) -> int:
    """`AcceptanceModel.observe`'s step in one call: the global model's confidences (`calibrate_kernel`
    without shifts), position 1's before its category shift (with the sequence's shift on columns
    (2, 3), as `seq_shift_kernel`), each row's planning rates (row `state_rates[CAT of its seq_stats
    row]`, (S, J)), then `observe_kernel`; rows must exist (`_row_for`). Returns its count."""
    B, J = top1.shape
    zero = np.zeros(B)
    g_conf = calibrate_kernel(top1, entropy, w, zero, zero, eps)  # (B, J)
    shift = np.empty(B)
    g_rate = np.empty((B, J))
    for r in range(B):
        shift[r] = _row_shift(seq_stats, rows[r], 2, strength, eps)
        g_rate[r] = state_rates[int(seq_stats[rows[r], 6])]
    first_base = calibrate_kernel(top1[:, :1], entropy[:, :1], w[:1], shift, zero, eps)[:, 0]  # (B,)
    pos = np.minimum(np.arange(J), w.shape[0] - 1)
    return observe_kernel(top1, entropy, d, a, conf, g_conf, g_rate, first_base, rows, pos, z_edges, h_edges, eps,
                          metrics, brier_sum, seq_stats, state_counts, cells, cat_stats)


@njit(cache=True)
def last_category(d: int, a: int) -> int:
    """Category in [1, 11) of a sequence's last verified step, d >= 1 positions verified, a of them
    accepted: its length (1, 2, 3, 4-7, 8 or more) and whether all were accepted. 0 (no verified
    step yet, or an idle step since) is set elsewhere."""
    b = d - 1 if d <= 3 else (3 if d < 8 else 4)
    return 1 + 2 * b + (0 if a == d else 1)


@njit(cache=True)
def fit_position_kernel(cells: np.ndarray, prior: np.ndarray, w0: np.ndarray, ridge: float, newton_steps: int,
                        eps: float) -> np.ndarray:
    """`AcceptanceModel._fit_position`: MAP logistic regression of one position's binned statistics,
    (4,) weights by damped Newton steps from `w0` toward `prior` (ridge `ridge`), stopping once a
    step moves no weight by 1e-7. cells: (N_CELLS, 2 + 3) rows (n, accepted, feature sums)."""
    m = 0
    for c in range(cells.shape[0]):
        if cells[c, 0] > 0:
            m += 1
    x = np.ones((m, 4))  # (m, 4) mean features of each used cell, and the intercept's column
    n = np.empty(m)
    acc = np.empty(m)
    i = 0
    for c in range(cells.shape[0]):
        if cells[c, 0] > 0:
            n[i], acc[i] = cells[c, 0], cells[c, 1]
            for f in range(3):
                x[i, f] = cells[c, 2 + f] / cells[c, 0]
            i += 1
    w = w0.copy()
    eye = np.eye(4)
    for _ in range(newton_steps):
        z = x @ w
        p = 1.0 / (1.0 + np.exp(-np.minimum(np.maximum(z, -30.0), 30.0)))
        grad = x.T @ (acc - n * p) - ridge * (w - prior)
        hess = (x.T * (n * p * (1 - p))) @ x + ridge * eye
        step = np.linalg.solve(hess, grad)
        step *= min(1.0, 4.0 / max(np.abs(step).max(), eps))  # damp wild first steps
        w += step
        if np.abs(step).max() < 1e-7:
            break
    return w
