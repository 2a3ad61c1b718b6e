"""Compiled loops for the acceptance model's per-call hot path (numba).

`AcceptanceModel.calibrate` runs after every draft pass (the controller shows a policy the
calibrated confidences of the positions drafted so far) and at every causal verify call. In numpy
it is ~20 small array calls, ~33 us a call on this machine whatever the batch, so dspark paid
~0.25 ms a step for it at batch 1. The kernel is the same arithmetic in one compiled call, in the
same order (`_linear`, then the shift, the clip and the logistic); `tests/adaptive/test_acceptance.py`
compares the two.

Pure arithmetic on the arrays passed in: no state, clock or RNG.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True)
def calibrate_kernel(top1: np.ndarray, entropy: np.ndarray, w: np.ndarray, shift: np.ndarray,
                     eps: float) -> np.ndarray:
    """(B, J) sigmoid(clip(w0 log t - w1 log(1 - t) + w2 max(H, 0) + w3 + shift_r, +-30)), t =
    top1 clipped to [eps, 1 - eps]; 0 where top1 <= 0 (or NaN).

    Args:
        top1, entropy: (B, J) float64 features.
        w: (J, 4) float64 per-column weights.
        shift: (B,) float64 per-sequence log-odds shift.
    """
    B, J = top1.shape
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
            z = w[j, 0] * math.log(t) - w[j, 1] * math.log1p(-t) + w[j, 2] * h + w[j, 3] + shift[r]
            if z < -30.0:
                z = -30.0
            elif z > 30.0:
                z = 30.0
            out[r, j] = 1.0 / (1.0 + math.exp(-z))
    return out
