"""dspark: budgets from predicted survivals, causal verification, and its per-step cache."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

from specdepth.policies.kernels_reference import allocate, plan_budgets
from specdepth.policies.base import VerifyContext
from specdepth.policies.dspark import ASK_EVIDENCE, ASK_PROBE, ASK_PROBE_MAX, ASK_SPEND, DSpark

EVIDENCE = ASK_EVIDENCE  # asked steps before the measure may stop drafting past 1


def probe_gaps(loss: float, n: int) -> list[int]:
    """Steps after the first EVIDENCE at which a measure stopped on a steady `loss` asks anyway:
    spaced to spend ~ASK_SPEND of throughput, between ASK_PROBE and ASK_PROBE_MAX steps."""
    gap = int(np.clip(np.ceil(loss / ASK_SPEND), ASK_PROBE, ASK_PROBE_MAX))
    return [gap * (i + 1) - 1 for i in range(n)]
from specdepth.policies.registry import make_policy
from specdepth.policies.testing import LinearCost, make_plan_ctx


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
                                 "follow_plan=True, catch_up=True)")
    with pytest.raises(ValueError, match="lookahead"):
        DSpark(lookahead=0)
    assert make_policy("dspark:lookahead=8").lookahead == 8


# --- dynamic draft depth (keep_drafting) -------------------------------------------------------------


def test_dynamic_stop_drafts_on_confident_chains_and_stops_doubtful_ones() -> None:
    from specdepth.policies.testing import LinearCost, make_draft_ctx
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


def _one_deep_step(policy: DSpark, step: int, keep_s: float, conf: float, second_accepted: bool = True,
                   learns: bool = True) -> list[int]:
    """Plan a 2-sequence step whose plan drafts 1 deep; if it asks, ask after pass 1 with these
    confidences; report the step as run (a second pass where keep_drafting went on, its positions
    accepted or not), with `keep_s` of asking. Returns the plan's budgets."""
    from specdepth.policies.base import StepOutcome
    from specdepth.policies.testing import make_draft_ctx
    # a 10 ms target pass plus 3 ms a step token, 0.5 ms a draft pass: position 2 at the prior
    # (0.9 x 0.3) does not pay, so the plan drafts 1 deep
    cost = LinearCost(0.010, 0.0005, 0.003)
    pctx = replace(make_plan_ctx(2, prior_conf=np.array([[0.9, 0.3] + [0.3] * 6] * 2), cost=cost, step=step),
                   cost_learns=learns)  # live, measured (else the cost model's times are the measure)
    budgets = policy.plan(pctx)
    passes = 1
    if budgets.max() > 1 and policy.keep_drafting(make_draft_ctx(np.full((2, 1), conf), budgets=budgets.tolist(),
                                                                 step=step)).all():
        passes = 2
    drafted = np.full(2, passes, np.int64)
    accepted = np.full(2, 2 if passes == 2 and second_accepted else 1, np.int64)
    draft_s, target_s = passes * 0.0005, float(cost.target_time(2 + drafted.sum()))
    policy.observe(StepOutcome(step, np.arange(2), budgets, drafted, drafted, accepted, np.full((2, passes), 0.9),
                               np.full((2, passes), 0.9), draft_s + target_s, draft_s, target_s, np.full(2, 100),
                               np.zeros(0, np.int64), keep_s, first_pass_s=0.0005))
    return budgets.tolist()


