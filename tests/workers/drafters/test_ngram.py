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
    assert all(t.n == 0 for t in d.tokens.values())  # read at the first proposal, not before
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


def reference_draft(seq: list[int], budget: int, n_min: int, n_max: int) -> list[tuple[int, float, float]]:
    """The rule as an index of seq's n-grams: n-gram -> {next token: count} in order of first
    occurrence, and its latest next token; a strictly higher count than the latest's wins."""
    counts: dict[tuple[int, ...], dict[int, int]] = {}
    latest: dict[tuple[int, ...], int] = {}
    for t in range(1, len(seq)):
        for n in range(n_min, min(n_max, t) + 1):
            key = tuple(seq[t - n:t])
            c = counts.setdefault(key, {})
            c[seq[t]] = c.get(seq[t], 0) + 1
            latest[key] = seq[t]
    ctx, out = seq[-n_max:], []
    for _ in range(budget):
        for n in range(min(n_max, len(ctx)), n_min - 1, -1):
            key = tuple(ctx[len(ctx) - n:])
            if key in counts:
                c = counts[key]
                tok, best = latest[key], c[latest[key]]
                for cand, cnt in c.items():
                    if cnt > best:
                        tok, best = cand, cnt
                out.append((tok, best / (sum(c.values()) + 1.0), 1.0 / n))
                break
        else:
            return out
        ctx = (ctx + [out[-1][0]])[-n_max:]
    return out


@pytest.mark.parametrize("seed", range(4))
def test_the_scan_equals_the_indexed_rule_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    drafted = 0
    for _ in range(200):
        vocab = int(rng.integers(2, 10))
        seq = rng.integers(0, vocab, int(rng.integers(1, 150))).tolist()
        lo = int(rng.integers(1, 4))
        hi = lo + int(rng.integers(0, 4))
        budget = int(rng.integers(1, 9))
        want = reference_draft(seq, budget, lo, hi)
        toks, top1, ent = propose(seq, budget, ngram_min=lo, ngram_max=hi)
        assert toks == [w[0] for w in want]
        assert top1.tolist() == [w[1] for w in want] and ent.tolist() == [w[2] for w in want]  # exact
        drafted += len(want)
    assert drafted > 300  # the comparison saw drafts, not only misses
