"""A model-free drafter's whole drafts: read off as the draft loop would have run them."""

from __future__ import annotations

import numpy as np
import pytest

from specdepth.workers.drafters.base import fixed_proposal, read_off
from specdepth.workers.drafting import draft_loop


@pytest.mark.parametrize("seed", range(40))
def test_read_off_is_the_draft_loop_without_keep_fn(seed):
    rng = np.random.default_rng(seed)
    B, K = int(rng.integers(1, 9)), int(rng.integers(0, 9))
    budgets = rng.integers(0, K + 1, B)
    n = np.minimum(rng.integers(0, K + 1, B), budgets) * (rng.random(B) < 0.8)  # some rows draft nothing
    feats = np.zeros((B, max(K, 1), 2))
    for r in range(B):
        feats[r, :n[r]] = rng.random((n[r], 2)) + 0.01

    def draft_pass(j, rows):
        return feats[rows, j, 0], feats[rows, j, 1], n[rows] > j

    want, got = draft_loop(budgets, draft_pass, None), read_off(budgets, feats, n)
    assert np.array_equal(got.drafted, want.drafted) and got.passes == want.passes
    assert np.array_equal(got.top1, want.top1) and np.array_equal(got.entropy, want.entropy)
    assert got.top1.shape == want.top1.shape == (B, int(budgets.max(initial=0)))
    assert got.keep_s == 0.0 and (got.first_pass_s > 0) == (want.first_pass_s > 0) == (want.passes > 0)


def test_fixed_proposal_asks_keep_fn_between_positions_when_given_one():
    budgets = np.array([3, 3])
    drafts = {0: ([5, 6, 7], [0.9, 0.8, 0.7], [0.1, 0.1, 0.1]), 1: ([8], [0.5], [1.0])}
    asked = []

    def keep(j, top1, ent, drafted):
        asked.append(j)
        return np.array([j < 2, True])

    p = fixed_proposal(drafts, budgets, keep)
    assert asked == [1, 2] and p.drafted.drafted.tolist() == [2, 1]
    q = fixed_proposal(drafts, budgets, None)  # none asked: every draft whole
    assert q.drafted.drafted.tolist() == [3, 1] and q.drafted.passes == 3
    assert q.tokens[0].tolist() == [5, 6, 7] and q.tokens[1, :1].tolist() == [8]
