"""dspark's drafter choice with the hybrid drafter: keep the model-free draft, or draft with the model.

Two candidate steps are priced by the plan's throughput objective, Theta = tau / step time, each
with its best set of (sequence, position) slots admitted in order of survival:

- every sequence keeps its model-free draft (survivals from that draft's calibrated
  confidences), drafting costs nothing;
- the sequences whose draft-model draft is expected to accept more than their free draft (its
  prior survivals to the plan's budget against the free draft's survivals) switch to the model,
  and the step pays the draft passes of the deepest of them.

The better Theta wins. A sequence that keeps its free draft may keep an empty one (nothing drafted
for it); `verify` decides how much of a kept draft to check, none included.
"""

from __future__ import annotations

import numpy as np


def best_theta(slots: np.ndarray, n: int, times: np.ndarray, extra: float) -> float:
    """max over k of (n + the k largest slot survivals) / (times[k] + extra): the throughput of
    the best prefix of the sorted slots. slots: (M,) survivals; times: (>= M + 1,) step times by
    slots verified (the n sequences' own tokens included in times[0])."""
    s = np.sort(slots[slots > 0])[::-1]
    m = min(s.size, times.size - 1)
    tau = n + np.concatenate(([0.0], np.cumsum(s[:m])))  # (m + 1,)
    return float(np.max(tau / (times[: m + 1] + extra)))


def choose_free(free_surv: np.ndarray, prior_surv: np.ndarray, budgets: np.ndarray, times: np.ndarray,
                pass_time: float) -> np.ndarray:
    """(B,) bool: the sequences that keep their model-free draft (module docstring).

    Args:
        free_surv: (B, J) survivals of the free drafts (0 past each drafted length).
        prior_surv: (B, K) the draft model's prior survivals.
        budgets: (B,) int64 the plan's draft-model budgets.
        times: (>= B K + 1,) target time by slots verified past the B own tokens.
        pass_time: one draft pass over the batch.
    """
    B, K = prior_surv.shape
    model_surv = prior_surv * (np.arange(K)[None, :] < budgets[:, None])  # (B, K)
    switch = (model_surv.sum(1) > free_surv.sum(1)) & (budgets > 0)  # (B,)
    keep = np.ones(B, bool)
    if not switch.any():
        return keep
    theta_free = best_theta(free_surv.ravel(), B, times, 0.0)
    mixed = np.concatenate((free_surv[~switch].ravel(), model_surv[switch].ravel()))
    theta_mixed = best_theta(mixed, B, times, float(budgets[switch].max()) * pass_time)
    return ~switch if theta_mixed > theta_free else keep
