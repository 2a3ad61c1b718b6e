"""dspark: budgets from predicted survivals, causal verification, dynamic depth, and its per-step cache."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest

from specdepth.policies.base import VerifyContext
from specdepth.policies.dspark import DSpark
from specdepth.policies.kernels_reference import allocate, plan_budgets
from specdepth.policies.registry import make_policy
from specdepth.policies.testing import LinearCost, make_draft_ctx, make_plan_ctx


@dataclass(frozen=True)
class Roofline:
    """max(memory, compute) + overhead; memory grows with the batch's KV tokens."""

    overhead: float = 1e-3
    memory: float = 0.015  # weights streamed once per pass
    memory_per_context: float = 5e-8  # KV bytes read per context token
    compute_per_token: float = 1e-4
    draft: float = 5e-4

    def target_time(self, n_tokens: np.ndarray | int, context_tokens: int = 0) -> np.ndarray | float:
        n = np.asarray(n_tokens, np.float64)
        mem = self.memory + self.memory_per_context * context_tokens
        return self.overhead + np.maximum(mem, self.compute_per_token * n)

    def draft_time(self, batch_size: int, context_tokens: int = 0) -> float:
        return self.draft


FLAT = LinearCost(target_s=0.02, draft_s=1e-5)  # every step token is free
COMPUTE_BOUND = LinearCost(target_s=0.0, target_per_token_s=1e-4, draft_s=1e-5)  # time ~ N


def verify_ctx(conf: np.ndarray, drafted: np.ndarray, cost, step: int = 0, context: int = 100
               ) -> VerifyContext:
    b = conf.shape[0]
    return VerifyContext(
        step=step,
        seq_ids=np.arange(b, dtype=np.int64),
        context_lens=np.full(b, context, np.int64),
        drafted=np.asarray(drafted, np.int64),
        conf=conf,
        top1=conf,
        cost=cost,
    )


def shown(ctx: VerifyContext, j: int) -> VerifyContext:
    """The context of causal call j, as adaptive.controller builds it: columns 1..j, masked past
    each sequence's drafted length (a new array each call), and drafted capped at j."""
    mask = np.arange(j) < ctx.drafted[:, None]  # (B, j)
    return replace(ctx, conf=ctx.conf[:, :j] * mask, top1=ctx.top1[:, :j], drafted=np.minimum(ctx.drafted, j))


def causal(policy: DSpark, ctx: VerifyContext) -> tuple[np.ndarray, list[np.ndarray]]:
    """What the controller does: ask position by position, keep j while every answer says >= j."""
    kept = np.zeros(len(ctx.seq_ids), np.int64)
    answers = []
    for j in range(1, ctx.conf.shape[1] + 1):
        ans = policy.verify(shown(ctx, j))
        answers.append(ans)
        kept += (kept == j - 1) & (ans >= j)
    return kept, answers


def random_conf(rng: np.random.Generator, b: int, j: int) -> tuple[np.ndarray, np.ndarray]:
    drafted = rng.integers(0, j + 1, b)
    conf = rng.uniform(0.2, 1.0, (b, j))
    conf[np.arange(j)[None, :] >= drafted[:, None]] = 0.0
    return conf, drafted


# --- plan ---------------------------------------------------------------------------------------


def test_switches_itself_off_when_compute_bound_and_goes_deep_when_flat() -> None:
    policy = DSpark()
    assert policy.plan(make_plan_ctx(32, prior_conf=0.9, cost=COMPUTE_BOUND)).tolist() == [0] * 32
    assert policy.plan(make_plan_ctx(32, prior_conf=0.9, cost=FLAT)).tolist() == [8] * 32


def test_plan_is_plan_budgets_on_the_prior_survival() -> None:
    rng = np.random.default_rng(0)
    cost = Roofline()
    for b in (1, 7, 64):
        ctx = make_plan_ctx(b, prior_conf=rng.uniform(0.3, 1.0, (b, 8)), cost=cost,
                            context_lens=rng.integers(10, 5000, b))
        want = plan_budgets(ctx.prior_survival, cost, int(ctx.context_lens.sum()))
        assert DSpark(dynamic=False).plan(ctx).tolist() == want.tolist()


def test_per_sequence_history_sets_the_budget() -> None:
    # Past the knee a slot costs ~10% of a pass: worth it for a confident sequence's deep positions,
    # not for a doubtful one's first.
    prior = np.array([[0.95] * 8, [0.7] * 8, [0.3] * 8])
    cost = Roofline(overhead=0.008, memory=0.012, compute_per_token=0.002, draft=2e-4)  # knee at N = 6
    budgets = DSpark(dynamic=False).plan(make_plan_ctx(3, prior_conf=prior, cost=cost))
    assert budgets[0] > budgets[1] > budgets[2] == 0


