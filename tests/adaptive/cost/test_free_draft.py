"""FreeDraftCost: the target priced as the wrapped model does, every draft pass free, and the
wrapped model's learning kept to the target's evidence; the engine applies it for a model-free
drafter."""

from __future__ import annotations

import copy

import numpy as np

from specdepth.adaptive.controller import Controller
from specdepth.adaptive.cost.base import CostModel
from specdepth.adaptive.cost.free_draft import FreeDraftCost
from specdepth.adaptive.cost.model import FixedCost
from specdepth.adaptive.engine import Engine, Request
from specdepth.policies.registry import make_policy
from specdepth.workers.runner import PairRunner
from tests.adaptive.cost.test_model import make_profiled
from tests.pairs import tiny_pair


def test_prices_the_target_as_the_inner_model_and_drafting_free():
    inner = make_profiled()
    free = FreeDraftCost(inner)
    n = np.arange(1, 200)
    assert np.array_equal(free.target_time(n, 1000), inner.target_time(n, 1000))
    assert np.array_equal(free.target_by_n(40, 500, 8), inner.target_by_n(40, 500, 8))
    assert free.draft_time(8, 1000) == 0.0 and free.step_prices(10, 0, 4)[1] == 0.0
    assert free.pass_overhead_s == 0.0 and free.learns == inner.learns
    assert FreeDraftCost(free).inner is inner  # never wrapped twice


def test_round_trips_through_json_and_copies():
    free = FreeDraftCost(FixedCost(target_ms=7, draft_ms=2))
    back = CostModel.from_json(free.to_json())
    assert isinstance(back, FreeDraftCost) and back.target_time(5) == free.target_time(5) == 7e-3
    assert copy.deepcopy(free).draft_time(3) == 0.0


def test_learning_sees_no_draft_passes():
    inner, ref = make_profiled(), make_profiled()
    free = FreeDraftCost(inner)
    for _ in range(20):
        free.observe(12, 1000, 0.02, 4, 3, 1e-5, 0.001, 3, batch_size=4)
        ref.observe(12, 1000, 0.02, 4, 0, 0.0, 0.001, 0, batch_size=4)
    assert inner.to_dict() == ref.to_dict()  # as if the steps had drafted with no model pass


def test_engine_prices_a_model_free_drafter_free():
    target, draft = tiny_pair(noise=0.15)
    reqs = [Request(f"r{i}", [5, 6, 7, 5, 6, 7, 5, 6][: 3 + i], 24) for i in range(4)]
    ctl = {}
    for drafter in ("model", "ngram"):
        ctl[drafter] = Controller(make_policy("dspark"), 8, cost=FixedCost(target_ms=1, draft_ms=0.9))
        Engine(PairRunner(target, draft, n_slots=4, max_depth=8, drafter=drafter), ctl[drafter]).run(reqs)
    assert not isinstance(ctl["model"].cost, FreeDraftCost)
    assert isinstance(ctl["ngram"].cost, FreeDraftCost) and ctl["ngram"].cost.draft_time(4) == 0.0
    ctl["ngram"].cost = FixedCost(target_ms=2, draft_ms=1)  # a cost set later (a replica's set_cost) stays free
    assert ctl["ngram"].cost.draft_time(4) == 0.0 and ctl["ngram"].cost.target_time(3) == 2e-3


def test_proposing_is_priced_per_row_as_measured_on_the_steps_that_drafted():
    free = FreeDraftCost(make_profiled())
    view = free.at_batch(8)
    assert free.drafting_s(64) == 0.0  # nothing measured yet
    free.observe(8, 800, 0.02, 8, 0, 0.0, batch_size=8)  # a plain step teaches nothing
    assert free.drafting_s(64) == 0.0
    for _ in range(30):
        free.observe(40, 800, 0.02, 8, 4, 8 * 20e-6, batch_size=8)  # 20 us a row
    assert abs(free.drafting_s(64) - 64 * 20e-6) < 1e-12
    assert view.drafting_s(8) == free.drafting_s(8)  # a batch view shares what was learned
    frozen = FreeDraftCost(FixedCost(target_ms=7, draft_ms=2))  # a model that does not learn (a replay's)
    frozen.observe(40, 800, 0.02, 8, 4, 1.0, batch_size=8)
    assert frozen.drafting_s(8) == 0.0
