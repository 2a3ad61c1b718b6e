"""BanditSpec (Hou et al. 2025): choose the speculation depth online with UCB1.

Each arm is a depth k applied to the whole batch for one step; the reward of a step is its
goodput, emitted tokens / step time. UCBSpec treats the choice as a stochastic multi-armed bandit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from specdepth.policies.base import DepthPolicy, PlanContext, StepOutcome


def parse_depths(value: str | Sequence[int], what: str) -> tuple[int, ...]:
    """Depths from "1/2/3/4" or a sequence of ints; each >= 0, at least one, no repeats."""
    try:
        items = value.split("/") if isinstance(value, str) else list(value)
        depths = tuple(int(v) for v in items)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: expected depths like '1/2/3/4', got {value!r}") from None
    if not depths or min(depths) < 0 or len(set(depths)) != len(depths):
        raise ValueError(f"{what}: need distinct depths >= 0, got {value!r}")
    return depths


class Bandit(DepthPolicy):
    """UCB1 over batch depths: pull each arm once (in order), then argmax mean + c * sqrt(2 ln t / n).

    Reward of a step = sum of emitted tokens / step_time_s, credited to the arm planned last.
    Rewards are divided by the largest reward seen so far (applied at decision time to the raw
    running means), so they lie in [0, 1] and UCB1's exploration constant c = 1 means what it
    does in Auer et al. 2002. Ties go to the first arm. Deterministic: no RNG.
    """

    name: ClassVar[str] = "bandit"
    params: ClassVar[dict[str, object]] = {"arms": "1/2/3/4", "c": 1.0}

    def __init__(self, arms: str | Sequence[int] = "1/2/3/4", c: float = 1.0) -> None:
        depths = parse_depths(arms, self.name)
        if c < 0:
            raise ValueError(f"{self.name}: c must be >= 0, got {c}")
        self.arms = "/".join(map(str, depths))  # for describe()
        self.c = float(c)
        self._depth = np.array(depths, dtype=np.int64)  # (A,)
        self._n = np.zeros(len(depths), dtype=np.int64)  # (A,) pulls credited with a reward
        self._sum = np.zeros(len(depths))  # (A,) raw reward sums (tokens / s)
        self._max = 0.0  # running max reward (normaliser)
        self._pending: int | None = None  # arm planned for the step not yet observed

    def depths_asked(self) -> tuple[int, ...]:
        return tuple(int(k) for k in self._depth)

    def choose(self) -> int:
        """Index of the arm to pull next."""
        unpulled = np.flatnonzero(self._n == 0)
        if len(unpulled):
            return int(unpulled[0])
        t = int(self._n.sum())
        mean = self._sum / self._n / max(self._max, 1e-12)  # (A,) normalised means
        ucb = mean + self.c * np.sqrt(2.0 * math.log(t) / self._n)  # (A,)
        return int(np.argmax(ucb))

    def plan(self, ctx: PlanContext) -> np.ndarray:
        self._pending = self.choose()
        k = min(int(self._depth[self._pending]), ctx.max_depth)
        return np.full(ctx.batch_size, k, dtype=np.int64)

    def observe(self, out: StepOutcome) -> None:
        arm, self._pending = self._pending, None
        if arm is None or out.step_time_s <= 0 or out.batch_size == 0:
            return
        reward = float(out.emitted.sum()) / out.step_time_s
        self._n[arm] += 1
        self._sum[arm] += reward
        self._max = max(self._max, reward)
