"""Bad input fails only the request that brought it, with an error naming it; the other requests
in the batch finish with exactly the output they get when running alone."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from specdepth.adaptive.engine import Engine, Request, RequestError
from tests.pairs import tiny_pair
from specdepth.workers.runner import PairRunner

GOOD = [Request("a", [1, 2, 3], 12), Request("b", [7, 8], 9), Request("c", [5, 6, 7, 8, 9], 15)]


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(noise=0.15, max_seq_len=64)


def run(pair, reqs, depth_fn=None):
    target, draft = pair
    eng = Engine(PairRunner(target, draft, n_slots=4, max_depth=8),
                 depth_fn or (lambda ids, lens: np.full(len(ids), 3)))
    return {o.request_id: o for o in eng.run(reqs)}


@pytest.fixture(scope="module")
def clean(pair):
    return run(pair, GOOD)


def check(outs, clean, bad_id: str, words: str):
    err = outs[bad_id].error
    assert isinstance(err, RequestError) and bad_id in str(err) and words in str(err), err
    assert outs[bad_id].finish_reason == "error"
    for r in GOOD:
        assert outs[r.request_id].error is None
        assert outs[r.request_id].output_ids == clean[r.request_id].output_ids


@pytest.mark.parametrize("bad, words", [
    (Request("empty", [], 5), "empty prompt"),
    (Request("long", list(range(1, 80)), 5), "does not fit the context"),
    (Request("oob", [1, 96, 3], 5), "out of range"),
    (Request("neg", [1, -1], 5), "out of range"),
    (Request("zero", [1, 2], 0), "max_new_tokens must be > 0"),
    (Request("negmax", [1, 2], -3), "max_new_tokens must be > 0"),
])
def test_invalid_request_is_rejected_others_unaffected(pair, clean, bad, words):
    check(run(pair, GOOD[:2] + [bad] + GOOD[2:]), clean, bad.request_id, words)


def test_submit_raises_naming_the_request(pair):
    target, draft = pair
    eng = Engine(PairRunner(target, draft, n_slots=2, max_depth=4), lambda ids, lens: np.zeros(len(ids)))
    with pytest.raises(RequestError, match="request 'x': empty prompt"):
        eng.submit(Request("x", [], 3))


@pytest.mark.parametrize("bad_depth", [-1, 9, np.nan, 2.5])
def test_invalid_depth_fails_only_that_request(pair, clean, bad_depth):
    reqs = GOOD + [Request("d", [4, 4, 4], 10)]

    def depth_fn(ids, lens):  # the 4th request (sequence id 3) gets a depth outside [0, 8]
        return np.where(ids == 3, bad_depth, 3).astype(float)
    check(run(pair, reqs, depth_fn), clean, "d", "outside [0, 8]")


def test_nan_logits_fail_only_that_request(pair, clean):
    target, draft = pair
    poisoned = copy.deepcopy(target)
    with torch.no_grad():
        poisoned.embed.weight[42] = float("nan")  # any sequence holding token 42 gets NaN logits
    outs = run((poisoned, draft), GOOD[:1] + [Request("nan", [3, 42, 5], 6)] + GOOD[1:])
    check(outs, clean, "nan", "NaN/inf")


def test_warm_up_leaves_the_engine_as_it_was():
    """A throwaway request through a copy of the controller: same outputs, statistics and learned
    state afterwards as an engine that never warmed up."""
    from specdepth.adaptive.controller import Controller
    from specdepth.adaptive.cost.model import FixedCost
    from specdepth.policies.registry import make_policy
    from specdepth.workers.runner import PairRunner
    from tests.pairs import tiny_pair

    target, draft = tiny_pair(noise=0.15)
    reqs = [Request("a", [1, 2, 3, 1, 2, 3], 12), Request("b", [7, 8, 7, 8], 12)]
    runs = []
    for warm in (False, True):
        ctl = Controller(make_policy("dspark"), 6, cost=FixedCost(target_ms=3, draft_ms=0.5), learn_cost=False)
        eng = Engine(PairRunner(target, draft, n_slots=2, max_depth=6, drafter="ngram"), ctl)
        if warm:
            eng.warm_up([1, 2, 3, 1, 2])
            assert eng.stats.steps == 0 and eng.step_no == 0 and not eng.runner.seqs
        outs = eng.run([Request(r.request_id, r.prompt_ids, r.max_new_tokens) for r in reqs])
        runs.append(([o.output_ids for o in outs], [o.accepted for o in outs], eng.stats.steps,
                     ctl.acceptance.cells.sum()))
    assert runs[0] == runs[1]