def test_one_deep_steps_ask_keep_drafting_only_while_asking_pays() -> None:
    shallow = make_plan_ctx(2, prior_conf=np.array([[0.9, 0.3] + [0.3] * 6] * 2), cost=LinearCost(0.010, 0.0005, 0.003))
    assert DSpark(dynamic=False).plan(shallow).tolist() == [1, 1]  # the plan itself: 1 deep
    # asking is free (as in a replay) and the passes it adds pay (+16%): every step asks (the plan's
    # depth becomes the ceiling K)
    free = DSpark()
    assert all(_one_deep_step(free, s, 0.0, 0.99) == [8, 8] for s in range(20))
    # asking costs 3 ms (-12% on these steps, every one alike) and never pays (doubtful chains:
    # keep_drafting stops them): 1-deep steps keep their plan, but now and then one still asks,
    # one in 40 (each loses 12%: spending 0.3%) after the first EVIDENCE steps, which all ask
    dear = DSpark()
    asked = [_one_deep_step(dear, s, 3e-3, 0.3) == [8, 8] for s in range(EVIDENCE + 160)]
    assert all(asked[:EVIDENCE]) and np.flatnonzero(asked[EVIDENCE:]).tolist() == probe_gaps(0.1176, 4) == [39, 79, 119, 159]
    # another batch-size bucket (4 against 2) has its own measure: it asks until that stops it
    four = replace(make_plan_ctx(4, prior_conf=np.array([[0.9, 0.3] + [0.3] * 6] * 4),
                                 cost=LinearCost(0.010, 0.0005, 0.003), step=10_000), cost_learns=True)
    assert dear.plan(four).tolist() == [8] * 4 and DSpark(dynamic=False).plan(four).tolist() == [1] * 4
    # ... until confident chains whose second positions are accepted, and cheaper asks (0.2 ms),
    # make asking pay again: the probes see it, and every step asks
    asked = [_one_deep_step(dear, s, 2e-4, 0.99) == [8, 8] for s in range(200, 1200)]
    assert not all(asked[:20]) and all(asked[-50:])
    # free asks whose added passes are predicted to pay (confident chains) but measure a loss
    # (their second positions rejected: -22%): measured, not predicted, so asking stops too
    wasted = DSpark()
    asked = [_one_deep_step(wasted, s, 0.0, 0.99, second_accepted=False) == [8, 8]
             for s in range(EVIDENCE + 4 * ASK_PROBE_MAX)]
    assert all(asked[:EVIDENCE]) and np.flatnonzero(asked[EVIDENCE:]).tolist() == probe_gaps(0.224, 4)  # 1 in 64
    # without weigh_asks every step asks
    assert all(_one_deep_step(DSpark(weigh_asks=False), s, 3e-3, 0.3) == [8, 8] for s in range(20))
    # where the controller does not learn its cost model (a replay, a fixed cost) the measure is the
    # model's times, not the clock's: a measured 3 ms of asking changes nothing
    trusting = DSpark()
    assert all(_one_deep_step(trusting, s, 3e-3, 0.99, learns=False) == [8, 8] for s in range(20))


@pytest.mark.parametrize("follow_plan", [True, False])
def test_a_deeper_plan_is_drafted_without_asking_while_going_on_measures_a_loss(follow_plan: bool) -> None:
    """The measure covers every plan that drafts, not only 1-deep ones: once going on dynamically
    has measured a loss against the step drafted to the budgets it would have had without asking
    (the plan's; one position with follow_plan=False), plans draft those budgets with
    `keep_drafting` not asked (`drafts_dynamically` False); a probe now and then asks again."""
    from specdepth.policies.base import StepOutcome
    cost = LinearCost(0.010, 0.0005, 0.0002)  # cheap step tokens: the priors plan deeper than 1
    planned = int(DSpark(dynamic=False).plan(make_plan_ctx(2, prior_conf=0.8, cost=cost)).max())
    fixed = planned if follow_plan else 1
    assert planned == 6
    # an asked step drafts on 8 deep and only the first positions are accepted: as many tokens as
    # the fixed step's, in more time
    t_run = 8 * 5e-4 + float(cost.target_time(2 + 2 * 8))
    t_fixed = fixed * 5e-4 + float(cost.target_time(2 + 2 * fixed))
    gap = probe_gaps(1.0 - t_fixed / t_run, 1)[0] + 1  # 10.2% (35 steps) or 35.8% (64 steps)
    policy, budgets, dynamic = DSpark(follow_plan=follow_plan), [], []
    for step in range(EVIDENCE + gap + 2):
        pctx = replace(make_plan_ctx(2, prior_conf=0.8, cost=cost, step=step), cost_learns=True)
        b = policy.plan(pctx)
        budgets.append(int(b.max()))
        dynamic.append(policy.drafts_dynamically(step))
        passes = 8 if dynamic[-1] else int(b.max())
        d, one = np.full(2, passes, np.int64), np.ones(2, np.int64)
        target_s = float(cost.target_time(2 + 2 * passes))
        policy.observe(StepOutcome(step, np.arange(2), b, d, d, one, np.full((2, passes), 0.8),
                                   np.full((2, passes), 0.8), target_s + passes * 5e-4, passes * 5e-4, target_s,
                                   np.full(2, 100), np.zeros(0, np.int64), 0.0, first_pass_s=5e-4))
    n = EVIDENCE
    assert budgets[:n] == [8] * n and budgets[n:n + gap - 1] == [fixed] * (gap - 1) \
        and budgets[n + gap - 1] == 8  # the fixed budgets, nothing asked; then the probe asks
    assert all(dynamic[:n]) and not any(dynamic[n:n + gap - 1]) and dynamic[n + gap - 1]


