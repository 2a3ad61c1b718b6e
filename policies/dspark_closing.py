"""dspark in a closing run: draft only for the sequences that decide when the run ends.

Once every request is known and none waits (`PlanContext.closing`: generate's last wave, a closed
replay), the run ends with its slowest sequence, and every step until then pays its fixed cost
whatever the others do. A sequence expected to finish by then at one token a step gains the run
nothing from drafting: its verified drafts only widen steps that run anyway (on a step priced
a + b N, its share b N over its remaining steps is least at N = 1 a step). So it steps plain, and
the sequences on the critical path keep the plan's budgets.

That holds where a step's price is linear in its tokens (past the compute knee: a verified token
costs what a decoded one does). Where it is concave, as on a CPU at batch 16 (a 16-row step ~12 ms,
a 1-row one ~6 ms, 16 more verified tokens ~2.5 ms), a sequence's accepted drafts are its tokens
bought at the cheap margin of a wide step instead of in the later steps it would keep alive, so
the rule applies only where the cost model prices a verified token at least what a decoded one
costs at half the batch (`decode_bound`).

A sequence's tokens a step are the lower of its prior's and its own measure in this run (`Pace`):
an optimistic guess for the slowest sequence would end the others early, and the run would then
finish its slowest alone, in small steps that each pay the fixed part of a step.
"""

from __future__ import annotations

import numpy as np

from specdepth.policies.base import StepCost

PACE_STEPS = 4  # steps allowed to draft before a sequence's own measure counts


def decode_bound(cost: StepCost, batch_size: int, context_tokens: int, table: np.ndarray | None = None) -> bool:
    """Whether the step prices a verified token (N from B to 2B) at least what a decoded one costs
    (N from B / 2 to B, as the batch shrinks): the closing rule's premise. False at batch 1.
    `table`: the step's target times by N (`StepPrices.target`, the same numbers), where priced."""
    B = batch_size
    half = B // 2
    if half < 1:
        return False
    at = np.array([half, B, 2 * B])
    t = table[at] if table is not None and table.size > 2 * B else \
        np.asarray(cost.target_time(at, context_tokens), np.float64)  # (3,)
    return bool((t[2] - t[1]) / B >= (1.0 - 1e-9) * (t[1] - t[0]) / (B - half))  # (rounding apart)


def expected_tokens(survival: np.ndarray, budgets: np.ndarray) -> np.ndarray:
    """(B,) tokens a step emits per sequence at its budget: 1 + the prior survivals up to it.

    survival: (B, K) s_{r,j}; budgets: (B,) int64 in [0, K]."""
    B, K = survival.shape
    cum = np.concatenate([np.zeros((B, 1)), np.cumsum(np.clip(survival, 0.0, 1.0), axis=1)], axis=1)  # (B, K + 1)
    return 1.0 + cum[np.arange(B), np.clip(budgets, 0, K)]


def plain_rows(remaining: np.ndarray, survival: np.ndarray, budgets: np.ndarray,
               measured: np.ndarray | None = None) -> np.ndarray:
    """(B,) bool: the drafting sequences that step plain, being expected to finish at one token a
    step no later than the slowest sequence finishes at its budget. The slowest (ties included)
    keep drafting, so their measure stays current.

    remaining: (B,) tokens each may still emit; survival: (B, K); budgets: (B,) the plan's;
    measured: (B,) tokens a step each has emitted while allowed to draft (NaN: not yet known)."""
    remaining = np.asarray(remaining, np.float64)
    rate = expected_tokens(survival, budgets)
    if measured is not None:
        rate = np.fmin(rate, measured)  # NaN: the prior's
    steps = remaining / rate  # (B,) expected steps to finish
    slowest = steps.max(initial=0.0)
    return (budgets > 0) & (remaining <= slowest) & (steps < slowest)


class Pace:
    """Each running sequence's tokens per step over the steps it was allowed to draft (explicit state)."""

    def __init__(self) -> None:
        self.steps: dict[int, int] = {}
        self.tokens: dict[int, int] = {}

    def observe(self, seq_ids: np.ndarray, budgets: np.ndarray, accepted: np.ndarray, finished: np.ndarray) -> None:
        drafting = np.flatnonzero(budgets > 0)  # a plain step (most, once the rail or a closing run rules) loops over none
        for sid, a in zip(seq_ids[drafting].tolist(), accepted[drafting].tolist()):
            self.steps[sid] = self.steps.get(sid, 0) + 1
            self.tokens[sid] = self.tokens.get(sid, 0) + 1 + a
        for sid in finished.tolist():
            self.steps.pop(sid, None)
            self.tokens.pop(sid, None)

    def rate(self, seq_ids: np.ndarray) -> np.ndarray:
        """(B,) tokens a step, NaN where fewer than PACE_STEPS steps are known."""
        out = np.full(len(seq_ids), np.nan)
        for r, sid in enumerate(seq_ids.tolist()):
            n = self.steps.get(sid, 0)
            if n >= PACE_STEPS:
                out[r] = self.tokens[sid] / n
        return out
