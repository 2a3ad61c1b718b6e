"""The hybrid drafter: per-row choice between the model-free draft and the draft model's."""

from __future__ import annotations

import numpy as np
import pytest

from specdepth.adaptive.controller import Controller
from specdepth.adaptive.engine import Engine, Request
from specdepth.policies.arctic import ArcticHybrid
from specdepth.policies.base import ChooseContext
from specdepth.policies.dspark_choose import best_theta, choose_free
from specdepth.policies.registry import make_policy
from specdepth.workers.runner import PairRunner
from tests.adaptive.test_controller import RandomPolicy, bundled  # noqa: F401 (bundled: a fixture)
from tests.pairs import tiny_pair
from tests.workers.test_lossless_greedy import reference_greedy


class RandomChooser(RandomPolicy):
    """RandomPolicy, and a random drafter per row each step (seeded, explicit state)."""

    def choose_drafter(self, ctx):
        self.choices = getattr(self, "choices", 0) + 1
        return self.rng.random(len(ctx.seq_ids)) < 0.5


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(noise=0.15, seed=5)


def repeating_requests(n: int, seed: int) -> list[Request]:
    """Prompts that repeat themselves, so the suffix drafter drafts."""
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(n):
        motif = rng.integers(0, 96, int(rng.integers(2, 6))).tolist()
        reqs.append(Request(f"r{i}", (motif * 4)[: int(rng.integers(4, 20))], int(rng.integers(4, 24))))
    return reqs


def test_random_choices_stay_greedy_lossless_and_teach_each_drafter_its_own_model(pair):
    reqs = repeating_requests(24, 0)
    policy = RandomChooser(2)
    ctl = Controller(policy, max_depth=6)
    runner = PairRunner(pair[0], pair[1], n_slots=5, max_depth=6, drafter="hybrid")
    free_rows, model_rows, mixed = 0, 0, 0
    step = runner.step

    def counted(*a, **k):
        nonlocal free_rows, model_rows, mixed
        res = step(*a, **k)
        kept = res.free & (res.drafted > 0)
        free_rows += int(kept.sum())
        model_rows += int((~res.free & (res.drafted > 0)).sum())
        mixed += bool(kept.any() and (~res.free & (res.drafted > 0)).any())
        return res
    runner.step = counted
    outs = Engine(runner, ctl).run(reqs)
    for req, out in zip(reqs, outs):
        assert out.error is None
        assert out.output_ids == reference_greedy(pair[0], req.prompt_ids, req.max_new_tokens), req.request_id
    assert policy.choices > 0 and free_rows > 0 and model_rows > 0 and mixed > 0
    assert not ctl.fallbacks, ctl.fallbacks
    # each drafter's rows went to its own acceptance model: both have counted observations
    assert ctl.acceptance_free.state_counts.sum() > 0 and ctl.acceptance.state_counts.sum() > 0


def test_rows_that_keep_the_free_draft_cost_no_draft_pass(pair):
    runner = PairRunner(pair[0], pair[1], n_slots=2, max_depth=4, drafter="hybrid")
    seq = [5, 6, 7, 5, 6, 7, 5, 6]
    slots = np.array(runner.add_many([seq, seq]))
    budgets = np.array([4, 4])
    res = runner.step(slots, budgets, choose_fn=lambda t, e, d: np.ones(2, bool))
    assert res.draft_passes == 0 and res.free.all() and (res.drafted > 0).all()
    res = runner.step(slots, budgets, choose_fn=lambda t, e, d: np.array([True, False]))
    assert res.draft_passes > 0 and res.drafted[1] == 4  # the model drafts the other row to its budget
    res = runner.step(slots, budgets, choose_fn=lambda t, e, d: np.zeros(2, bool), caps=np.array([1, 1]))
    assert (res.drafted == 4).all() and not res.free.any()


