"""nightjar: one UCB1 bandit over lengths (0 = off) per batch-size bucket."""

from __future__ import annotations

import pytest

from specdepth.policies.nightjar import Nightjar, bucket_of
from specdepth.policies.registry import make_policy
from specdepth.policies.testing import make_outcome, make_plan_ctx


def test_buckets_are_powers_of_two() -> None:
    assert [bucket_of(b) for b in (0, 1, 2, 3, 4, 5, 8, 9, 256)] == [0, 1, 2, 4, 4, 8, 8, 16, 256]


def step(policy: Nightjar, batch: int, reward_of: dict[int, float]) -> int:
    """Plan one step of `batch` sequences, reward it by its length; returns the length chosen."""
    k = int(policy.plan(make_plan_ctx(batch, max_depth=8))[0])
    seconds = batch / reward_of[k]  # nothing accepted: `batch` tokens emitted, at reward_of[k] tokens/s
    policy.observe(make_outcome([0] * batch, [k] * batch, step_time_s=seconds, draft_time_s=0.0))
    return k


def test_each_bucket_explores_every_arm_in_order_on_its_own() -> None:
    policy = Nightjar()
    flat = {k: 100.0 for k in range(5)}
    assert [step(policy, 1, flat) for _ in range(3)] == [0, 1, 2]
    assert [step(policy, 3, flat) for _ in range(2)] == [0, 1]  # bucket 4 starts afresh
    assert set(policy.bandits) == {1, 4}


def test_learns_off_for_large_batches_and_deep_for_small() -> None:
    policy = Nightjar()
    small = {0: 100.0, 1: 150.0, 2: 190.0, 3: 220.0, 4: 240.0}  # deeper pays
    large = {0: 8000.0, 1: 6000.0, 2: 5000.0, 3: 4500.0, 4: 4000.0}  # off pays
    for _ in range(300):
        step(policy, 1, small)
        step(policy, 200, large)
    picks_small = [step(policy, 1, small) for _ in range(50)]
    picks_large = [step(policy, 200, large) for _ in range(50)]
    assert max(range(5), key=picks_small.count) == 4  # UCB1 still explores its near neighbours
    assert picks_large.count(0) > 30  # UCB1 keeps exploring the others now and then


def test_spec_depths_and_validation() -> None:
    policy = make_policy("nightjar:arms=0/2/4,c=0.5")
    assert policy.depths_asked() == (0, 2, 4) and policy.c == 0.5
    assert not policy.verifies(0) and not policy.drafts_dynamically(0)
    with pytest.raises(ValueError):
        Nightjar(arms="1/1")
    with pytest.raises(ValueError):
        Nightjar(c=-1)
