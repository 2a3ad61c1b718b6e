"""SpecDec++ (Huang et al. 2024): stop drafting once the chance of a rejection exceeds h.

SpecDec++ trains an acceptance-prediction head and stops the draft as soon as the predicted
probability that *at least one* drafted token is rejected, 1 - prod_i p_hat_i, exceeds a
threshold h (0.3 in the paper), with the draft length kept within [2, 20]. Here p_hat is the
controller's calibrated confidence c_{r,i}, which is known before x_{r,i} is sampled.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from specdepth.policies.base import DepthPolicy, DraftContext, PlanContext


class SpecDecPP(DepthPolicy):
    """Keep drafting while 1 - prod(c over drafted positions) <= h, within [min_depth, max_depth].

    Budgets are `min(max_depth_param, ctx.max_depth)`; `keep_drafting` never stops a sequence
    before `min_depth` drafted tokens, and otherwise stops it after the first position j at which
    1 - prod_{i<=j} c_{r,i} > h (position j itself is still verified, as in SpecDec++).
    """

    name: ClassVar[str] = "specdec++"
    params: ClassVar[dict[str, object]] = {"h": 0.3, "min_depth": 2, "max_depth": 20}

    def __init__(self, h: float = 0.3, min_depth: int = 2, max_depth: int = 20) -> None:
        if not 0.0 <= h <= 1.0 or min_depth < 0 or max_depth < min_depth:
            raise ValueError(
                f"{self.name}: need 0 <= h <= 1 and 0 <= min_depth <= max_depth; "
                f"got h={h}, min_depth={min_depth}, max_depth={max_depth}"
            )
        self.h, self.min_depth, self.max_depth = float(h), int(min_depth), int(max_depth)

    def plan(self, ctx: PlanContext) -> np.ndarray:
        return np.full(ctx.batch_size, min(self.max_depth, ctx.max_depth), dtype=np.int64)

    def keep_drafting(self, ctx: DraftContext) -> np.ndarray:
        rows = np.arange(len(ctx.drafted))
        if ctx.conf.shape[1] == 0:
            return np.ones(len(rows), dtype=bool)
        surv = np.cumprod(ctx.conf, axis=1)  # (B, j) survival of drafted positions
        last = surv[rows, np.maximum(ctx.drafted - 1, 0)]  # (B,) prod over drafted positions
        p_reject = np.where(ctx.drafted > 0, 1.0 - last, 0.0)  # (B,)
        return (ctx.drafted < self.min_depth) | (p_reject <= self.h)
