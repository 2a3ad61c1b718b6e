"""The compiled loops (policies/kernels.py, policies/verify_columns.py) give the numpy reference's
answers, exactly.

`plan_kernel` against `kernels_reference.plan_budgets` and `VerifyColumns` against `ColumnAllocator` (both
checked against the rule as written in test_allocation.py), on random batches over costs with a
knee, flat costs, steep ones, non-monotone tables, margins, ties, NaN and out-of-range inputs.
"""

from __future__ import annotations

import numpy as np
import pytest

from specdepth.policies.kernels import keep_kernel, plan_kernel
from specdepth.policies.kernels_reference import ColumnAllocator, plan_budgets
from specdepth.policies.verify_columns import VerifyColumns
from tests.policies.test_allocation import COSTS, Knee, Table


def _confs(rng: np.random.Generator, b: int, k: int) -> np.ndarray:
    """(b, k) confidences: mostly in [0, 1], some ties, some exact 0/1, some NaN or out of range."""
    conf = rng.uniform(0.05, 1.0, (b, k))
    kind = rng.integers(0, 12)
    if kind == 0:
        conf = np.round(conf, 1)  # many ties
    elif kind == 1:
        conf[rng.random((b, k)) < 0.2] = np.nan
    elif kind == 2:
        conf = conf * 1.4 - 0.2  # some < 0, some > 1
    elif kind == 3:
        conf[:] = rng.choice([0.0, 0.5, 1.0])  # all equal
    return conf


PLAN_COSTS = [*COSTS, Knee(knee=10, slope=2e-3, draft=4e-4), Knee(knee=200, slope=1e-4, draft=1e-3),
              Table(times=(1.0,) * 12 + (1.3,) * 8 + (2.0,) * 30, draft=0.05),
              Table(times=(1.0, 0.9, 1.2, 1.1, 1.1, 0.8, 1.5) * 40, draft=0.01)]  # not monotone


@pytest.mark.parametrize("cost", PLAN_COSTS, ids=lambda c: type(c).__name__)
def test_plan_kernel_equals_plan_budgets(cost) -> None:
    rng = np.random.default_rng(11)
    for i in range(80):
        b = int(rng.choice([1, 2, 5, 16, 40]))
        k = int(rng.integers(1, 9))
        conf = _confs(rng, b, k)
        clipped = np.fmin(np.fmax(conf, 0.0), 1.0)
        prior = clipped.copy()
        for j in range(1, k):
            prior[:, j] = clipped[:, j] * prior[:, j - 1]  # the same products dspark forms
        margin = 0.03 if i % 7 == 0 else 0.0
        price = i % 5 != 0
        pass_time = cost.draft_time(b, 0) if price else 0.0
        times = np.asarray(cost.target_time(b + np.arange(b * k + 1), 0), np.float64)
        want = plan_budgets(prior, cost, 0, margin=margin, price_draft=price)
        got, deepest = plan_kernel(conf, times, pass_time, margin)
        assert got.tolist() == want.tolist(), (i, b, k)
        assert deepest == want.max()
        ceil, deepest = plan_kernel(conf, times, pass_time, margin, 9)
        assert ceil.tolist() == np.where(want > 0, 9, 0).tolist() and deepest == (9 if want.any() else 0)


@pytest.mark.parametrize("cost", PLAN_COSTS, ids=lambda c: type(c).__name__)
def test_verify_columns_equal_the_column_allocator(cost) -> None:
    rng = np.random.default_rng(12)
    for i in range(80):
        b, jm = int(rng.choice([1, 3, 8, 30])), int(rng.integers(1, 9))
        conf = _confs(rng, b, jm)
        drafted = rng.integers(0, jm + 1, b)
        margin = 0.02 if i % 5 == 0 else 0.0
        sunk = float(rng.choice([0.0, 0.004]))
        step_time = lambda k, b=b: sunk + np.asarray(cost.target_time(b + np.asarray(k), 0), np.float64)  # noqa: E731
        ref = ColumnAllocator(b, step_time, margin, i % 3)
        if i % 2:  # the sunk time added where read (as dspark asks)
            target = lambda k, b=b: np.asarray(cost.target_time(b + np.asarray(k), 0), np.float64)  # noqa: E731
            fast = VerifyColumns(b, target(np.arange(b * (i % 3) + 1)), margin, target, extra=sunk)
        else:
            fast = VerifyColumns(b, step_time(np.arange(b * (i % 3) + 1)), margin, step_time)
        lens = rng.integers(1, 100, b)
        for j in range(1, jm + 1):
            ref.push(np.fmin(np.fmax(conf[:, j - 1], 0.0), drafted > j - 1))  # as dspark pushed a column
            got = fast.answer(conf[:, :j].copy(), np.minimum(drafted, j), lens)
            assert got is not None and got.tolist() == ref.lengths().tolist(), (i, j)
            assert (fast.j, fast.frozen) == (ref.j, ref.frozen)


