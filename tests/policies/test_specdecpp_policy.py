"""specdec++: stop once 1 - prod(c) > h, never before min_depth, budget min(20, max_depth)."""

from __future__ import annotations

import pytest

from specdepth.policies.specdecpp import SpecDecPP
from specdepth.policies.testing import make_draft_ctx, make_plan_ctx


def test_stop_rule_on_rejection_probability() -> None:
    p = SpecDecPP(h=0.3)
    ctx = make_draft_ctx(
        [
            [0.9, 0.8],  # 1 - 0.72 = 0.28 <= 0.3: keep
            [0.9, 0.7],  # 1 - 0.63 = 0.37 > 0.3: stop
            [0.95, 0.9, 0.8],  # 1 - 0.684 = 0.316: stop
            [0.99, 0.99, 0.99],  # 0.0297: keep
        ]
    )
    assert p.keep_drafting(ctx).tolist() == [True, False, False, True]


def test_never_stops_before_min_depth() -> None:
    ctx = make_draft_ctx([[0.1], [0.1, 0.1]])
    assert SpecDecPP(h=0.3).keep_drafting(ctx).tolist() == [True, False]
    assert SpecDecPP(h=0.3, min_depth=0).keep_drafting(ctx).tolist() == [False, False]


def test_uses_calibrated_conf_not_raw_top1() -> None:
    ctx = make_draft_ctx([[0.99, 0.99]], conf=[[0.5, 0.5]])
    assert SpecDecPP(h=0.3).keep_drafting(ctx).tolist() == [False]


@pytest.mark.parametrize(("max_depth", "expected"), [(8, 8), (20, 20), (32, 20), (1, 1)])
def test_budget_bounded_by_twenty_and_max_depth(max_depth: int, expected: int) -> None:
    assert SpecDecPP().plan(make_plan_ctx(3, max_depth=max_depth)).tolist() == [expected] * 3


def test_validation() -> None:
    with pytest.raises(ValueError):
        SpecDecPP(h=1.5)
    with pytest.raises(ValueError):
        SpecDecPP(min_depth=5, max_depth=3)
