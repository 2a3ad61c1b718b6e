"""early-exit: a sequence stops drafting after a position whose draft top-1 is below the threshold."""

from __future__ import annotations

import pytest

from specdepth.policies.early_exit import EarlyExit
from specdepth.policies.registry import make_policy
from specdepth.policies.testing import make_draft_ctx, make_plan_ctx


def test_budget_is_k_capped_by_max_depth() -> None:
    assert EarlyExit().plan(make_plan_ctx(3, max_depth=8)).tolist() == [8, 8, 8]  # k = 10 > K
    assert EarlyExit(k=4).plan(make_plan_ctx(2, max_depth=8)).tolist() == [4, 4]


def test_stops_after_the_first_low_top1_which_is_still_verified() -> None:
    policy = EarlyExit(threshold=0.6)
    ctx = make_draft_ctx([[0.9, 0.5], [0.9, 0.7], [0.59], [0.6]])
    assert policy.keep_drafting(ctx).tolist() == [False, True, False, True]  # 0.6 itself keeps drafting
    assert not policy.verifies(0)  # the position below the threshold is verified with the rest


def test_only_the_last_drafted_position_counts() -> None:
    # an early low top-1 does not stop a sequence that has since drafted past it with high top-1
    ctx = make_draft_ctx([[0.2, 0.95, 0.95]])
    assert EarlyExit(threshold=0.6).keep_drafting(ctx).tolist() == [True]


def test_spec_and_validation() -> None:
    policy = make_policy("early-exit:threshold=0.8,k=20")
    assert (policy.threshold, policy.k) == (0.8, 20)
    with pytest.raises(ValueError):
        EarlyExit(threshold=1.5)
    with pytest.raises(ValueError):
        EarlyExit(k=0)