def test_verify_columns_notice_a_call_that_does_not_continue_the_last() -> None:
    cost = Knee(knee=4, slope=5e-3, draft=1e-3)
    conf, drafted, lens = np.full((3, 4), 0.9), np.full(3, 4), np.array([5, 6, 7])
    times = cost.target_time(3 + np.arange(13), 0)
    fresh = lambda: VerifyColumns(3, times)  # noqa: E731
    a = fresh()
    assert a.answer(conf[:, :1].copy(), np.minimum(drafted, 1), lens) is not None
    assert a.answer(conf[:, :3].copy(), np.minimum(drafted, 3), lens) is None  # skipped column 2
    for change in ("conf", "drafted", "lens"):
        a = fresh()
        a.answer(conf[:, :2].copy(), np.minimum(drafted, 2), lens)
        c, d, ln = conf[:, :3].copy(), np.minimum(drafted, 3), lens.copy()
        if change == "conf":
            c[1, 0] = 0.5
        elif change == "drafted":
            d[2] = 1
        else:
            ln[0] += 1
        assert a.answer(c, d, ln) is None, change
    a = fresh()
    a.answer(conf[:, :2].copy(), np.minimum(drafted, 2), lens)
    assert a.answer(conf[:, :3].copy(), np.minimum(drafted, 3), lens) is not None  # a true continuation


def test_an_answer_handed_out_stays_as_it_was() -> None:
    cost = Knee(knee=4, slope=5e-3, draft=1e-3)
    conf, drafted, lens = np.full((3, 4), 0.9), np.full(3, 4), np.zeros(3, np.int64)
    fast = VerifyColumns(3, cost.target_time(3 + np.arange(13), 0))
    first = fast.answer(conf[:, :1].copy(), np.minimum(drafted, 1), lens)
    kept = first.tolist()
    fast.answer(conf[:, :2].copy(), np.minimum(drafted, 2), lens)
    assert first.tolist() == kept


def test_verify_columns_refuse_too_few_prices() -> None:
    fast = VerifyColumns(2, np.ones(3))
    with pytest.raises(ValueError, match="more slots than the 2 priced"):
        fast.answer(np.full((2, 2), 0.9), np.full(2, 2), np.zeros(2, np.int64))


def _keep(conf, drafted, prior_next, times, pass_one=1e-3, pass_all=2e-3, streak=0.5, depth=2):
    b, j = len(conf), len(conf[0])
    prior = np.zeros((b, depth))
    prior[:, j] = prior_next  # positions past j + 1: rate 0 (one pass of lookahead)
    return keep_kernel(np.asarray(conf, float), np.asarray(drafted, np.int64), np.full(b, depth, np.int64), prior,
                       streak, np.asarray(times, float), pass_one, pass_all, 0.0)[0]


def test_keep_kernel_by_hand() -> None:
    # one sequence, flat target: another position gains 0.9 * (0.5 * 0.8 + 0.5 * 0.9) = 0.765 tokens
    # for 1 ms on a 20 ms step: tau 1.9 -> 2.665, time 22 -> 23 ms: keep
    flat = np.full(10, 0.020)
    assert _keep([[0.9]], [1], [0.8], flat).tolist() == [True]
    # a dear pass (30 ms) is not paid back
    assert _keep([[0.9]], [1], [0.8], flat, pass_one=0.03, pass_all=0.03).tolist() == [False]
    # a sequence that stopped drafting (drafted < j) is never kept; the rest go on while they pay:
    # gains 0.765 and 0.525 both pay for their share of the pass (1 -> 1.5 ms), a gain of 0.1 does not
    assert _keep([[0.9], [0.7], [0.95]], [1, 1, 0], [0.8] * 3, np.full(12, 0.020)).tolist() == [True, True, False]
    assert _keep([[0.9], [0.2], [0.95]], [1, 1, 0], [0.8] * 3, np.full(12, 0.020)).tolist() == [True, False, False]
    # a compute-bound step: each extra token costs 5 ms, only the confident sequence pays
    steep = 0.020 + 0.005 * np.maximum(np.arange(12) - 4, 0)
    assert _keep([[0.95], [0.3]], [1, 1], [0.9, 0.3], steep, 1e-4, 2e-4).tolist() == [True, False]


