"""vllm-adaptive: vLLM's adaptive verification (DSpark's scheduler as vLLM ships it), as documented.

- Confidence of position j: a global EMA (weight `ema` on the old value) of the observed acceptance
  rate at j given j - 1 accepted; survival s_j = prod_{i<=j} c_i. Nothing is learned per sequence.
- Slot budget: B* = argmax_B (N + sum of the B highest survivals) / (draft_cost(N) + verify_cost(N + B))
  with N = running requests, draft_cost = K passes of the draft over N sequences (it drafts the full
  block), verify_cost from the start-up cost table; context length is ignored (context_tokens = 0).
  Every request has the same EMA survivals, so "the B highest" are s_1 N times, then s_2 N times, ...
  B* is sized from one-step-stale survivals: those known at the previous step's plan.
- Slots: at verify, the B* highest *current* survivals of the drafted positions (running products of
  this step's calibrated confidences, per request) are admitted, in survival order (ties: smaller
  position, then smaller request), so each request keeps a prefix.
- Drafting: always the full block, K tokens for every request.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from specdepth.policies.allocation import top_k_lengths
from specdepth.policies.base import DepthPolicy, PlanContext, StepCost, StepOutcome, VerifyContext


def budget_for_slots(slots: np.ndarray, num_reqs: int, draft_passes: int, cost: StepCost) -> int:
    """B* = argmax_B (N + sum of the B highest slots) / (draft_passes * draft(N) + target(N + B)).

    The budget rule of vLLM's adaptive verification, over any set of (request, position) survivals:
    vllm-adaptive's (every request sharing the global EMA survivals) and vllm-online's (each
    request its own).

    Args:
        slots: (S,) survivals of every (request, position) slot, in any order.
        num_reqs: N, running requests.
        draft_passes: sequential draft passes the step pays (the full block, K).
        cost: start-up cost tables (queried with context_tokens = 0).

    Returns:
        B* in 0..S (ties: the smallest).
    """
    if num_reqs == 0 or slots.size == 0:
        return 0
    ranked = -np.sort(-np.clip(slots, 0.0, 1.0))  # (S,) descending
    gain = np.empty(ranked.size + 1)  # (S+1,) expected emitted with B = 0..S slots
    gain[0] = 0.0
    np.cumsum(ranked, out=gain[1:])
    gain += num_reqs
    time = draft_passes * cost.draft_time(num_reqs, 0) + np.asarray(
        cost.target_time(num_reqs + np.arange(ranked.size + 1), 0), np.float64
    )
    return int(np.argmax(gain / time))


def slot_budget(survival: np.ndarray, num_reqs: int, cost: StepCost) -> int:
    """B* = argmax_B (N + sum of the B highest survivals) / (K * draft(N) + target(N + B)).

    Args:
        survival: (K,) per-position survivals, shared by every request (non-increasing).
        num_reqs: N, running requests.
        cost: start-up cost tables (queried with context_tokens = 0).

    Returns:
        B* in 0..N*K (ties: the smallest).
    """
    return budget_for_slots(np.repeat(survival, num_reqs), num_reqs, survival.size, cost)


def _fit(values: np.ndarray, depth: int, fill: float) -> np.ndarray:
    """`values` cut, or padded with `fill`, to length depth."""
    out = np.full(depth, fill)
    keep = min(depth, values.size)
    out[:keep] = values[:keep]
    return out


class VllmAdaptive(DepthPolicy):
    """vLLM adaptive verification: full block drafted, stale global budget, survival-ranked slots.

    Params:
        ema: weight of the old value in the per-position acceptance EMA.
        init_conf: per-position confidence before anything is observed.
    """

    name: ClassVar[str] = "vllm-adaptive"
    params: ClassVar[dict[str, object]] = {"ema": 0.8, "init_conf": 0.7}

    def __init__(self, ema: float = 0.8, init_conf: float = 0.7) -> None:
        if not 0.0 <= ema < 1.0 or not 0.0 <= init_conf <= 1.0:
            raise ValueError(
                f"{self.name}: need 0 <= ema < 1 and 0 <= init_conf <= 1, got {ema}, {init_conf}"
            )
        self.ema, self.init_conf = float(ema), float(init_conf)
        self.conf = np.zeros(0)  # (K,) per-position acceptance EMA c_j
        self.stale_survival: np.ndarray | None = None  # (K,) survivals as known at the previous plan
        self.budget = 0  # B* of the last plan
        self._budget_step: int | None = None  # the step it was sized for

    def survival(self) -> np.ndarray:
        """(K,) current survivals s_j = prod_{i<=j} c_i."""
        return np.cumprod(self.conf)

    def _sizing_survival(self, depth: int) -> np.ndarray:
        """(depth,) the one-step-stale survivals (before any plan: those of the initial confidences)."""
        if self.stale_survival is None:
            return np.cumprod(_fit(self.conf, depth, self.init_conf))
        return _fit(self.stale_survival, depth, 0.0)

    def plan(self, ctx: PlanContext) -> np.ndarray:
        self.conf = _fit(self.conf, ctx.max_depth, self.init_conf)
        self.budget = slot_budget(self._sizing_survival(ctx.max_depth), ctx.batch_size, ctx.cost)
        self._budget_step = ctx.step
        self.stale_survival = self.survival()  # what the next step will size from
        return np.full(ctx.batch_size, ctx.max_depth, np.int64)

    def verify(self, ctx: VerifyContext) -> np.ndarray:
        n = len(ctx.seq_ids)
        if self._budget_step == ctx.step:
            budget = self.budget
        else:  # not planned this step (e.g. a hand-driven call): size it now, from the same survivals
            budget = slot_budget(self._sizing_survival(max(self.conf.size, ctx.conf.shape[1])), n, ctx.cost)
        conf = np.clip(ctx.conf, 0.0, 1.0)  # (B, j)
        drafted = np.arange(1, conf.shape[1] + 1)[None, :] <= np.asarray(ctx.drafted)[:, None]  # (B, j)
        return top_k_lengths(np.cumprod(conf * drafted, axis=1), budget)

    def observe(self, out: StepOutcome) -> None:
        if self.conf.size < out.conf.shape[1]:
            self.conf = _fit(self.conf, out.conf.shape[1], self.init_conf)
        depth = min(self.conf.size, int(out.verified.max(initial=0)))
        if depth == 0:
            return
        j = np.arange(1, depth + 1)[:, None]  # (J, 1)
        # (J, B): position j was verified and 1..j-1 were kept
        tried = (out.verified[None, :] >= j) & (out.accepted[None, :] >= j - 1)
        n_tried = tried.sum(axis=1)  # (J,)
        n_kept = (out.accepted[None, :] >= j).sum(axis=1)  # (J,) accepted >= j implies tried
        seen = n_tried > 0
        rate = n_kept[seen] / n_tried[seen]
        self.conf[:depth][seen] = self.ema * self.conf[:depth][seen] + (1.0 - self.ema) * rate