def test_the_measure_compares_with_the_budgets_drafted_without_asking() -> None:
    """The other arm of the measure is the step drafted to the plan's budgets: tokens known where
    the run saw a rejection or verified as far, expected at the priors past where it stopped with
    everything accepted."""
    from specdepth.policies.base import StepOutcome
    out = StepOutcome(0, np.arange(4), np.full(4, 8), np.array([3, 1, 2, 4]), np.array([3, 1, 2, 4]),
                      np.array([1, 1, 2, 4]), np.zeros((4, 4)), np.zeros((4, 4)), 0.0, 0.0, 0.0, np.full(4, 10))
    prior = np.full((4, 8), 0.5)
    fixed = np.array([2, 3, 2, 2])
    # row 0: rejected at 2 (1 token); row 1: stopped at 1, all accepted, 2 more at 0.5 (0.5 + 0.25);
    # row 2: 2 accepted as far as the budget; row 3: verified past the budget (2)
    assert DSpark._fixed_tokens(out, fixed, prior) == pytest.approx(1 + 1.75 + 2 + 2)


def test_dynamic_stop_stops_everything_when_compute_bound() -> None:
    from specdepth.policies.testing import make_draft_ctx
    policy = DSpark()
    pctx = make_plan_ctx(2, prior_conf=0.9, cost=FLAT)
    policy.plan(pctx)
    conf = np.full((2, 2), 0.9)
    assert policy.keep_drafting(make_draft_ctx(conf, budgets=[8, 8], step=pctx.step)).all()
    dear = make_plan_ctx(2, prior_conf=0.9, cost=COMPUTE_BOUND)
    assert policy.plan(dear).tolist() == [0, 0]


def test_a_plan_that_gains_little_is_probed_now_and_then_where_the_cost_model_learns() -> None:
    """A plan now and then drafts nothing when drafting is predicted to gain under PROBE_GAIN, so
    a learning cost model sees the step the plan would not take: after PROBE_EVERY drafting plans,
    then ever more rarely (the spacing doubles up to PROBE_MAX), per batch-size bucket; never in a
    replay (the cost does not learn) and never where drafting is predicted to pay well."""
    from specdepth.policies.dspark import PROBE_EVERY, PROBE_GAIN, PROBE_MAX
    cost = LinearCost(target_s=0.020, draft_s=0.002)

    def probes(conf: float, learns: bool, steps: int = 2 * PROBE_EVERY, policy: DSpark | None = None,
               batch: int = 4, **params) -> list[int]:
        policy, out = policy or DSpark(**params), []
        for step in range(steps):
            b = policy.plan(replace(make_plan_ctx(batch, step=step, prior_conf=conf, cost=cost), cost_learns=learns))
            if not b.any():
                out.append(step)
        return out

    # conf 0.2: one position each, tau 4.8 in 22 ms against 4 in 20 ms: +9.1% < PROBE_GAIN
    assert PROBE_GAIN > 0.091
    spaced, P = DSpark(), PROBE_EVERY
    assert probes(0.2, True, 40 * P, spaced) == [P - 1, 3 * P - 1, 7 * P - 1, 15 * P - 1, 31 * P - 1]
    # the spacing stops doubling at PROBE_MAX: the next probe is PROBE_MAX plans after the last
    assert probes(0.2, True, 16 * P, spaced) == [31 * P - 1 + PROBE_MAX - 40 * P]
    assert probes(0.2, True, 2 * P, spaced, batch=16) == [P - 1]  # another bucket: its own spacing
    assert probes(0.2, False) == []
    assert probes(0.9, True) == []  # drafting predicted to pay far more than PROBE_GAIN
    assert probes(0.2, True, probe=False) == []