def test_context_aware_cost_and_its_ablation() -> None:
    # Long contexts make the pass memory-bound for longer: more free step tokens, deeper budgets.
    cost = Roofline(memory=0.002)
    short = make_plan_ctx(64, prior_conf=0.8, cost=cost, context_lens=[50] * 64)
    long = make_plan_ctx(64, prior_conf=0.8, cost=cost, context_lens=[8000] * 64)
    assert DSpark(dynamic=False).plan(long).sum() > DSpark(dynamic=False).plan(short).sum()
    blind = DSpark(context_aware=False, dynamic=False)
    assert blind.plan(long).tolist() == blind.plan(short).tolist()


def test_draft_pricing_and_its_ablation() -> None:
    dear = LinearCost(target_s=0.02, draft_s=0.004)
    assert 0 < DSpark(dynamic=False).plan(make_plan_ctx(4, prior_conf=0.7, cost=dear)).max() < 8
    assert DSpark(price_draft=False, dynamic=False).plan(make_plan_ctx(4, prior_conf=0.7, cost=dear)).max() == 8


# --- verify -------------------------------------------------------------------------------------


@pytest.mark.parametrize("cost", [Roofline(), Roofline(memory=0.002), FLAT, COMPUTE_BOUND],
                         ids=["roofline", "small-knee", "flat", "compute-bound"])
def test_each_causal_answer_is_the_allocation_of_the_columns_shown(cost) -> None:
    rng = np.random.default_rng(1)
    for step in range(30):
        b = int(rng.integers(1, 40))
        conf, drafted = random_conf(rng, b, int(rng.integers(1, 9)))
        ctx = verify_ctx(conf, drafted, cost, step=step)
        survival = np.cumprod(conf, axis=1)
        kept, answers = causal(DSpark(), ctx)
        for j, ans in enumerate(answers, start=1):
            want = allocate(survival[:, :j], cost.target_time, int(ctx.context_lens.sum()))
            assert ans.tolist() == want.tolist()
        assert np.all(kept <= drafted)


def test_verify_counts_the_draft_passes_already_run_in_the_step_time() -> None:
    """Sunk, but in Theta's denominator: with the plan's passes as extra time the answer is
    `allocate(..., extra_time=passes * draft_time)`, which admits more than leaving them out."""
    cost = LinearCost(target_s=0.01, draft_s=0.004, target_per_token_s=0.0015)
    rng = np.random.default_rng(3)
    more = 0
    for step in range(20):
        b = int(rng.integers(2, 30))
        pol = DSpark(dynamic=False)
        budgets = pol.plan(make_plan_ctx(b, prior_conf=0.85, cost=cost, step=step))
        passes = int(budgets.max(initial=0))
        if passes == 0:
            continue
        conf, _ = random_conf(rng, b, passes)
        drafted = budgets.copy()
        conf = conf * (np.arange(passes)[None, :] < drafted[:, None])
        ctx = verify_ctx(conf, drafted, cost, step=step)
        kept, answers = causal(pol, ctx)
        survival = np.cumprod(conf, axis=1)
        extra = passes * cost.draft_time(b, int(ctx.context_lens.sum()))
        for j, ans in enumerate(answers, start=1):
            want = allocate(survival[:, :j], cost.target_time, int(ctx.context_lens.sum()), extra_time=extra)
            assert ans.tolist() == want.tolist()
        more += int(kept.sum() > causal(DSpark(), verify_ctx(conf, drafted, cost, step=step))[0].sum())
    assert more > 0  # the sunk passes lower the bar at least sometimes


def test_verify_goes_deep_when_flat_and_verifies_nothing_when_compute_bound() -> None:
    conf = np.array([[0.9, 0.8, 0.7], [0.5, 0.5, 0.0]])
    drafted = np.array([3, 2])
    assert causal(DSpark(), verify_ctx(conf, drafted, FLAT))[0].tolist() == [3, 2]
    assert causal(DSpark(), verify_ctx(conf, drafted, COMPUTE_BOUND))[0].tolist() == [0, 0]


