"""The n-gram drafter, by hand: what it proposes, its features, budgets and the step's contract."""

from __future__ import annotations

import numpy as np
import pytest

from specdepth.workers.drafters.ngram import NgramDrafter


def propose(seq: list[int], budget: int, **kw):
    d = NgramDrafter(**kw)
    d.add([0], [seq])
    p = d.propose({0: seq}, np.array([0]), np.array([budget]), None)
    n = int(p.drafted.drafted[0])
    return p.tokens[0, :n].tolist(), p.drafted.top1[0, :n], p.drafted.entropy[0, :n]


def test_copies_what_followed_the_longest_matching_suffix():
    # "5 6" occurred, followed by 7 8 9: the suffix "5 6" proposes 7, then "5 6 7" 8, ...
    toks, top1, ent = propose([1, 5, 6, 7, 8, 9, 2, 5, 6], 3)
    assert toks == [7, 8, 9]
    assert np.allclose(top1, 0.5)  # one occurrence of one continuation: 1 / (1 + 1)
    assert np.allclose(ent, [1 / 2, 1 / 3, 1 / 4])  # 1 / matched suffix length


def test_longest_match_beats_a_more_frequent_shorter_one():
    # after "3": 4 twice, 9 once; after "2 3": 9 -> the longer context wins
    toks, _, ent = propose([3, 4, 3, 4, 2, 3, 9, 0, 2, 3], 1, ngram_max=2)
    assert toks == [9] and ent[0] == 0.5


def test_most_frequent_continuation_then_latest_on_a_tie():
    toks, top1, _ = propose([7, 1, 7, 1, 7, 2, 7], 1, ngram_max=1)
    assert toks == [1] and np.isclose(top1[0], 2 / 4)  # 1 twice, 2 once, 3 occurrences + 1
    toks, _, _ = propose([7, 1, 7, 2, 7], 1, ngram_max=1)
    assert toks == [2]  # 1 and 2 once each: the latest


def test_no_match_drafts_nothing_and_budgets_are_kept():
    assert propose([1, 2, 3, 4], 4)[0] == []  # no token repeats
    assert propose([1, 2, 1, 2, 1], 0)[0] == []
    assert propose([1, 2, 1, 2, 1], 2)[0] == [2, 1]
    assert propose([1, 2, 3, 1], 8, ngram_min=2)[0] == []  # only a 1-token suffix matches


def test_index_follows_committed_tokens_and_slots_are_independent():
    d = NgramDrafter(ngram_max=2)
    seqs = {0: [1, 2, 3], 1: [4, 4, 4]}
    d.add([0, 1], [seqs[0], seqs[1]])
    assert all(idx.seen == 0 for idx in d.index.values())  # indexed at the first proposal, not before
    p = d.propose(seqs, np.array([0, 1]), np.array([2, 2]), None)
    assert p.drafted.drafted.tolist() == [0, 2] and p.tokens[1, :2].tolist() == [4, 4]
    seqs[0] += [1, 2, 3, 1]  # committed by steps: indexed at the next proposal
    p = d.propose(seqs, np.array([0, 1]), np.array([2, 2]), None)
    assert p.drafted.drafted.tolist() == [2, 2] and p.tokens[0, :2].tolist() == [2, 3]
    d.remove(0)
    d.add([0], [[9, 9]])  # a new sequence in the slot starts from its own tokens
    seqs[0] = [9, 9]
    p = d.propose(seqs, np.array([0]), np.array([3]), None)
    assert p.tokens[0, :3].tolist() == [9, 9, 9]


def test_keep_fn_stops_rows_and_sees_the_features():
    d = NgramDrafter()
    seq = [1, 2, 3, 1, 2, 3, 1, 2]
    d.add([0], [seq])
    seen = []

    def keep(j, top1, ent, drafted):
        seen.append(top1.shape)
        return np.array([j < 2])

    p = d.propose({0: seq}, np.array([0]), np.array([6]), keep)
    assert p.drafted.drafted.tolist() == [2] and seen == [(1, 1), (1, 2)]


@pytest.mark.parametrize("lo,hi", [(0, 3), (3, 2)])
def test_bad_n_range_is_refused(lo, hi):
    with pytest.raises(ValueError, match="ngram_min"):
        NgramDrafter(ngram_min=lo, ngram_max=hi)
