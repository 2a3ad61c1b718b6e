"""vllm-online: a logistic confidence on logit(max q), refitted online; vLLM's budget and slots."""

from __future__ import annotations

import numpy as np
import pytest

from specdepth.policies.registry import make_policy
from specdepth.policies.testing import LinearCost, make_outcome, make_plan_ctx, make_verify_ctx
from specdepth.policies.vllm_adaptive import budget_for_slots, slot_budget
from specdepth.policies.vllm_online import VllmOnline, fit_logistic, log_odds
from tests.policies.test_vllm_adaptive import Knee


def test_starts_as_the_identity_and_zero_past_drafted() -> None:
    policy = VllmOnline()
    top1 = np.array([[0.9, 0.3, 0.0]])
    assert np.allclose(policy.confidence(top1), [[0.9, 0.3, 0.0]])


def test_budget_for_slots_matches_slot_budget_and_ignores_order() -> None:
    s = np.array([0.9, 0.5])
    assert budget_for_slots(np.repeat(s, 2), 2, 2, Knee()) == slot_budget(s, 2, Knee()) == 1
    assert budget_for_slots(np.array([0.5, 0.9, 0.5, 0.9]), 2, 2, Knee()) == 1
    assert budget_for_slots(np.zeros(0), 2, 2, Knee()) == 0


def test_refit_recalibrates_an_overconfident_draft() -> None:
    # the draft says 0.9, but only half of those positions are accepted (1 of 2, then a reject)
    policy = VllmOnline()
    for step in range(20):
        top1 = [[0.9, 0.9]] * 8
        policy.observe(make_outcome([1] * 8, [2] * 8, top1=top1, step=step))
    c = float(policy.confidence(np.array([[0.9]]))[0, 0])
    assert 0.4 < c < 0.6


def test_fit_logistic_recovers_a_known_slope() -> None:
    rng = np.random.default_rng(0)
    q = rng.uniform(0.05, 0.95, 20000)
    truth = 1.0 / (1.0 + np.exp(-(0.5 * log_odds(q) - 1.0)))
    y = (rng.random(q.size) < truth).astype(np.float64)
    w, b = fit_logistic(log_odds(q), y, np.array([1.0, 0.0]), ridge=1.0, steps=8)
    assert abs(w - 0.5) < 0.05 and abs(b + 1.0) < 0.05


def test_budget_is_sized_from_each_requests_stale_survivals() -> None:
    policy = VllmOnline()
    cost = Knee(base=1.0, knee=4.0, slope=0.5)  # flat to N + 2 tokens
    policy.plan(make_plan_ctx(2, step=0, max_depth=2, cost=cost))
    # step 0 showed r0 confident, r1 not; nothing verified, so the model stays the identity
    policy.observe(make_outcome([0, 0], [0, 0], drafted=[2, 2], top1=[[0.95, 0.95], [0.1, 0.1]], step=0))
    policy.plan(make_plan_ctx(2, step=1, max_depth=2, cost=cost))
    slots = np.array([0.95, 0.95**2, 0.1, 0.01])
    assert policy.budget == budget_for_slots(slots, 2, 2, cost) == 2
    # the split uses this step's values: now r1 is the confident one
    ctx = make_verify_ctx([[0.1, 0.1], [0.95, 0.95]], step=1, cost=cost)
    assert policy.verify(ctx).tolist() == [0, 2]


def test_new_requests_are_sized_with_the_others_mean() -> None:
    policy = VllmOnline()
    policy.observe(make_outcome([0], [0], drafted=[2], top1=[[0.8, 0.5]], seq_ids=[7]))
    slots = policy._sizing_slots(np.array([7, 8]), 2)
    assert np.allclose(slots, [0.8, 0.4, 0.8, 0.4])
    policy.observe(make_outcome([0], [0], drafted=[2], top1=[[0.8, 0.5]], seq_ids=[7], finished=[7], step=1))
    assert np.allclose(policy._sizing_slots(np.array([8]), 2), [0.7, 0.49])  # none known: init_top1


def test_flat_cost_verifies_everything_drafted() -> None:
    policy = VllmOnline()
    policy.plan(make_plan_ctx(3, max_depth=4, cost=LinearCost(target_s=0.02)))
    ctx = make_verify_ctx([[0.5, 0.5, 0.5, 0.5], [0.2], [0.9, 0.9]], cost=LinearCost(target_s=0.02))
    assert policy.verify(ctx).tolist() == [4, 1, 2]


def test_spec_and_validation() -> None:
    policy = make_policy("vllm-online:window=512,ridge=0.5")
    assert (policy.window, policy.ridge) == (512, 0.5)
    with pytest.raises(ValueError):
        VllmOnline(window=1)
    with pytest.raises(ValueError):
        VllmOnline(init_top1=1.0)
