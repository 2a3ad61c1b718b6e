"""dspark in a closing run: only the sequences that decide when the run ends draft."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from specdepth.policies.dspark import DSpark
from specdepth.policies.dspark_closing import PACE_STEPS, Pace, decode_bound, expected_tokens, plain_rows
from specdepth.policies.testing import LinearCost, make_plan_ctx

FLAT = LinearCost(target_s=0.01, target_per_token_s=0.0)  # extra tokens cost nothing: drafting pays


def test_expected_tokens_sums_the_survivals_up_to_each_budget() -> None:
    surv = np.array([[0.9, 0.5, 0.2], [0.4, 0.1, 0.0]])
    assert np.allclose(expected_tokens(surv, np.array([2, 0])), [2.4, 1.0])
    assert np.allclose(expected_tokens(surv, np.array([3, 3])), [2.6, 1.5])


def test_sequences_that_finish_before_the_slowest_step_plain() -> None:
    surv = np.full((3, 2), 0.5)  # 2 tokens a step at budget 2
    # 40 tokens at 2 a step: 20 steps; 15 left finish in 15 steps plain, 30 left do not
    plain = plain_rows(np.array([40, 15, 30]), surv, np.array([2, 2, 2]))
    assert plain.tolist() == [False, True, False]
    # the slowest sequence predicted to accept nothing: the run ends at its length, whatever the
    # others do; it keeps drafting, so that its measure stays current
    surv[0] = 0.0
    assert plain_rows(np.array([40, 15, 30]), surv, np.array([2, 2, 2])).tolist() == [False, True, True]
    # a sequence's own measure in this run overrides an optimistic prior: 30 left at 1.2 a step make
    # it the slowest (25 steps), and 20 left finish by then plain (at the prior's 2 a step: 15)
    surv[0] = 0.5
    remaining, budgets = np.array([20, 15, 30]), np.array([2, 2, 2])
    assert plain_rows(remaining, surv, budgets).tolist() == [False, True, False]
    measured = np.array([np.nan, np.nan, 1.2])
    assert plain_rows(remaining, surv, budgets, measured).tolist() == [True, True, False]
    # a lone sequence is its own critical path: it keeps drafting
    assert plain_rows(np.array([7]), np.full((1, 2), 0.5), np.array([2])).tolist() == [False]


def test_dspark_steps_plain_what_finishes_in_time_only_while_the_run_closes() -> None:
    ctx = make_plan_ctx(3, prior_conf=0.8, cost=FLAT, max_depth=4)
    open_run = DSpark(dynamic=False).plan(ctx)
    assert open_run.tolist() == [4, 4, 4]  # nothing known of the run's end: the throughput plan
    closing = DSpark(dynamic=False).plan(replace(ctx, closing=np.array([90, 20, 60])))
    assert closing.tolist() == [4, 0, 4]
    ablated = DSpark(dynamic=False, closing=False).plan(replace(ctx, closing=np.array([90, 20, 60])))
    assert ablated.tolist() == [4, 4, 4]


@dataclass(frozen=True)
class ConcaveCost(LinearCost):
    """A step priced a + b sqrt(N): a verified token in a wide step costs less than a decoded one
    in a narrower step (a CPU at batch 16)."""

    def target_time(self, n_tokens, context_tokens: int = 0):
        return self.target_s + 0.002 * np.sqrt(np.asarray(n_tokens, dtype=np.float64))


def test_the_closing_rule_holds_only_where_a_verified_token_costs_what_a_decoded_one_does() -> None:
    assert decode_bound(LinearCost(target_s=0.01, target_per_token_s=1e-4), 16, 0)  # linear: the premise
    assert decode_bound(FLAT, 16, 0)  # nothing costs anything more: drafts for finishing rows are waste
    assert not decode_bound(ConcaveCost(), 16, 0)  # concave: accepted drafts now save more later
    assert not decode_bound(LinearCost(target_s=0.01, target_per_token_s=1e-4), 1, 0)  # a lone sequence
    for cost in (LinearCost(target_s=0.01, target_per_token_s=1e-4), FLAT, ConcaveCost()):  # a step's prices
        table = np.asarray(cost.target_time(np.arange(33), 0), np.float64)  # (as StepPrices holds them)
        assert decode_bound(cost, 16, 0, table) == decode_bound(cost, 16, 0)
    assert decode_bound(ConcaveCost(), 16, 0, np.arange(33.0))  # read off the table where it reaches 2B...
    assert not decode_bound(ConcaveCost(), 16, 0, np.arange(32.0))  # ...else the model's
    ctx = replace(make_plan_ctx(3, prior_conf=0.8, cost=ConcaveCost(), max_depth=4), closing=np.array([90, 20, 60]))
    assert DSpark(dynamic=False).plan(ctx).tolist() == [4, 4, 4]  # concave: every sequence keeps its plan
    assert DSpark(dynamic=False).plan(replace(ctx, cost=FLAT)).tolist() == [4, 0, 4]


def test_pace_measures_tokens_a_step_while_allowed_to_draft() -> None:
    pace = Pace()
    ids = np.array([7, 8])
    for _ in range(PACE_STEPS):
        pace.observe(ids, np.array([3, 0]), np.array([1, 0]), np.zeros(0, np.int64))
    rate = pace.rate(ids)
    assert rate[0] == 2.0 and np.isnan(rate[1])  # 8 never drafted: unknown
    pace.observe(ids, np.array([3, 3]), np.array([0, 2]), np.array([7]))
    assert np.isnan(pace.rate(np.array([7]))[0])  # finished: forgotten
