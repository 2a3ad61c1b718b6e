"""vllm-adaptive: full-block drafting, a slot budget sized from stale global survivals, ranked slots."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from specdepth.policies.registry import make_policy
from specdepth.policies.testing import LinearCost, make_outcome, make_plan_ctx, make_verify_ctx
from specdepth.policies.vllm_adaptive import VllmAdaptive, slot_budget


@dataclass(frozen=True)
class Knee:
    """Flat up to `knee` step tokens, then `slope` s per token; optionally slower with more context."""

    base: float = 1.0
    knee: float = 3.0
    slope: float = 0.5
    draft: float = 0.0
    per_context: float = 0.0

    def target_time(self, n_tokens: np.ndarray | int, context_tokens: int = 0) -> np.ndarray | float:
        n = np.asarray(n_tokens, np.float64)
        return self.base + self.per_context * context_tokens + self.slope * np.maximum(n - self.knee, 0.0)

    def draft_time(self, batch_size: int, context_tokens: int = 0) -> float:
        return self.draft * (1.0 + self.per_context * context_tokens)


def causal(policy: VllmAdaptive, conf: list[list[float]], step: int = 0) -> np.ndarray:
    """The controller's causal verify calls; returns the kept lengths."""
    full = make_verify_ctx(conf, step=step)
    kept = np.zeros(len(conf), np.int64)
    for j in range(1, full.conf.shape[1] + 1):
        ans = policy.verify(make_verify_ctx([row[:j] for row in conf], step=step))
        kept += (kept == j - 1) & (ans >= j)
    return kept


def test_slot_budget_by_hand() -> None:
    # N = 2, K = 2, s = (0.9, 0.5): B = 0..4 gives 2/1, 2.9/1, 3.8/1.5, 4.3/2, 4.8/2.5 -> B* = 1
    assert slot_budget(np.array([0.9, 0.5]), 2, Knee()) == 1
    assert slot_budget(np.array([0.9, 0.5]), 2, LinearCost(target_s=0.02)) == 4  # flat: every slot
    compute_bound = LinearCost(target_s=0.0, target_per_token_s=1e-3, draft_s=0.0)
    assert slot_budget(np.array([0.9, 0.5]), 2, compute_bound) == 0
    assert slot_budget(np.array([0.9, 0.5]), 0, Knee()) == 0


def test_drafts_the_full_block_even_when_verifying_nothing() -> None:
    policy = VllmAdaptive()
    compute_bound = LinearCost(target_s=0.0, target_per_token_s=1e-3, draft_s=0.0)
    for step in range(3):
        assert policy.plan(make_plan_ctx(5, step=step, max_depth=6, cost=compute_bound)).tolist() == [6] * 5
        assert policy.budget == 0
    assert causal(policy, [[0.99, 0.99]] * 5, step=2).tolist() == [0] * 5


def test_budget_is_sized_from_one_step_stale_survivals() -> None:
    cost = Knee(knee=12, slope=0.06)  # N = 8 sequences: 4 free slots, then 6% of a pass per slot
    policy = VllmAdaptive(init_conf=0.9)
    policy.plan(make_plan_ctx(8, step=0, max_depth=2, cost=cost))
    b0 = policy.budget
    policy.observe(make_outcome([0] * 8, [2] * 8, step=0))  # every first position rejected
    fresh = slot_budget(policy.survival(), 8, cost)
    assert fresh < b0  # the news says: verify less
    policy.plan(make_plan_ctx(8, step=1, max_depth=2, cost=cost))
    assert policy.budget == b0  # ...but step 1 still sizes from what step 0 knew
    policy.observe(make_outcome([0] * 8, [1] * 8, step=1))
    policy.plan(make_plan_ctx(8, step=2, max_depth=2, cost=cost))
    assert policy.budget == fresh  # step 2 sizes from what step 1 knew


def test_slots_go_to_the_highest_current_survivals_in_order() -> None:
    policy = VllmAdaptive()
    policy.plan(make_plan_ctx(2, max_depth=2, cost=LinearCost()))
    policy.budget = 3  # survivals: r0 (0.9, 0.81), r1 (0.5, 0.45) -> the best three: 0.9, 0.81, 0.5
    assert causal(policy, [[0.9, 0.9], [0.5, 0.9]]).tolist() == [2, 1]
    policy.budget = 1
    assert causal(policy, [[0.9, 0.9], [0.5, 0.9]]).tolist() == [1, 0]
    policy.budget = 2  # ties: the smaller position first, then the smaller request
    assert causal(policy, [[0.6, 1.0], [0.6, 1.0], [0.6, 1.0]]).tolist() == [1, 1, 0]


def test_verify_without_a_plan_sizes_from_the_same_stale_survivals() -> None:
    policy = VllmAdaptive()
    policy.plan(make_plan_ctx(2, step=0, max_depth=2, cost=Knee()))
    planned = policy.budget
    ctx = make_verify_ctx([[0.9, 0.9], [0.5, 0.9]], step=5, cost=Knee())
    assert policy.verify(ctx).sum() == min(planned, 4) == VllmAdaptive().verify(ctx).sum()


def test_observe_is_a_global_ema_of_conditional_acceptance() -> None:
    policy = VllmAdaptive(ema=0.8, init_conf=0.5)
    policy.plan(make_plan_ctx(3, max_depth=3, cost=LinearCost()))
    # position 1: 3 tried, 2 kept -> 2/3; position 2: tried by the 2 that kept 1, 1 kept -> 1/2;
    # position 3: tried by the one with 2 kept (verified 3) -> 1/1
    policy.observe(make_outcome([0, 1, 3], [3, 3, 3]))
    np.testing.assert_allclose(policy.conf, [0.8 * 0.5 + 0.2 * 2 / 3, 0.8 * 0.5 + 0.2 * 0.5, 0.8 * 0.5 + 0.2])
    before = policy.conf.copy()
    policy.observe(make_outcome([0, 0], [1, 0]))  # only position 1 tried
    assert policy.conf[0] == pytest.approx(0.8 * before[0])
    assert policy.conf[1:].tolist() == before[1:].tolist()
    np.testing.assert_allclose(policy.survival(), np.cumprod(policy.conf))


def test_no_context_and_no_per_sequence_learning() -> None:
    cost = Knee(knee=12, slope=0.06, per_context=1e-3)
    policy = VllmAdaptive()
    budgets = []
    for lens in ([10] * 8, [5000] * 8):
        policy.plan(make_plan_ctx(8, max_depth=2, cost=cost, context_lens=lens))
        budgets.append(policy.budget)
    assert budgets[0] == budgets[1]
    # two very different sequences leave one shared estimate per position
    policy.observe(make_outcome([2, 0], [2, 2]))
    assert policy.conf.shape == (2,)


def test_parameters_and_registry() -> None:
    with pytest.raises(ValueError):
        VllmAdaptive(ema=1.5)
    policy = make_policy("vllm-adaptive:ema=0.5")
    assert isinstance(policy, VllmAdaptive) and policy.ema == 0.5
