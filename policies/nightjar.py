"""nightjar: Nightjar (Li et al., arXiv 2512.22420), a bandit choosing the length per batch size.

Nightjar's planner treats the speculative length as a multi-armed bandit whose best arm depends on
the load: it learns, for each batch size, which length gives the highest throughput, and one of
the arms is 0, speculation off, which it takes once the batch is compute-bound. Here each batch
size bucket holds its own UCB1 bandit (`bandit.Bandit`: reward = emitted tokens / step time,
normalised by the bucket's best reward, exploration constant c), and a step's batch uses the
length its bucket chooses for every request.

Constants: the arms are BanditSpec's lengths 1..4 plus the 0 that Nightjar adds; c = 1 is UCB1's
own constant (Auer et al. 2002), since the paper's own value was not available to us; batch sizes share a bucket per
power of two (1, 2, 3-4, 5-8, ...), so that every bucket is visited often enough to learn, where
the paper keys by the batch size its engine schedules.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from specdepth.policies.bandit import Bandit, parse_depths
from specdepth.policies.base import DepthPolicy, PlanContext, StepOutcome


def bucket_of(batch_size: int) -> int:
    """The power of two at or above `batch_size` (0 for an empty batch)."""
    return 0 if batch_size <= 0 else 1 << (int(batch_size) - 1).bit_length()


class Nightjar(DepthPolicy):
    """One UCB1 bandit over lengths (0 = off included) per batch-size bucket; batch-wide length."""

    name: ClassVar[str] = "nightjar"
    params: ClassVar[dict[str, object]] = {"arms": "0/1/2/3/4", "c": 1.0}

    def __init__(self, arms: str | Sequence[int] = "0/1/2/3/4", c: float = 1.0) -> None:
        checked = Bandit(arms, c)  # its validation, for the bandits made per bucket
        self.arms, self.c = checked.arms, checked.c
        self.bandits: dict[int, Bandit] = {}  # bucket -> its bandit
        self._pending: Bandit | None = None  # the bandit that planned the step not yet observed

    def depths_asked(self) -> tuple[int, ...]:
        return parse_depths(self.arms, self.name)

    def plan(self, ctx: PlanContext) -> np.ndarray:
        bucket = bucket_of(ctx.batch_size)
        if bucket not in self.bandits:
            self.bandits[bucket] = Bandit(self.arms, self.c)
        self._pending = self.bandits[bucket]
        return self._pending.plan(ctx)

    def drafts_dynamically(self, step: int) -> bool:
        return False

    def verifies(self, step: int) -> bool:
        return False

    def observe(self, out: StepOutcome) -> None:
        bandit, self._pending = self._pending, None
        if bandit is not None:
            bandit.observe(out)