def test_a_reset_instance_answers_as_a_fresh_one() -> None:
    rng = np.random.default_rng(13)
    cost = Knee(knee=20, slope=2e-3, draft=1e-3)
    times = cost.target_time(8 + np.arange(8 * 8 + 1), 0)
    step_time = lambda k: np.asarray(cost.target_time(8 + np.asarray(k), 0), np.float64)  # noqa: E731
    reused = VerifyColumns(8, times)
    for i in range(30):
        conf, drafted, lens = _confs(rng, 8, 6), rng.integers(0, 7, 8), rng.integers(1, 50, 8)
        short = i % 2  # a table too short for the step: priced further on the first call
        reused.reset(times[:3] if short else times, step_time)
        fresh = VerifyColumns(8, times[:3] if short else times, step_time=step_time)
        for j in range(1, 7):
            args = (conf[:, :j].copy(), np.minimum(drafted, j), lens)
            assert reused.answer(*args).tolist() == fresh.answer(*args).tolist()


def test_keep_kernel_counts_no_worth_past_a_budget() -> None:
    # two sequences after pass 1; the first's budget ends at 1 (e.g. its request has one token
    # left): it cannot draft on, and its would-be worth must not buy the second a pass
    times = np.full(12, 0.020)
    conf, drafted, prior = np.array([[0.95], [0.3]]), np.array([1, 1]), np.full((2, 8), 0.9)
    args = (prior, 0.5, times, 2e-3, 2.1e-3, 0.0)  # a pass of one row, of both: a second row costs 0.1 ms more
    assert keep_kernel(conf, drafted, np.array([8, 8]), *args)[0].tolist() == [True, True]
    assert keep_kernel(conf, drafted, np.array([1, 8]), *args)[0].tolist() == [False, False]


def test_keep_kernel_can_look_past_a_step_in_the_step_time() -> None:
    # batch 1 after pass 1: the third token costs 4 ms of target time, the next five nothing (a step
    # time that rises in steps). One more pass alone does not pay; three more do, which only a rule
    # looking several passes ahead sees (dspark's `lookahead`)
    times = np.array([0.0, 0.010, 0.011, 0.015, 0.015, 0.015, 0.015, 0.015, 0.015, 0.015])
    conf, drafted, prior = np.array([[0.8]]), np.array([1]), np.full((1, 8), 0.8)
    args = (prior, 0.5, times, 1e-3, 1e-3, 0.0)
    assert not keep_kernel(conf, drafted, np.array([8]), *args, 1)[0][0]
    assert keep_kernel(conf, drafted, np.array([8]), *args, 8)[0][0]
    assert not keep_kernel(conf, drafted, np.array([2]), *args, 8)[0][0]  # its budget ends at 2


def test_plan_kernel_prices_a_first_cost_once_for_drafting_at_all() -> None:
    """`first` is paid once by a step that drafts (any depth), never by one that does not: 0 plans
    as before; a price past what the best plan gains over drafting nothing plans nothing, and one
    just under it still drafts (here the same budgets as with none)."""
    prior = np.full((4, 8), 0.8)
    times = np.full(4 * 8 + 1, 0.020)  # a step token is free
    base, deepest = plan_kernel(prior, times, 0.001, 0.0)
    assert plan_kernel(prior, times, 0.001, 0.0, 0, 0.0)[0].tolist() == base.tolist() and deepest > 0
    d = int(deepest)
    tau = 4 + 4 * sum(0.8 ** j for j in range(1, d + 1))  # the best plan's tokens
    gain_s = tau * 0.020 / 4 - (0.020 + d * 0.001)  # the time at which it would only tie drafting nothing
    assert plan_kernel(prior, times, 0.001, 0.0, 0, 0.999 * gain_s)[0].tolist() == base.tolist()
    assert not plan_kernel(prior, times, 0.001, 0.0, 0, 1.001 * gain_s)[0].any()
