"""oracle: the replay-only ceiling. It knows each sequence's true match length this step.

A sequence at output position t whose draft chain matches the target for m_r tokens accepts
min(d_r, m_r) of d_r verified tokens, so an oracle never verifies a token that will be rejected:
d_r <= m_r, every verified token is emitted, nothing is wasted. What is left to choose is how many:
per step, over a common draft depth D (the draft's sequential passes) and a total of S verified
tokens, it maximises this step's goodput

    (B + S) / (D * draft_time(B, ctx) + target_time(B + S, ctx)),   S <= sum_r min(m_r, D),

then spreads S over the sequences by water-filling (d_r = min(m_r, level), the remainder one each to
the longest matches), and sets the draft budgets L_r = d_r (it drafts only what it verifies). With a
flat cost this verifies every matching token; past the compute knee it stops where an extra token
costs more time than it earns. Per-step maximisation is greedy, not a proof of optimality over a
whole run, but no depth policy with this draft sees more, so in practice it is the ceiling.

The true match lengths come in `PlanContext.oracle_match`, which only the replay simulator sets
(`experiments/replay/simulator.py`, already capped by the tokens each request may still emit). Live, where
nobody knows them, `plan` raises.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from specdepth.policies.base import DepthPolicy, PlanContext


class OracleUnavailable(RuntimeError):
    """The oracle was asked to plan without true match lengths (i.e. outside a replay)."""


def best_depth(match: np.ndarray, batch: int, draft_s: float, target_s: np.ndarray) -> tuple[int, int]:
    """(D, S) maximising (B + S) / (D * draft_s + target_s[S]) with S <= sum_r min(match_r, D).

    Args:
        match: (B,) int64 true match lengths, >= 0.
        batch: B.
        draft_s: one draft pass (seconds).
        target_s: (S_max + 1,) target pass time at B + S step tokens, S = 0..sum(match).
    """
    K = int(match.max(initial=0))
    counts = np.bincount(match, minlength=K + 1)  # (K+1,) sequences per match length
    longer = counts[::-1].cumsum()[::-1]  # (K+1,) sequences with match >= v
    s_max = np.concatenate([[0], np.cumsum(longer[1:])])  # (K+1,) S_max(D) = sum_r min(m_r, D)
    S = np.arange(len(target_s))  # (S_max + 1,)
    D = np.arange(K + 1)[:, None]  # (K+1, 1)
    good = (batch + S)[None, :] / (D * draft_s + target_s[None, :])  # (K+1, S_max + 1)
    good[S[None, :] > s_max[:, None]] = -np.inf
    d, s = np.unravel_index(int(np.argmax(good)), good.shape)  # ties: the smallest D, then S
    return int(d), int(s)


def water_fill(match: np.ndarray, depth: int, total: int) -> np.ndarray:
    """(B,) d_r <= min(match_r, depth) summing to `total` (<= sum min(match, depth)): d_r =
    min(match_r, level) for the highest level that fits, the remainder one each to the longest."""
    cap = np.minimum(match, depth)  # (B,)
    level = 0
    while level < depth and np.minimum(cap, level + 1).sum() <= total:
        level += 1
    d = np.minimum(cap, level)
    rest = total - int(d.sum())
    if rest > 0:
        more = np.flatnonzero(cap > level)
        d[more[np.argsort(-cap[more], kind="stable")[:rest]]] += 1
    return d


class Oracle(DepthPolicy):
    """Replay only: verifies only tokens that will be accepted, as many as pay (the ceiling)."""

    name: ClassVar[str] = "oracle"
    params: ClassVar[dict[str, object]] = {}
    needs_oracle_match: ClassVar[bool] = True  # the replay feeds PlanContext.oracle_match
    replay_only: ClassVar[bool] = True  # a live server should refuse it up front

    def plan(self, ctx: PlanContext) -> np.ndarray:
        if ctx.oracle_match is None:
            raise OracleUnavailable("the oracle policy needs each step's true match lengths, which only "
                                    "the replay simulator knows (specdepth replay); it cannot serve live")
        B = ctx.batch_size
        match = np.clip(np.asarray(ctx.oracle_match, np.int64), 0, ctx.max_depth)  # (B,)
        if B == 0 or not match.any():
            return np.zeros(B, np.int64)
        context = int(ctx.context_lens.sum())
        target_s = np.asarray(ctx.cost.target_time(B + np.arange(int(match.sum()) + 1), context), np.float64)
        depth, total = best_depth(match, B, float(ctx.cost.draft_time(B, context)), target_s)
        return water_fill(match, depth, total)  # (B,) L_r = d_r
