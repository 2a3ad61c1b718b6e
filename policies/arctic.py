"""`arctic-hybrid`: Arctic Inference's rule for choosing between suffix drafting and a draft model.

Per request, each step: the suffix draft when its score, the sum over its positions of the
estimated probability that the draft so far is right (its expected accepted tokens), is at least
the draft model's number of speculative tokens k; else the draft model, drafting k. The suffix
draft runs as long as the suffix drafter makes it (up to K). Here the score is read from the
drafter's own features: the product of its per-position continuation frequencies
(`workers/drafters/suffix.py`), summed. With a drafter other than `hybrid` it is static k.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from specdepth.policies.base import ChooseContext
from specdepth.policies.static import Static


class ArcticHybrid(Static):
    """Per sequence: the suffix draft when its score is >= k, else the draft model at k (Arctic Inference)."""

    name: ClassVar[str] = "arctic-hybrid"
    params: ClassVar[dict[str, object]] = {"k": 3}

    def choose_drafter(self, ctx: ChooseContext) -> np.ndarray:
        score = np.cumprod(np.asarray(ctx.top1, np.float64), axis=1).sum(1)  # (B,) expected accepted tokens
        return (score >= self.k) & (ctx.drafted > 0)