def test_cached_answers_equal_fresh_ones_whatever_the_call_order() -> None:
    # One instance asked mostly as the controller asks (j = 1, 2, ...), but also with repeats,
    # jumps, new steps, inputs changed in place under the same step, and another cost, must answer
    # exactly as a new instance would.
    rng = np.random.default_rng(2)
    costs = [Roofline(memory=0.002), Roofline(), FLAT]
    policy = DSpark()
    conf, drafted = random_conf(rng, 16, 6)
    step, cost, j, froze = 0, costs[0], 0, 0
    for _ in range(600):
        event = rng.integers(0, 12)
        if event == 0 or j >= conf.shape[1]:
            step, j = step + 1, 0
            conf, drafted = random_conf(rng, int(rng.integers(1, 24)), int(rng.integers(1, 8)))
        elif event == 1 and j:
            conf[rng.integers(0, conf.shape[0]), rng.integers(0, j)] = rng.uniform(0.2, 1.0)  # in place
        elif event == 2:
            cost = costs[rng.integers(0, len(costs))]
        elif event == 3:
            j = int(rng.integers(0, conf.shape[1]))
        j += 1
        full = verify_ctx(conf, drafted, cost, step=step)
        # either a view of the whole table, or the controller's masked copy with drafted capped
        ctx = replace(full, conf=conf[:, :j], top1=conf[:, :j]) if rng.integers(0, 2) else shown(full, j)
        got = policy.verify(ctx)
        assert got.tolist() == DSpark().verify(ctx).tolist()
        got[:] = 99  # the answer is the caller's to keep: changing it changes nothing here
        froze += bool(policy._alloc is not None and policy._alloc.frozen)
    assert froze > 20  # the final-answer shortcut was exercised


def test_verify_masks_positions_past_drafted_and_bad_confidences() -> None:
    conf = np.array([[0.9, 0.9, 0.9], [np.nan, 0.9, 0.9], [1.7, -0.5, 0.9]])
    drafted = np.array([1, 3, 3])
    kept, _ = causal(DSpark(), verify_ctx(conf, drafted, FLAT))
    assert kept.tolist() == [1, 0, 1]
    assert DSpark().verify(verify_ctx(np.zeros((3, 0)), drafted, FLAT)).tolist() == [0, 0, 0]


def test_margin_demands_a_relative_gain() -> None:
    cost = LinearCost(target_s=1.0, target_per_token_s=0.01)
    conf = np.array([[0.9, 0.06]])  # position 2 adds 0.054 expected tokens (+2.8%) for +1% time
    assert causal(DSpark(), verify_ctx(conf, [2], cost))[0].tolist() == [2]
    assert causal(DSpark(margin=0.05), verify_ctx(conf, [2], cost))[0].tolist() == [1]


def test_parameters_and_registry() -> None:
    with pytest.raises(ValueError, match="margin"):
        DSpark(margin=-0.1)
    policy = make_policy("dspark:margin=0.05,context_aware=false")
    assert isinstance(policy, DSpark) and policy.margin == 0.05 and policy.context_aware is False
    assert policy.describe() == ("dspark(margin=0.05, price_draft=True, context_aware=False, dynamic=True, "
                                 "streak=0.5, lookahead=1, weigh_asks=True, probe=True, weigh_verify=True, "
                                 "follow_plan=True, catch_up=True, rail=True, closing=True, spell=True, jump=False)")
    with pytest.raises(ValueError, match="lookahead"):
        DSpark(lookahead=0)
    assert make_policy("dspark:lookahead=8").lookahead == 8


# --- dynamic draft depth (keep_drafting) -------------------------------------------------------------


def test_dynamic_stop_drafts_on_confident_chains_and_stops_doubtful_ones() -> None:
    policy = DSpark()
    # each verified token costs 0.5 ms on a 10 ms pass: worth it only for likely survivors
    pctx = make_plan_ctx(2, prior_conf=0.6, cost=LinearCost(0.010, 0.0002, 0.0005))
    assert policy.plan(pctx).tolist() == [8, 8]  # the plan's depth is a ceiling
    conf = np.array([[0.99, 0.98, 0.97], [0.5, 0.2, 0.05]])  # a streak vs a fading chain
    keep = policy.keep_drafting(make_draft_ctx(conf, budgets=[8, 8], step=pctx.step))
    assert keep.tolist() == [True, False]
    # the fixed prior plan with no dynamic stop keeps its budgets, keep_drafting always says yes
    static = DSpark(dynamic=False)
    budgets = static.plan(pctx)
    assert static.keep_drafting(make_draft_ctx(conf, budgets=budgets, step=pctx.step)).all()


def test_dynamic_stop_stops_everything_when_compute_bound() -> None:
    policy = DSpark()
    pctx = make_plan_ctx(2, prior_conf=0.9, cost=FLAT)
    policy.plan(pctx)
    conf = np.full((2, 2), 0.9)
    assert policy.keep_drafting(make_draft_ctx(conf, budgets=[8, 8], step=pctx.step)).all()
    dear = make_plan_ctx(2, prior_conf=0.9, cost=COMPUTE_BOUND)
    assert policy.plan(dear).tolist() == [0, 0]