def test_a_plan_of_nothing_is_tried_one_deep_now_and_then_where_the_cost_model_learns() -> None:
    """The other way round: where drafting is priced too dear to pay, a plan now and then drafts
    one position anyway, so a learning cost model sees a drafting step (else a mispriced draft
    keeps the policy at `off` for good); after PROBE_EVERY plans of nothing, the spacing doubling
    up to PROBE_MAX, per bucket; drafted and verified as planned (`keep_drafting` and `verify` not
    asked); never in a replay, never with probe=False. A try drafts for the sequences new since
    the last plan (with a positive prior), whose draft caches hold all they have; see the next test
    for a batch with none."""
    from specdepth.policies.dspark import PROBE_EVERY, PROBE_MAX
    dear = LinearCost(target_s=0.020, draft_s=0.030)  # a draft pass dearer than the step it extends

    def tries(learns: bool, steps: int = 2 * PROBE_EVERY, policy: DSpark | None = None, batch: int = 4,
              conf: float | np.ndarray = 0.8, **params) -> list[tuple[int, list[int], bool]]:
        """Plans of `batch` sequences, one of which is new at every step (the last row)."""
        policy, out = policy or DSpark(**params), []
        for step in range(steps):
            ids = np.arange(step, step + batch)
            b = policy.plan(replace(make_plan_ctx(batch, step=step, seq_ids=ids, prior_conf=conf, cost=dear),
                                    cost_learns=learns))
            if b.any():
                out.append((step, b.tolist(), policy.drafts_dynamically(step)))
                assert not policy.verifies(step)  # verified as drafted, `verify` not asked
        return out

    P, new = PROBE_EVERY, [0, 0, 0, 1]
    policy = DSpark()
    assert tries(True, 40 * P, policy) == [(s, new, False) for s in (P - 1, 3 * P - 1, 7 * P - 1, 15 * P - 1, 31 * P - 1)]
    assert [s for s, _, _ in tries(True, 16 * P, policy)] == [31 * P - 1 + PROBE_MAX - 40 * P]  # spacing capped
    assert [s for s, _, _ in tries(True, 2 * P, policy, batch=16)] == [P - 1]  # another bucket: its own spacing
    conf = np.full((4, 8), 0.8)
    conf[3] = 0.0  # the newcomer has no chance at all: not drafted (the try is spent)
    assert tries(True, conf=conf) == []
    assert tries(False) == [] and tries(True, probe=False) == []


def test_a_try_waits_for_newcomers_then_drafts_every_sequence() -> None:
    """A due try drafts no sequence whose draft cache lags (one that has not drafted since some
    tokens were committed: its first pass would catch up on all of them). With the same sequences
    plan after plan it waits PROBE_EVERY plans for a newcomer, then drafts them all; a newcomer
    meanwhile is tried alone."""
    from specdepth.policies.dspark import PROBE_EVERY
    dear = LinearCost(target_s=0.020, draft_s=0.030)
    P = PROBE_EVERY

    def tried(ids_at) -> list[tuple[int, list[int]]]:
        policy, out = DSpark(), []
        for step in range(4 * P):
            ids = np.asarray(ids_at(step))
            b = policy.plan(replace(make_plan_ctx(len(ids), step=step, seq_ids=ids, prior_conf=0.8, cost=dear),
                                    cost_learns=True))
            if b.any():
                out.append((step, b.tolist()))
        return out

    assert tried(lambda step: [7, 8, 9]) == [(2 * P - 1, [1, 1, 1])]  # due at P - 1, held P plans
    arrival = P + 3
    assert tried(lambda step: [7, 8, 9] if step < arrival else [7, 8, 10]) == [(arrival, [0, 0, 1])]


