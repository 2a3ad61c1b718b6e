"""off / static / vllm-disable / vllm-table: the vLLM configuration knobs, on hand-built batches."""

from __future__ import annotations

import numpy as np
import pytest

from specdepth.policies.static import Off, Static, VllmDisable, VllmTable, parse_table
from specdepth.policies.testing import make_plan_ctx


def test_off_budgets_are_zero() -> None:
    out = Off().plan(make_plan_ctx(5))
    assert out.dtype == np.int64 and out.tolist() == [0] * 5


def test_static_k_and_max_depth_cap() -> None:
    assert Static(k=4).plan(make_plan_ctx(3)).tolist() == [4, 4, 4]
    assert Static(k=4).plan(make_plan_ctx(3, max_depth=2)).tolist() == [2, 2, 2]
    with pytest.raises(ValueError, match="k must be"):
        Static(k=-1)


@pytest.mark.parametrize(("batch", "expected"), [(1, 3), (7, 3), (8, 0), (9, 0), (64, 0)])
def test_vllm_disable_switches_off_at_threshold(batch: int, expected: int) -> None:
    out = VllmDisable(k=3, threshold=8).plan(make_plan_ctx(batch))
    assert out.tolist() == [expected] * batch


@pytest.mark.parametrize(
    ("batch", "expected"),
    [(1, 5), (4, 5), (5, 5), (8, 5), (9, 3), (16, 3), (17, 1), (32, 1), (500, 1)],
)
def test_vllm_table_ranges_gaps_and_beyond(batch: int, expected: int) -> None:
    # 5..8 is a gap: it inherits the k of 1-4; beyond 32 the last k holds.
    policy = VllmTable(table="1-4:5/9-16:3/17-32:1")
    assert policy.plan(make_plan_ctx(batch, max_depth=8)).tolist() == [expected] * batch


def test_vllm_table_caps_by_max_depth_and_accepts_triples() -> None:
    policy = VllmTable(table=[(1, 4, 6), (5, 8, 2)])
    assert policy.plan(make_plan_ctx(2, max_depth=4)).tolist() == [4, 4]
    assert policy.table == "1-4:6/5-8:2"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("2-4:5", "start at batch size 1"),
        ("1-4:5/3-8:2", "overlaps"),
        ("1-4:5/9-6:2", "lo > hi"),
        ("1-4:-1", "k must be >= 0"),
        ("1-4", "bad table item"),
        ("1:4:5", "bad table item"),
        ("", "bad table item"),
    ],
)
def test_vllm_table_validation(table: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_table(table)
