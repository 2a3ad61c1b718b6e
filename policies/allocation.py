"""DSpark's global allocation: which (sequence, position) draft slots a step verifies.

Given survivals s_{r,j} (the chance draft tokens 1..j of sequence r are all accepted; non-increasing
in j, zero past what r drafted) and a step-time model, choose verify lengths d_r maximising

    Theta = tau / (extra + target_time(N)),   tau = sum_r (1 + sum_{j<=d_r} s_{r,j}),
                                              N   = sum_r (d_r + 1),

the expected emitted tokens per second (DESIGN.md "Allocation"). Extending r by one position gains
exactly s_{r,d_r+1}, so: sort every slot by s (descending; ties: smaller j first, then smaller r)
and admit the prefix up to the FIRST slot whose admission does not raise Theta. Stopping at the
first non-improvement (rather than taking the best prefix) is what keeps it lossless: whether
(r, j) is admitted depends only on the slots ranked before it, never on s_{r,j+1..} (which depend
on the drafted token x_{r,j}).

The admitted set is a prefix of the order, so it is fixed by its size k and the survival v* of its
last slot: every slot with s > v*, plus the first few with s == v* in (j, r) order. Survivals are
held position-major, (J, B), whose row-major order is exactly that tie order, and in fixed point,
int64 s * 2^32, so sums are exact integers (no rounding that could depend on anything but the
prefix).

This module holds those shared definitions and `top_k_lengths`, the fixed-budget version
vllm-adaptive uses. dspark runs the rule compiled (policies/kernels.py, policies/verify_columns.py);
its numpy reference, the tests' oracle, is policies/kernels_reference.py.
"""

from __future__ import annotations

import numpy as np

ONE = 1 << 32  # fixed point: survival s is held as int64 floor(s * ONE)


def unit(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """x clipped to [0, 1], NaN read as 0: a confidence or survival the allocation can trust."""
    out = np.fmax(x, 0.0, out=out)
    return np.fmin(out, 1.0, out=out)


def fixed_point(survival: np.ndarray) -> np.ndarray:
    """(B, J) float survivals -> (J, B) int64 position-major fixed point, clipped to [0, ONE]."""
    survival = np.asarray(survival, dtype=np.float64)
    out = unit(survival.T, out=np.empty(survival.shape[::-1]))  # (J, B)
    out *= ONE
    return out.astype(np.int64)


def lengths_at(q_t: np.ndarray, k: int, vstar: int) -> np.ndarray:
    """Per-sequence counts of the k best slots, ties taken in (j, r) order.

    Args:
        q_t: (J, B) fixed-point survivals, position-major.
        k: slots admitted.
        vstar: the k-th best slot (the last admitted), fixed point.

    Returns:
        (B,) int64 verify lengths.
    """
    n = q_t.shape[1]
    if k == 0:
        return np.zeros(n, np.int64)
    d = (q_t >= vstar).sum(axis=0, dtype=np.int64)  # (B,) slots at least as good as it
    excess = int(d.sum()) - k  # slots tied with it but ranked after it (rare)
    if excess > 0:
        tied = np.flatnonzero(q_t == vstar)[-excess:]  # row-major = (j, r) order: the last ones
        d -= np.bincount(tied % n, minlength=n)
    return d


def top_k_lengths(survival: np.ndarray, k: int) -> np.ndarray:
    """Per-sequence counts of the k highest survivals (ties: smaller j, then smaller r).

    Args:
        survival: (B, J) non-increasing in j; zero slots are never taken.
        k: the global slot budget.

    Returns:
        (B,) int64 lengths, summing to min(k, positive slots).
    """
    q_t = fixed_point(survival)  # (J, B)
    pos = q_t[q_t > 0]
    k = min(int(k), pos.size)
    if k <= 0:
        return np.zeros(q_t.shape[1], np.int64)
    return lengths_at(q_t, k, -np.partition(-pos, k - 1)[k - 1])  # vstar: the k-th largest