def test_the_measure_stops_on_a_steady_loss_not_on_heavy_tailed_gains() -> None:
    """Going on past the first position gains in rare long streaks and loses a little on most
    steps (the bundled pair at batch 1). A steady 7% loss stops it after ASK_EVIDENCE asked steps,
    and then one step in 24 asks (the loss spacing); the same losses with one step in 25 gaining
    2.9x (+3.7% overall, though the running measure dips below zero between them) keep most steps
    asking: while the measure is negative but within its noise, steps ask one in 1 / P(a gain)."""
    from specdepth.policies.base import StepOutcome
    cost = LinearCost(0.010, 0.0005, 0.0002)  # cheap step tokens: the priors plan deeper than 1

    def run(streak_every: int, steps: int = 200) -> list[bool]:
        """Whether each step asked `keep_drafting` (else it stopped at one position: the measure
        against one position, as follow_plan=False weighs it)."""
        policy, asked = DSpark(follow_plan=False), []
        for step in range(steps):
            b = policy.plan(replace(make_plan_ctx(2, prior_conf=0.8, cost=cost, step=step), cost_learns=True))
            asked.append(policy.drafts_dynamically(step))
            streak = streak_every and step % streak_every == 0
            passes = (8 if streak else 2) if asked[-1] else int(b.max())
            d = np.full(2, passes, np.int64)
            a = d if streak else np.ones(2, np.int64)
            target_s = float(cost.target_time(2 + 2 * passes))
            policy.observe(StepOutcome(step, np.arange(2), b, d, d, a, np.full((2, passes), 0.8),
                                       np.full((2, passes), 0.8), target_s + passes * 5e-4, passes * 5e-4, target_s,
                                       np.full(2, 100), np.zeros(0, np.int64), 0.0, first_pass_s=5e-4))
        return asked

    steady = run(0, 1000)
    assert all(steady[:ASK_EVIDENCE]) and not steady[ASK_EVIDENCE]
    assert np.mean(steady) < 0.06
    assert np.mean(run(25, 1000)) > 0.6


def test_a_loss_within_its_noise_spaces_the_asks_by_the_chance_of_a_gain() -> None:
    from specdepth.policies.dspark import _Gate
    spacing = DSpark._ask_spacing
    assert spacing(_Gate(ask_gain=-0.02, ask_se=0.02)) == pytest.approx(1 / 0.158655, rel=1e-4)  # P = Phi(-1)
    assert spacing(_Gate(ask_gain=-0.001, ask_se=0.05)) == pytest.approx(2.0, rel=0.05)  # a coin flip
    assert spacing(_Gate(ask_gain=-0.02, ask_se=0.005)) == ASK_PROBE  # clear of the noise: the loss spacing
    assert spacing(_Gate(ask_gain=-0.12, ask_se=0.0)) == pytest.approx(0.12 / ASK_SPEND)
    assert spacing(_Gate(ask_gain=-0.5, ask_se=0.01)) == ASK_PROBE_MAX


