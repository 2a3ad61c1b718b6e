"""early-exit: confidence-threshold early exit of the draft (vLLM PR 35301, after DISCO).

vLLM PR 35301 ("dynamic speculation length with confidence-threshold early exit", by DISCO's
author) adds `draft_confidence_threshold` to the speculative config: a sequence stops drafting
as soon as the draft's top-1 probability at the position just drafted falls below the threshold,
and `num_speculative_tokens` caps the draft as a static K. As in the same author's transformers
implementation (`assistant_confidence_threshold`), the position that fell below the threshold is
still verified: the stop decides whether to draft j + 1, from the top-1 of j, known before x_j is
chosen, so it is lossless.

Defaults are the PR's own best configuration for its Llama-3.1-8B-Instruct / Llama-3.2-1B-Instruct
pair (A100, concurrency 1): 10 speculative tokens with threshold 0.6 (1.64x over static K = 5).
Nothing is learned; every sequence is treated alike.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from specdepth.policies.base import DepthPolicy, DraftContext, PlanContext
from specdepth.policies.static import uniform_budgets


class EarlyExit(DepthPolicy):
    """Draft up to `k` tokens; stop a sequence after a position whose draft top-1 < `threshold`.

    Budgets are `min(k, max_depth)`; every drafted position is verified.
    """

    name: ClassVar[str] = "early-exit"
    params: ClassVar[dict[str, object]] = {"threshold": 0.6, "k": 10}

    def __init__(self, threshold: float = 0.6, k: int = 10) -> None:
        if not 0.0 <= threshold <= 1.0 or k < 1:
            raise ValueError(f"{self.name}: need 0 <= threshold <= 1 and k >= 1; got threshold={threshold}, k={k}")
        self.threshold, self.k = float(threshold), int(k)

    def plan(self, ctx: PlanContext) -> np.ndarray:
        return uniform_budgets(ctx, self.k)  # (B,)

    def keep_drafting(self, ctx: DraftContext) -> np.ndarray:
        rows = np.arange(len(ctx.drafted))
        if ctx.top1.shape[1] == 0:
            return np.ones(len(rows), dtype=bool)
        last = ctx.top1[rows, np.maximum(ctx.drafted - 1, 0)]  # (B,) top-1 of the position just drafted
        return (ctx.drafted == 0) | (last >= self.threshold)

    def verifies(self, step: int) -> bool:
        return False  # every drafted token is verified