class PlainEveryOther(RandomChooser):
    """Every other step plain: budgets 0 and no free draft proposed (`proposes_free`)."""

    def plan(self, ctx):
        return np.zeros(ctx.batch_size, np.int64) if ctx.step % 2 else super().plan(ctx)

    def proposes_free(self, step):
        return step % 2 == 0


def test_a_step_without_free_proposals_drafts_nothing(pair):
    """`proposes_free` False: the hybrid proposes no model-free draft, so the step is plain (no
    draft, no choice asked); the other steps draft both ways, and greedy output stays the target's."""
    reqs = repeating_requests(12, 1)
    policy = PlainEveryOther(2)
    ctl = Controller(policy, max_depth=6)
    runner = PairRunner(pair[0], pair[1], n_slots=4, max_depth=6, drafter="hybrid")
    drafted_by_parity = [0, 0]
    step, eng = runner.step, None

    def counted(*a, **k):
        res = step(*a, **k)
        drafted_by_parity[eng.step_no % 2] += int(res.drafted.sum())
        return res
    runner.step = counted
    eng = Engine(runner, ctl)
    outs = eng.run(reqs)
    for req, out in zip(reqs, outs):
        assert out.output_ids == reference_greedy(pair[0], req.prompt_ids, req.max_new_tokens), req.request_id
    assert drafted_by_parity[1] == 0 and drafted_by_parity[0] > 0, drafted_by_parity
    assert not ctl.fallbacks, ctl.fallbacks


def choose_ctx(top1: np.ndarray, budgets=None) -> ChooseContext:
    B = len(top1)
    return ChooseContext(0, np.arange(B), np.full(B, 10), np.full(B, 3) if budgets is None else budgets,
                         (top1 > 0).sum(1), top1.copy(), top1, None)


def test_arctic_hybrid_keeps_the_suffix_draft_when_its_score_reaches_k():
    top1 = np.array([[1.0, 1.0, 1.0, 0.0],  # score 3: kept at k=3
                     [0.9, 0.9, 0.9, 0.9],  # 0.9 + 0.81 + 0.73 + 0.66 = 3.10: kept
                     [0.5, 0.5, 0.5, 0.5],  # 0.94: the model
                     [0.0, 0.0, 0.0, 0.0]])  # nothing drafted: the model
    assert ArcticHybrid(3).choose_drafter(choose_ctx(top1)).tolist() == [True, True, False, False]
    assert ArcticHybrid(1).choose_drafter(choose_ctx(top1)).tolist() == [True, True, False, False]


def test_dspark_switches_to_the_model_only_where_it_pays_for_its_passes():
    times = 1.0 + 0.01 * np.arange(64)  # a flat target: verifying more costs little
    free = np.array([[0.9, 0.8, 0.0], [0.0, 0.0, 0.0]])  # row 1: no free draft
    prior = np.full((2, 4), 0.9)
    budgets = np.array([4, 4])
    assert choose_free(free, prior, budgets, times, 0.01).tolist() == [False, False]  # cheap passes: row 1 (and 0) switch
    assert choose_free(free, prior, budgets, times, 1.0).tolist() == [True, True]  # dear passes: keep the free drafts
    assert choose_free(free, prior, np.array([0, 0]), times, 0.01).all()  # no model budget: nothing to switch to
    assert np.isclose(best_theta(np.array([0.5, 0.0]), 2, np.array([1.0, 2.0, 3.0]), 0.0), 2.0)


@pytest.mark.parametrize("spec", ["dspark", "arctic-hybrid", "static:k=3"])
def test_hybrid_on_the_bundled_pair_is_lossless_and_drafts(bundled, spec):
    pair, reqs, ref = bundled
    ctl = Controller(make_policy(spec), max_depth=8)
    eng = Engine(PairRunner(pair.target, pair.draft, n_slots=4, max_depth=8, drafter="hybrid"), ctl)
    assert [o.output_ids for o in eng.run(reqs)] == ref
    assert not ctl.fallbacks and eng.stats.pos_verified.sum() > 0