def test_verify_is_skipped_on_one_deep_steps_while_asking_costs_more_than_it_saves() -> None:
    """On steps drafting one position, `verify` is asked while the target time it saves (priced
    by the cost model) has been worth the controller's time asking it (measured); else every
    drafted token is verified, and one step in VERIFY_PROBE asks anyway. Never skipped where the
    cost model is not learned (a replay: no time is measured)."""
    from specdepth.policies.base import StepOutcome
    from specdepth.policies.dspark import VERIFY_EVIDENCE, VERIFY_PROBE
    cost = LinearCost(0.010, 0.0005, 0.003)  # a verified token costs 3 ms
    prior = np.array([[0.9, 0.3] + [0.3] * 6] * 2)

    def run(policy: DSpark, dropped: bool, learns: bool = True) -> list[bool]:
        asked = []
        for step in range(VERIFY_EVIDENCE + 2 * VERIFY_PROBE):
            b = policy.plan(replace(make_plan_ctx(2, prior_conf=prior, cost=cost, step=step), cost_learns=learns))
            assert b.tolist() == [1, 1]
            asked.append(policy.verifies(step))
            drafted = np.ones(2, np.int64)
            verified = np.array([0 if dropped and asked[-1] else 1, 1])  # (2,) the answer leaves one out
            t = float(cost.target_time(2 + verified.sum()))
            policy.observe(StepOutcome(step, np.arange(2), b, drafted, verified, verified, np.full((2, 1), 0.9),
                                       np.full((2, 1), 0.9), t + 5e-4, 5e-4, t, np.full(2, 100), np.zeros(0, np.int64),
                                       0.0, 5e-4, 80e-6 if asked[-1] and learns else 0.0))
        return asked

    # asking takes 80 us and saves nothing (every drafted token verified): skipped after the
    # evidence, and one step in VERIFY_PROBE still asks
    asked = run(DSpark(dynamic=False), dropped=False)
    n = VERIFY_EVIDENCE
    assert all(asked[:n]) and not any(asked[n:n + VERIFY_PROBE - 1]) and asked[n + VERIFY_PROBE - 1]
    assert all(run(DSpark(dynamic=False), dropped=True))  # leaving a token out saves 3 ms: asked
    assert all(run(DSpark(dynamic=False), dropped=False, learns=False))
    assert all(run(DSpark(dynamic=False, weigh_verify=False), dropped=False))


def test_verify_is_weighed_apart_on_steps_drafting_dynamically() -> None:
    """Steps drafting dynamically (asking `keep_drafting`) weigh `verify` in a measure of their own:
    where asking it saves nothing it is skipped after the evidence (one step in VERIFY_PROBE still
    asks), and the measure of steps drafting the plan's budgets is left as it was."""
    from specdepth.policies.base import StepOutcome
    from specdepth.policies.dspark import VERIFY_EVIDENCE, VERIFY_PROBE
    cost = LinearCost(0.010, 0.0005, 0.003)
    prior = np.array([[0.9, 0.3] + [0.3] * 6] * 2)
    policy, asked = DSpark(weigh_asks=False), []  # never weighs the asks: every drafting step is dynamic
    for step in range(VERIFY_EVIDENCE + 2 * VERIFY_PROBE):
        b = policy.plan(replace(make_plan_ctx(2, prior_conf=prior, cost=cost, step=step), cost_learns=True))
        assert b.tolist() == [8, 8] and policy.drafts_dynamically(step)
        asked.append(policy.verifies(step))
        drafted = np.ones(2, np.int64)  # keep_drafting stopped after one pass; every drafted token verified
        t = float(cost.target_time(4))
        policy.observe(StepOutcome(step, np.arange(2), b, drafted, drafted, drafted, np.full((2, 1), 0.9),
                                   np.full((2, 1), 0.9), t + 5e-4, 5e-4, t, np.full(2, 100), np.zeros(0, np.int64),
                                   0.0, 5e-4, 80e-6 if asked[-1] else 0.0))
    n = VERIFY_EVIDENCE
    assert all(asked[:n]) and not any(asked[n:n + VERIFY_PROBE - 1]) and asked[n + VERIFY_PROBE - 1]
    gate = policy._gates[2]
    assert gate.verify_dynamic.n == n + 2 and gate.verify_dynamic.saved == 0.0 and gate.verify_fixed.n == 0


