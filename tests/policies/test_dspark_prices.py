"""dspark's prices (policies/dspark_prices.py): the step's table, and the draft's lag and catch-up."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from specdepth.policies.base import StepOutcome
from specdepth.policies.dspark import DSpark
from specdepth.policies.dspark_prices import CATCH_UP_STEPS, StepPrices
from specdepth.policies.testing import LinearCost, make_plan_ctx

FLAT = LinearCost(target_s=0.02, draft_s=1e-5)  # every step token is free


def test_the_prices_draft_pass_by_rows_is_the_cost_model_s_line() -> None:
    """keep_drafting's pass of k = 1..B rows: linear between the cost model's draft_time(1) and
    draft_time(B) (keep_kernel draws the line), the same numbers at B = 1 without asking the model again."""
    from specdepth.adaptive.cost.model import load_cost
    cost = load_cost(Path(__file__).resolve().parents[2] / "experiments" / "profiles" / "cpu-bundled.json")
    for b, ctx in ((1, 0), (1, 300), (4, 300), (64, 9000)):
        view = cost.at_batch(b)
        one, all_ = float(view.draft_time(1, ctx)), float(view.draft_time(b, ctx))
        prices = StepPrices(0, view, ctx, b, 8)
        assert (prices.pass_one, prices.draft_all) == (one, all_)


def test_the_draft_lag_dspark_tracks_is_the_runner_s() -> None:
    """dspark's count of the tokens each draft cache lacks (`DraftLag.track`, from the steps' outcomes
    alone) equals the runner's own, on a real pair: sequences join and leave, spells of `off`
    alternate with drafting, and verification is cut short at random."""
    from tests.pairs import tiny_pair
    from specdepth.workers.runner import PairRunner

    target, draft = tiny_pair(noise=0.15)
    runner = PairRunner(target, draft, n_slots=6, max_depth=4, max_len=400)
    rng = np.random.default_rng(3)
    policy = DSpark()
    lags_seen = set()
    for step in range(60):
        while len(runner.seqs) < 6 and rng.random() < 0.5:
            runner.add(rng.integers(0, 96, int(rng.integers(2, 12))).tolist())
        if rng.random() < 0.1 and len(runner.seqs) > 1:
            runner.remove(int(rng.choice(sorted(runner.seqs))))
        slots = np.array(sorted(runner.seqs), np.int64)
        if not len(slots):
            continue
        policy.plan(replace(make_plan_ctx(len(slots), step=step, seq_ids=slots, cost=FLAT), cost_learns=True))
        truth = np.array([len(runner.seqs[s]) - runner.dcache.lengths[s] for s in slots])
        assert policy._draft_lag.of(slots).tolist() == truth.tolist(), step
        lags_seen.update(truth.tolist())
        budgets = np.zeros(len(slots), np.int64) if (step // 7) % 2 else rng.integers(0, 5, len(slots))
        res = runner.step(slots, budgets, verify_fn=lambda top1, ent, d: rng.integers(0, d + 1))
        zeros = np.zeros((len(slots), 1))
        policy.observe(StepOutcome(step, slots, budgets, res.drafted, res.verified, res.accepted, zeros, zeros,
                                   0.02, 0.0, 0.02, np.full(len(slots), 100)))
    assert {1, 2} <= lags_seen and max(lags_seen) >= 7  # after drafting, and after spells of off


def test_a_plan_after_a_spell_of_off_prices_the_draft_s_catch_up() -> None:
    """Drafting after k steps of `off` first feeds each draft cache the k or so tokens committed
    since: a pass over rows x k tokens, less the usual pass, spread over CATCH_UP_STEPS steps.
    A plan that gains a little stays at `off` for sequences that lag; one that gains a lot drafts
    anyway; a sequence that drafted last step, or a newcomer, pays nothing extra. Live only."""
    # 4 sequences, a 20 ms step whatever its tokens, a draft pass of n rows 1 ms + 0.5 ms a row:
    # at 0.35 acceptance one position gains 17% (5.4 tokens in 23 ms against 4 in 20)
    cost = LinearCost(target_s=0.020, draft_s=0.001, draft_per_seq_s=0.0005)
    ids = np.arange(4)

    def plan_after_off(spell: int, prior: float, learns: bool = True) -> np.ndarray:
        policy = DSpark(probe=False, spell=False)  # every step planned (not a plain spell's skips)
        for step in range(spell):  # steps of `off`: every sequence's cache falls one token behind
            policy.plan(replace(make_plan_ctx(4, step=step, prior_conf=0.0, cost=cost), cost_learns=learns))
            z, zc = np.zeros(4, np.int64), np.zeros((4, 1))
            policy.observe(StepOutcome(step, ids, z, z, z, z, zc, zc, 0.02, 0.0, 0.02, np.full(4, 100)))
        return policy.plan(replace(make_plan_ctx(4, step=spell, prior_conf=prior, cost=cost), cost_learns=learns))

    assert plan_after_off(0, 0.35).any() and plan_after_off(1, 0.35).any()  # lag 1 and 2: the usual
    assert not plan_after_off(40, 0.35).any()  # lag 41: a pass of 4 x 41 rows, 5 ms a step spread
    assert plan_after_off(40, 0.35, learns=False).any()  # a replay models no draft cache
    assert plan_after_off(40, 0.95).any()  # a large gain still drafts
    catch = (cost.draft_time(2 * 41) - cost.draft_time(2)) / CATCH_UP_STEPS  # the two rows that draft
    policy = DSpark()
    policy._draft_lag.ids, policy._draft_lag.lag = ids, np.array([41, 41, 1, 1])
    ctx = make_plan_ctx(4, prior_conf=0.35, cost=cost)
    assert policy._draft_lag.catch_up_s(ctx, np.array([1, 1, 0, 0]) > 0, 0) / CATCH_UP_STEPS == pytest.approx(catch)
    assert policy._draft_lag.catch_up_s(ctx, np.array([0, 0, 2, 2]) > 0, 0) / CATCH_UP_STEPS == 0.0  # they drafted last step
    assert policy._draft_lag.catch_up_s(make_plan_ctx(4, seq_ids=[7, 8, 9, 10], cost=cost), np.ones(4, bool), 0) == 0.0


def test_a_plan_pays_a_model_free_drafter_s_proposing_once_live() -> None:
    """A model-free draft costs no pass but its proposing is host work (`FreeDraftCost.drafting_s`):
    live, a plan that drafts pays it once; one that gains less than it drafts nothing; a replay
    (the cost not learned) is priced as before."""
    from specdepth.adaptive.cost.free_draft import FreeDraftCost
    from specdepth.adaptive.cost.model import FixedCost
    cost = FreeDraftCost(FixedCost(target_ms=20, draft_ms=0))  # a 20 ms step whatever its tokens

    def plan(prior: float, per_row_s: float, learns: bool = True) -> np.ndarray:
        cost._rows.row_s = per_row_s
        return DSpark(probe=False).plan(replace(make_plan_ctx(4, prior_conf=prior, cost=cost), cost_learns=learns))

    assert plan(0.3, 0.0).any()  # free: any gain drafts
    assert plan(0.3, 0.001).any()  # 4 ms (+20%) for ~1.7 tokens on 4 (+43%): pays
    assert not plan(0.3, 0.003).any()  # 12 ms (+60%): does not
    assert plan(0.3, 0.003, learns=False).any()  # a replay prices no proposing
    assert plan(0.95, 0.003).any()  # a large gain drafts anyway
