"""TurboSpec / SmartSpec (Liu et al. 2024): one k for the whole batch, from predicted goodput.

With a per-token acceptance rate alpha, a sequence verifying k tokens emits on average
(1 - alpha^(k+1)) / (1 - alpha) tokens (Leviathan et al. 2023), so a batch of B emits B times
that per step. SmartSpec picks the k maximising that over the modelled step time,

    goodput(k) = B * (1 - alpha^(k+1)) / (1 - alpha) / (k * draft_time(B) + target_time(B * (k+1))),

with alpha a moving average of the observed acceptance rate (accepted / proposed) and k = 0 given
a small head start, since it is the safe choice when the prediction is wrong.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from specdepth.policies.base import DepthPolicy, PlanContext, StepOutcome


def expected_emitted(alpha: float, k: int) -> float:
    """Expected emitted tokens per sequence verifying k tokens: (1 - alpha^(k+1)) / (1 - alpha)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class TurboSpec(DepthPolicy):
    """k = argmax_{k in 0..K} goodput(k), k = 0's score times `k0_bias`; recomputed every `period` plans.

    alpha: global EMA, alpha <- (1 - ema) * alpha + ema * step_rate, started at `alpha_init`, where
    step_rate is the mean of accepted / verified over the step's sequences with verified > 0 (a step
    where nothing was verified leaves alpha unchanged). The step time includes the batch's context
    tokens, as SmartSpec's execution-time model does. Between recomputes the cached k is reused
    whatever the batch size (capped by max_depth).
    """

    name: ClassVar[str] = "turbospec"
    params: ClassVar[dict[str, object]] = {
        "alpha_init": 0.7,
        "ema": 0.15,
        "period": 20,
        "k0_bias": 1.1,
    }

    def __init__(
        self,
        alpha_init: float = 0.7,
        ema: float = 0.15,  # weight of the new observation (0.85 old)
        period: int = 20,
        k0_bias: float = 1.1,
    ) -> None:
        if not 0.0 <= alpha_init <= 1.0 or not 0.0 <= ema <= 1.0 or period < 1 or k0_bias <= 0:
            raise ValueError(
                f"{self.name}: need 0 <= alpha_init, ema <= 1, period >= 1, k0_bias > 0; got "
                f"alpha_init={alpha_init}, ema={ema}, period={period}, k0_bias={k0_bias}"
            )
        self.alpha_init, self.ema = float(alpha_init), float(ema)
        self.period, self.k0_bias = int(period), float(k0_bias)
        self.alpha = self.alpha_init  # current acceptance-rate estimate
        self._k: int | None = None  # cached batch depth
        self._plans = 0  # plans since the cache was last refreshed (bookkeeping)

    def scores(self, ctx: PlanContext) -> np.ndarray:
        """(K+1,) predicted goodput of k = 0..max_depth for this batch (k = 0 already favoured)."""
        b = ctx.batch_size
        context = int(ctx.context_lens.sum())
        out = np.zeros(ctx.max_depth + 1)  # (K+1,)
        for k in range(ctx.max_depth + 1):
            t = k * ctx.cost.draft_time(b, context) + float(ctx.cost.target_time(b * (k + 1), context))
            out[k] = b * expected_emitted(self.alpha, k) / t
        out[0] *= self.k0_bias
        return out

    def plan(self, ctx: PlanContext) -> np.ndarray:
        if ctx.batch_size == 0:
            return np.zeros(0, dtype=np.int64)
        if self._k is None or self._plans >= self.period:
            self._k = int(np.argmax(self.scores(ctx)))  # ties: the smallest k
            self._plans = 0
        self._plans += 1
        return np.full(ctx.batch_size, min(self._k, ctx.max_depth), dtype=np.int64)

    def observe(self, out: StepOutcome) -> None:
        tried = out.verified > 0  # (B,)
        if not tried.any():
            return
        rate = float(np.mean(out.accepted[tried] / out.verified[tried]))
        self.alpha = (1.0 - self.ema) * self.alpha + self.ema * rate
