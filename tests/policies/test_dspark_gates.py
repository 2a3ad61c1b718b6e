"""dspark's self-measurement (policies/dspark_gates.py): the ask, verify, probe and try gates, driven
through the policy as the controller drives it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from specdepth.policies.base import StepOutcome
from specdepth.policies.dspark import DSpark
from specdepth.policies.dspark_gates import (ASK_EVIDENCE, ASK_PROBE, ASK_PROBE_MAX, ASK_SPEND, PROBE_EVERY,
                                             PROBE_GAIN, PROBE_MAX, VERIFY_EVIDENCE, VERIFY_PROBE, Bucket,
                                             SelfMeasure, fixed_tokens)
from specdepth.policies.dspark_spell import SPELL_MAX
from specdepth.policies.testing import LinearCost, make_draft_ctx, make_plan_ctx

EVIDENCE = ASK_EVIDENCE  # asked steps before the measure may stop drafting past 1


def probe_gaps(loss: float, n: int) -> list[int]:
    """Steps after the first EVIDENCE at which a measure stopped on a steady `loss` asks anyway:
    spaced to spend ~ASK_SPEND of throughput, between ASK_PROBE and ASK_PROBE_MAX steps."""
    gap = int(np.clip(np.ceil(loss / ASK_SPEND), ASK_PROBE, ASK_PROBE_MAX))
    return [gap * (i + 1) - 1 for i in range(n)]


def _one_deep_step(policy: DSpark, step: int, keep_s: float, conf: float, second_accepted: bool = True,
                   learns: bool = True) -> list[int]:
    """Plan a 2-sequence step whose plan drafts 1 deep; if it asks, ask after pass 1 with these
    confidences; report the step as run (a second pass where keep_drafting went on, its positions
    accepted or not), with `keep_s` of asking. Returns the plan's budgets."""
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
    out = StepOutcome(0, np.arange(4), np.full(4, 8), np.array([3, 1, 2, 4]), np.array([3, 1, 2, 4]),
                      np.array([1, 1, 2, 4]), np.zeros((4, 4)), np.zeros((4, 4)), 0.0, 0.0, 0.0, np.full(4, 10))
    prior = np.full((4, 8), 0.5)
    fixed = np.array([2, 3, 2, 2])
    # row 0: rejected at 2 (1 token); row 1: stopped at 1, all accepted, 2 more at 0.5 (0.5 + 0.25);
    # row 2: 2 accepted as far as the budget; row 3: verified past the budget (2)
    assert fixed_tokens(out, fixed, prior) == pytest.approx(1 + 1.75 + 2 + 2)


def test_a_plan_that_gains_little_is_probed_now_and_then_where_the_cost_model_learns() -> None:
    """A plan now and then drafts nothing when drafting is predicted to gain under PROBE_GAIN, so
    a learning cost model sees the step the plan would not take: after PROBE_EVERY drafting plans,
    then ever more rarely (the spacing doubles up to PROBE_MAX), per batch-size bucket; never in a
    replay (the cost does not learn) and never where drafting is predicted to pay well."""
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


def test_a_try_waiting_on_a_dear_catch_up_leaves_the_plain_spells_unplanned() -> None:
    """A closed batch whose catch-up costs more than a step: once the due try has waited
    PROBE_EVERY plans for a newcomer and one more plan has found the catch-up too dear, the plain
    spells hold on unplanned (an unchanged batch has no newcomer, and its lag only grows); a plan
    comes only where a spell ends. Each plan there costs ~0.3 ms of host time at batch 64."""
    dear = LinearCost(target_s=0.020, draft_s=0.030, draft_per_seq_s=1e-4)
    b, ids, planned = 8, np.arange(8), []
    policy = DSpark()
    for step in range(8 * PROBE_EVERY):
        skipped = policy._spell.skipped
        budgets = policy.plan(replace(make_plan_ctx(b, step=step, seq_ids=ids, prior_conf=0.8, cost=dear),
                                      cost_learns=True))
        assert not budgets.any()
        if policy._spell.skipped == skipped:
            planned.append(step)
        z = np.zeros((b, 1))
        policy.observe(StepOutcome(step, ids, budgets, budgets, budgets, np.zeros(b, np.int64), z, z,
                                   0.02, 0.0, 0.02, np.full(b, 100)))
    gap = SPELL_MAX + 1  # a spell of SPELL_MAX plain steps, then its plan
    assert planned == [0, 2, 5, 10, 15, 2 * PROBE_EVERY - 1] + list(range(2 * PROBE_EVERY - 1 + gap, 8 * PROBE_EVERY, gap))


class FreeLinearCost(LinearCost):
    """`LinearCost` as a model-free drafter's cost model prices it (`FreeDraftCost`): no draft pass."""

    def draft_time(self, batch_size: int, context_tokens: int = 0) -> float:
        return 0.0

    def drafting_s(self, batch_size: int) -> float:
        return 0.0


