"""Hand-built contexts and a trivial cost model, for testing depth policies without a model.

A user writing their own policy (DESIGN.md, use 2) can unit-test it exactly as the built-ins are
tested: build a `PlanContext` / `DraftContext` / `VerifyContext` / `StepOutcome` from a few small
lists, call the policy, check the answer. Pure numpy, like the rest of `policies/`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specdepth.policies.base import DraftContext, PlanContext, StepCost, StepOutcome, VerifyContext

ArrayLike = Sequence[float] | Sequence[int] | np.ndarray


@dataclass(frozen=True)
class LinearCost:
    """A `StepCost` that is affine in its arguments (seconds); all slopes 0 gives fixed times.

    target_time(N) = target_s + target_per_token_s * N
    draft_time(B)  = draft_s + draft_per_seq_s * B
    Context length is ignored.
    """

    target_s: float = 0.020  # one target pass, whatever the step tokens
    draft_s: float = 0.002  # one draft pass, whatever the batch
    target_per_token_s: float = 0.0
    draft_per_seq_s: float = 0.0

    def target_time(self, n_tokens: np.ndarray | int, context_tokens: int = 0) -> np.ndarray | float:
        return self.target_s + self.target_per_token_s * np.asarray(n_tokens, dtype=np.float64)

    def draft_time(self, batch_size: int, context_tokens: int = 0) -> float:
        return self.draft_s + self.draft_per_seq_s * batch_size


def _i64(x: ArrayLike | None, n: int, fill: int = 0) -> np.ndarray:
    return np.full(n, fill, np.int64) if x is None else np.asarray(x, dtype=np.int64).reshape(n)


def _table(x: ArrayLike | None, n: int) -> np.ndarray:
    """(n, J) float table from a list of rows (ragged rows are zero-padded, as the engine does)."""
    if x is None:
        return np.zeros((n, 0))
    rows = [np.asarray(r, dtype=np.float64).ravel() for r in x]
    width = max((len(r) for r in rows), default=0)
    out = np.zeros((n, width))  # (n, J)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def make_plan_ctx(
    batch_size: int,
    *,
    step: int = 0,
    seq_ids: ArrayLike | None = None,
    context_lens: ArrayLike | None = None,
    max_depth: int = 8,
    prior_conf: np.ndarray | float = 0.7,
    cost: StepCost | None = None,
) -> PlanContext:
    """A `PlanContext` for `batch_size` sequences (ids 0..B-1, 100 tokens each by default).

    Args:
        prior_conf: a (B, K) array, or one number broadcast to (B, K).
    """
    ids = np.arange(batch_size, dtype=np.int64) if seq_ids is None else _i64(seq_ids, batch_size)
    prior = np.broadcast_to(np.asarray(prior_conf, np.float64), (batch_size, max_depth)).copy()
    return PlanContext(
        step=step,
        seq_ids=ids,
        context_lens=_i64(context_lens, batch_size, 100),
        max_depth=max_depth,
        priors=prior,
        cost=cost if cost is not None else LinearCost(),
    )


def make_draft_ctx(
    top1: Sequence[Sequence[float]],
    *,
    conf: Sequence[Sequence[float]] | None = None,
    budgets: ArrayLike | None = None,
    seq_ids: ArrayLike | None = None,
    step: int = 0,
) -> DraftContext:
    """A `DraftContext` after drafting `len(top1[r])` positions of each sequence r.

    `conf` defaults to `top1` (an identity calibration); entropy is left at zero.
    """
    n = len(top1)
    t1 = _table(top1, n)  # (B, j)
    c = _table(conf, n) if conf is not None else t1.copy()
    drafted = np.array([len(r) for r in top1], np.int64)
    return DraftContext(
        step=step,
        seq_ids=np.arange(n, dtype=np.int64) if seq_ids is None else _i64(seq_ids, n),
        budgets=_i64(budgets, n, t1.shape[1]),
        drafted=drafted,
        conf=c,
        top1=t1,
        entropy=np.zeros_like(t1),
    )


def make_verify_ctx(
    conf: Sequence[Sequence[float]],
    *,
    top1: Sequence[Sequence[float]] | None = None,
    seq_ids: ArrayLike | None = None,
    cost: StepCost | None = None,
    step: int = 0,
) -> VerifyContext:
    """A `VerifyContext` with `len(conf[r])` drafted positions for each sequence r."""
    n = len(conf)
    c = _table(conf, n)  # (B, j)
    return VerifyContext(
        step=step,
        seq_ids=np.arange(n, dtype=np.int64) if seq_ids is None else _i64(seq_ids, n),
        context_lens=np.full(n, 100, np.int64),
        drafted=np.array([len(r) for r in conf], np.int64),
        conf=c,
        top1=_table(top1, n) if top1 is not None else c.copy(),
        cost=cost if cost is not None else LinearCost(),
    )


def make_outcome(
    accepted: ArrayLike,
    verified: ArrayLike,
    *,
    step: int = 0,
    seq_ids: ArrayLike | None = None,
    budgets: ArrayLike | None = None,
    drafted: ArrayLike | None = None,
    top1: Sequence[Sequence[float]] | None = None,
    conf: Sequence[Sequence[float]] | None = None,
    step_time_s: float = 0.030,
    draft_time_s: float = 0.010,
    finished: ArrayLike | None = None,
) -> StepOutcome:
    """A `StepOutcome`; budgets and drafted default to `verified`, top1/conf to 0.5 everywhere."""
    acc = np.asarray(accepted, np.int64).ravel()
    n = len(acc)
    ver = _i64(verified, n)
    default_rows = [[0.5] * int(v) for v in ver]
    t1 = _table(top1 if top1 is not None else default_rows, n)
    return StepOutcome(
        step=step,
        seq_ids=np.arange(n, dtype=np.int64) if seq_ids is None else _i64(seq_ids, n),
        budgets=ver.copy() if budgets is None else _i64(budgets, n),
        drafted=ver.copy() if drafted is None else _i64(drafted, n),
        verified=ver,
        accepted=acc,
        top1=t1,
        conf=_table(conf, n) if conf is not None else t1.copy(),
        step_time_s=step_time_s,
        draft_time_s=draft_time_s,
        target_time_s=step_time_s - draft_time_s,
        context_lens=np.full(n, 100, np.int64),
        finished=np.zeros(0, np.int64) if finished is None else np.asarray(finished, np.int64).ravel(),
    )
