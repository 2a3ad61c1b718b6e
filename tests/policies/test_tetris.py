"""tetris: the batch's capacity goes to the draft tokens with the highest cumulative top-1 product."""

from __future__ import annotations

import numpy as np
import pytest

from specdepth.policies.registry import make_policy
from specdepth.policies.tetris import Tetris
from specdepth.policies.testing import make_plan_ctx, make_verify_ctx


def causal(policy: Tetris, top1: list[list[float]]) -> np.ndarray:
    """The controller's causal verify calls; returns the kept lengths."""
    kept = np.zeros(len(top1), np.int64)
    for j in range(1, max(len(r) for r in top1) + 1):
        ans = policy.verify(make_verify_ctx([r[:j] for r in top1], top1=[r[:j] for r in top1]))
        kept += (kept == j - 1) & (ans >= j)
    return kept


def test_drafts_the_window() -> None:
    assert Tetris(window=5).plan(make_plan_ctx(3, max_depth=8)).tolist() == [5, 5, 5]
    assert Tetris(window=5).plan(make_plan_ctx(2, max_depth=3)).tolist() == [3, 3]
    assert not Tetris().drafts_dynamically(0)


def test_global_greedy_by_cumulative_product() -> None:
    # capacity 1 per request, 2 requests: 2 slots. Products: r0 0.9, 0.81, 0.729; r1 0.5, 0.25, ...
    top1 = [[0.9, 0.9, 0.9], [0.5, 0.5, 0.5]]
    assert Tetris(capacity=1).verify(make_verify_ctx(top1, top1=top1)).tolist() == [2, 0]
    # asked causally, position 1 of r1 is kept before r0's 0.81 is known: one slot over capacity,
    # never a position that the full pick would not reach through a kept prefix
    assert causal(Tetris(capacity=1), top1).tolist() == [2, 1]
    # 4 slots: 0.9, 0.81, 0.729 from r0, then 0.5 from r1 (ahead of r0's 0.656); causally, r1's
    # 0.25 is kept at position 2 before r0's 0.729 is known
    assert Tetris(capacity=2).verify(make_verify_ctx(top1, top1=top1)).tolist() == [3, 1]
    assert causal(Tetris(capacity=2), top1).tolist() == [3, 2]


def test_uses_the_raw_top1_not_the_calibrated_confidence() -> None:
    top1 = [[0.9, 0.9], [0.5, 0.5]]
    ctx = make_verify_ctx([[0.1, 0.1], [0.99, 0.99]], top1=top1)  # conf says the opposite
    assert Tetris(capacity=1).verify(ctx).tolist() == [2, 0]


def test_capacity_zero_verifies_nothing_and_short_drafts_are_respected() -> None:
    top1 = [[0.9, 0.9], [0.8]]
    assert Tetris(capacity=0).verify(make_verify_ctx(top1, top1=top1)).tolist() == [0, 0]
    assert causal(Tetris(capacity=5), top1).tolist() == [2, 1]  # never past what was drafted


def test_spec_and_validation() -> None:
    policy = make_policy("tetris:capacity=2,window=6")
    assert (policy.capacity, policy.window) == (2, 6)
    assert policy.depths_asked() == (6,)
    with pytest.raises(ValueError):
        Tetris(window=0)