def test_a_model_free_drafters_try_is_tried_again_while_it_beats_the_plans_rates() -> None:
    """A model-free drafter has no draft cache to catch up: a due try drafts every sequence at once
    (no wait for newcomers). Where its first position is accepted well above the plan's rate (the
    rates stop moving while nothing is drafted, and a fresh text repeats little at first), the
    next plan of nothing tries again; an unsurprising try backs the spacing off as before."""
    cost = FreeLinearCost(target_s=0.020, target_per_token_s=0.020)  # a verified token costs a step: nothing pays
    ids, P = np.arange(4), PROBE_EVERY

    def run(accepted_at) -> list[int]:
        policy, tried = DSpark(), []
        for step in range(P + 12):
            b = policy.plan(replace(make_plan_ctx(4, step=step, seq_ids=ids, prior_conf=0.3, cost=cost),
                                    cost_learns=True))
            if b.any():
                assert b.tolist() == [1, 1, 1, 1] and not policy.verifies(step)  # verified as drafted
                tried.append(step)
            a = np.asarray(accepted_at(step), np.int64) * b
            top1 = np.full((4, int(b.max())), 0.5)
            policy.observe(StepOutcome(step, ids, b, b, b, a, top1, top1, 0.02, 0.0, 0.02, np.full(4, 100)))
        return tried

    # accepted at the plan's rate: the next try PROBE_EVERY plans after the first, as before
    assert run(lambda step: [1, 0, 0, 0]) == [P - 1]
    # all four accepted where the plan said 0.3 (> 0.3 + 2 x 0.23): the next plan of nothing tries
    # again, while the tries surprise; then the spacing doubles from there (2, 4)
    assert run(lambda step: [1, 1, 1, 1] if step <= P else [1, 0, 0, 0]) == [P - 1, P, P + 1, P + 3, P + 7]
    assert run(lambda step: [1, 1, 1, 1]) == list(range(P - 1, P + 12))
    # a try whose step lost a sequence before it ran (cancelled after the plan) is not weighed
    two = np.ones(2, np.int64)
    gone = StepOutcome(0, ids[:2], two, two, two, two, np.full((2, 1), 0.5), np.full((2, 1), 0.5), 0.02, 0.0,
                       0.02, np.full(2, 100))
    assert not SelfMeasure.try_surprised(gone, np.ones(4, bool), np.full(4, 0.3))


def test_a_model_free_draft_is_drafted_to_its_budgets_without_the_ask_gate() -> None:
    """A model-free draft has no pass to stop after (the engine never asks `keep_drafting` of it):
    a drafting plan is a fixed step, verified by the fixed steps' verify measure, and the ask
    gate's measure is left untouched. The same plan with a drafter that runs passes is dynamic."""
    prior = np.array([[0.9, 0.8] + [0.7] * 6] * 2)
    for cost, free in ((FreeLinearCost(0.010, 0.0005, 1e-4), True), (LinearCost(0.010, 1e-4, 1e-4), False)):
        policy = DSpark()
        for step in range(VERIFY_EVIDENCE + 2):
            b = policy.plan(replace(make_plan_ctx(2, prior_conf=prior, cost=cost, step=step), cost_learns=True))
            assert b.tolist() == [8, 8] and policy.drafts_dynamically(step) is not free
            d = np.full(2, 8, np.int64)
            t = float(cost.target_time(2 + d.sum()))
            top1 = np.full((2, 8), 0.9)
            policy.observe(StepOutcome(step, np.arange(2), b, d, d, d, top1, top1, t, 0.0, t, np.full(2, 100),
                                       np.zeros(0, np.int64), 0.0, 0.0, 1e-4))
        bucket = policy._measure.buckets[2]
        asked, other = (bucket.verify_fixed, bucket.verify_dynamic) if free else (bucket.verify_dynamic,
                                                                                   bucket.verify_fixed)
        assert asked.n == VERIFY_EVIDENCE + 2 and other.n == 0
        assert bucket.ask_n == (0 if free else VERIFY_EVIDENCE + 2)


def test_the_measure_stops_on_a_steady_loss_not_on_heavy_tailed_gains() -> None:
    """Going on past the first position gains in rare long streaks and loses a little on most
    steps (the bundled pair at batch 1). A steady 7% loss stops it after ASK_EVIDENCE asked steps,
    and then one step in 24 asks (the loss spacing); the same losses with one step in 25 gaining
    2.9x (+3.7% overall, though the running measure dips below zero between them) keep most steps
    asking: while the measure is negative but within its noise, steps ask one in 1 / P(a gain)."""
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
    spacing = SelfMeasure.ask_spacing
    assert spacing(Bucket(ask_gain=-0.02, ask_se=0.02)) == pytest.approx(1 / 0.158655, rel=1e-4)  # P = Phi(-1)
    assert spacing(Bucket(ask_gain=-0.001, ask_se=0.05)) == pytest.approx(2.0, rel=0.05)  # a coin flip
    assert spacing(Bucket(ask_gain=-0.02, ask_se=0.005)) == ASK_PROBE  # clear of the noise: the loss spacing
    assert spacing(Bucket(ask_gain=-0.12, ask_se=0.0)) == pytest.approx(0.12 / ASK_SPEND)
    assert spacing(Bucket(ask_gain=-0.5, ask_se=0.01)) == ASK_PROBE_MAX


def test_verify_is_skipped_on_one_deep_steps_while_asking_costs_more_than_it_saves() -> None:
    """On steps drafting one position, `verify` is asked while the target time it saves (priced
    by the cost model) has been worth the controller's time asking it (measured); else every
    drafted token is verified, and one step in VERIFY_PROBE asks anyway. Never skipped where the
    cost model is not learned (a replay: no time is measured)."""
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
    bucket = policy._measure.buckets[2]
    assert bucket.verify_dynamic.n == n + 2 and bucket.verify_dynamic.saved == 0.0 and bucket.verify_fixed.n == 0


def test_a_try_of_every_sequence_waits_while_their_catch_up_costs_more_than_a_step() -> None:
    """With no newcomers, a due try drafts every sequence after PROBE_EVERY plans, unless their
    draft caches lag so far that catching them all up costs more than a step of `off` (a closed
    loop at batch 64 whose requests started together): then it waits on for newcomers. One
    sequence's catch-up is cheap: it is tried as before."""
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