def test_the_prices_draft_pass_by_rows_is_the_cost_model_s_line() -> None:
    """keep_drafting's pass of k = 1..B rows: linear between the cost model's draft_time(1) and
    draft_time(B) (keep_kernel draws the line), the same numbers at B = 1 without asking the model again."""
    from specdepth.adaptive.cost_model import load_cost
    from specdepth.policies.dspark import _Prices
    cost = load_cost(Path(__file__).resolve().parents[2] / "experiments" / "profiles" / "cpu-bundled.json")
    for b, ctx in ((1, 0), (1, 300), (4, 300), (64, 9000)):
        view = cost.at_batch(b)
        one, all_ = float(view.draft_time(1, ctx)), float(view.draft_time(b, ctx))
        prices = _Prices(0, view, ctx, b, 8)
        assert (prices.pass_one, prices.draft_all) == (one, all_)


def test_the_draft_lag_dspark_tracks_is_the_runner_s() -> None:
    """dspark's count of the tokens each draft cache lacks (`_track_lag`, from the steps' outcomes
    alone) equals the runner's own, on a real pair: sequences join and leave, spells of `off`
    alternate with drafting, and verification is cut short at random."""
    from specdepth.policies.base import StepOutcome
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
        assert policy._lags_for(slots).tolist() == truth.tolist(), step
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
    from specdepth.policies.base import StepOutcome
    from specdepth.policies.dspark import CATCH_UP_STEPS
    # 4 sequences, a 20 ms step whatever its tokens, a draft pass of n rows 1 ms + 0.5 ms a row:
    # at 0.35 acceptance one position gains 17% (5.4 tokens in 23 ms against 4 in 20)
    cost = LinearCost(target_s=0.020, draft_s=0.001, draft_per_seq_s=0.0005)
    ids = np.arange(4)

    def plan_after_off(spell: int, prior: float, learns: bool = True) -> np.ndarray:
        policy = DSpark(probe=False)
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
    policy._lag_ids, policy._lag = ids, np.array([41, 41, 1, 1])
    ctx = make_plan_ctx(4, prior_conf=0.35, cost=cost)
    assert policy._catch_up_s(ctx, np.array([1, 1, 0, 0]) > 0, 0) / CATCH_UP_STEPS == pytest.approx(catch)
    assert policy._catch_up_s(ctx, np.array([0, 0, 2, 2]) > 0, 0) / CATCH_UP_STEPS == 0.0  # they drafted last step
    assert policy._catch_up_s(make_plan_ctx(4, seq_ids=[7, 8, 9, 10], cost=cost), np.ones(4, bool), 0) == 0.0


def test_a_try_of_every_sequence_waits_while_their_catch_up_costs_more_than_a_step() -> None:
    """With no newcomers, a due try drafts every sequence after PROBE_EVERY plans, unless their
    draft caches lag so far that catching them all up costs more than a step of `off` (a closed
    loop at batch 64 whose requests started together): then it waits on for newcomers. One
    sequence's catch-up is cheap: it is tried as before."""
    from specdepth.policies.base import StepOutcome
    from specdepth.policies.dspark import PROBE_EVERY
    dear = LinearCost(target_s=0.020, draft_s=0.030, draft_per_seq_s=1e-4)  # a row of catch-up: 0.1 ms

    def tried(b: int, newcomer_at: int = -1) -> list[int]:
        policy, out, ids = DSpark(), [], np.arange(b)
        for step in range(4 * PROBE_EVERY):
            if step == newcomer_at:
                ids = np.append(ids[1:], 100)
            budgets = policy.plan(replace(make_plan_ctx(b, step=step, seq_ids=ids, prior_conf=0.8, cost=dear),
                                          cost_learns=True))
            if budgets.any():
                out.append(step)
            z = np.zeros((b, 1))
            policy.observe(StepOutcome(step, ids, budgets, budgets, budgets, np.zeros(b, np.int64), z, z,
                                       0.02, 0.0, 0.02, np.full(b, 100)))
        return out

    assert tried(1) == [2 * PROBE_EVERY - 1]  # a lag of 32 on one row: ~3 ms, under a 20 ms step
    assert tried(8) == []  # on 8 rows: ~25 ms, over it
    assert tried(8, newcomer_at=3 * PROBE_EVERY) == [3 * PROBE_EVERY]  # the newcomer alone
