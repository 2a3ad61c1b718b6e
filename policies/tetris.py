"""tetris: TETRIS (Wu et al., ACL 2025), optimal draft token selection for batch speculation.

"TETRIS: Optimal Draft Token Selection for Batch Speculative Decoding" drafts a few tokens more
than the verification capacity allows, then a manager greedily picks, across the whole batch, the
draft tokens with the highest cumulative acceptance probability until the capacity is used. The
cumulative acceptance of token j of request r is estimated by the product of the draft's
probabilities of tokens 1..j, which for a greedy draft is prod_{i<=j} top1_{r,i}: each factor is
known before its token is chosen. Since the products fall with j, the greedy pick gives each
request a prefix; ties go to the smaller position, then the smaller request (`top_k_lengths`).
The controller asks position by position (policies/base.py), so position j is picked among the
positions <= j of the batch: a position kept early stays kept when a later position of another
request would have outranked it, and a step can verify a few tokens past the capacity (as
vllm-adaptive's budget does here).

The capacity is fixed, not priced: TETRIS is compared at equal capacity with standard speculation
of window k on the same batch, so the capacity here is `capacity` draft tokens per running
request (C = capacity * B slots a step, plus each request's own token), drafted `window` deep.
The paper leaves both to the server (its text we could consult fixes no value); the defaults are
standard speculation's k = 3 (a common `num_speculative_tokens`) as the equal-capacity baseline,
with a surplus of two extra draft tokens to choose from.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from specdepth.policies.allocation import top_k_lengths
from specdepth.policies.base import DepthPolicy, PlanContext, VerifyContext
from specdepth.policies.static import uniform_budgets


class Tetris(DepthPolicy):
    """Draft `window` each; verify the batch's `capacity * B` tokens of highest cumulative top-1.

    The greedy pick is global across the batch and keeps per-request prefixes (`top_k_lengths`).
    """

    name: ClassVar[str] = "tetris"
    params: ClassVar[dict[str, object]] = {"capacity": 3, "window": 5}

    def __init__(self, capacity: int = 3, window: int = 5) -> None:
        if capacity < 0 or window < 1:
            raise ValueError(f"{self.name}: need capacity >= 0 and window >= 1; got capacity={capacity}, window={window}")
        self.capacity, self.window = int(capacity), int(window)

    def depths_asked(self) -> tuple[int, ...]:
        return (self.window,)

    def plan(self, ctx: PlanContext) -> np.ndarray:
        return uniform_budgets(ctx, self.window)  # (B,)

    def drafts_dynamically(self, step: int) -> bool:
        return False  # the whole window is drafted

    def verify(self, ctx: VerifyContext) -> np.ndarray:
        top1 = np.clip(ctx.top1, 0.0, 1.0)  # (B, j)
        drafted = np.arange(1, top1.shape[1] + 1)[None, :] <= np.asarray(ctx.drafted)[:, None]  # (B, j)
        return top_k_lengths(np.cumprod(top1 * drafted, axis=1), self.capacity * len(ctx.seq_ids))
