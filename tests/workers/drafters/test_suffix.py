"""The suffix drafter, by hand: the walk, its stopping rules, the global index, the choice."""

from __future__ import annotations

import numpy as np
import pytest

from specdepth.workers.drafters.suffix import SEP, SuffixDrafter, _Index, walk


def propose(d: SuffixDrafter, seq: list[int], budget: int, slot: int = 0):
    p = d.propose({slot: seq}, np.array([slot]), np.array([budget]), None)
    n = int(p.drafted.drafted[0])
    return p.tokens[0, :n].tolist(), p.drafted.top1[0, :n], p.drafted.entropy[0, :n]


def drafter(seq: list[int], **kw) -> SuffixDrafter:
    d = SuffixDrafter(**kw)
    d.add([0], [seq])
    return d


def test_walks_what_followed_the_longest_suffix():
    seq = [9, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3]  # "1 2 3" occurred, then 4 5 6 7
    toks, top1, ent = propose(drafter(seq), seq, 8)
    assert toks == [4, 5, 6]  # spec_factor 1: at most the matched length (3)
    assert np.allclose(top1, 0.5) and np.allclose(ent, 1 / 3)  # one occurrence: 1 / (1 + 1)
    assert propose(drafter(seq, spec_factor=2.0), seq, 8)[0] == [4, 5, 6, 7, 0, 1]
    assert propose(drafter(seq, spec_factor=2.0), seq, 2)[0] == [4, 5]  # the budget caps it


def test_stops_where_the_estimated_probability_falls_below_the_floor():
    # after "7": 1 three times (p = 1), then 2, 5 or 8 once each: 8, the latest, p = 1/3, and
    # the one occurrence left goes on at p = 1/3 (of the draft as a whole)
    seq = [7, 1, 2, 3, 7, 1, 5, 6, 7, 1, 8, 9, 7]
    idx = _Index()
    idx.extend(seq, (1, 2, 3))
    d = walk(idx, seq, (1, 2, 3), 8, 0.3, 3.0)
    assert d.tokens == [1, 8, 9] and d.match == 1
    assert np.isclose(d.score, 1 + 2 / 3)
    assert walk(idx, seq, (1, 2, 3), 8, 0.5, 3.0).tokens == [1]


def test_outputs_of_finished_sequences_draft_for_new_ones():
    d = drafter([1, 2], spec_factor=4.0)
    seq = [1, 2, 10, 11, 12, 13, 14]  # slot 0's prompt [1, 2], output 10..14
    propose(d, seq, 1)  # indexes the output
    d.remove(0)
    d.add([0], [[5, 10, 11]])  # another request whose prompt ends like that output began
    assert propose(d, [5, 10, 11], 3)[0] == [12, 13, 14]
    d2 = drafter([1, 2], max_cached=0)  # no global index: nothing to draft from
    propose(d2, seq, 1)
    d2.remove(0)
    d2.add([0], [[5, 10, 11]])
    assert propose(d2, [5, 10, 11], 3)[0] == []


def test_the_global_index_keeps_the_newest_outputs_within_its_bound():
    d = SuffixDrafter(max_cached=24)
    sizes = []
    for i in range(9):
        out = [100 + i] * 4 + [200 + i]  # 6 tokens with the separator
        d.add([0], [[1]])
        propose(d, [1] + out, 1)
        d.remove(0)
        sizes.append(len(d.index().toks))
        assert len(d.glob.toks) == sum(len(o) + 1 for o in d.outputs) <= 24
    assert d.outputs[-1] == [108] * 4 + [208]
    # past the bound it keeps half and grows again: a rebuild every few outputs, not every one
    assert sizes == [6, 12, 18, 24, 12, 18, 24, 12, 18]


@pytest.mark.parametrize("seed", range(10))
def test_the_global_index_holds_every_pattern_within_each_document(seed):
    """Each token after a document's first is found under every pattern of an indexed length that
    ends right before it inside its document, in position order; nothing crosses a separator."""
    rng = np.random.default_rng(seed)
    lengths = (1, 2, 3, 4, 6, 8)
    idx, want, toks = _Index(), {}, []
    for _ in range(int(rng.integers(1, 5))):
        doc = rng.integers(0, 4, int(rng.integers(0, 30))).tolist()
        idx.extend(doc, lengths)
        base = len(toks)
        toks += doc + [SEP]
        for i in range(1, len(doc)):
            for n in lengths:
                if n <= i:
                    want.setdefault(tuple(doc[i - n:i]), []).append(base + i)
    assert idx.toks == toks and idx.where == want


def test_finished_outputs_are_indexed_at_the_next_draft_only():
    """A run that stops drafting stops paying for the global index; the next draft finds every
    earlier output, as if each had been indexed when it finished."""
    d = drafter([1, 2], spec_factor=4.0)
    propose(d, [1, 2, 10, 11, 12, 13, 14], 1)
    d.remove(0)
    d.add([0], [[7]])
    assert propose(d, [7, 8], 0)[0] == [] and d.glob.toks == []  # no row drafts: nothing indexed
    d.remove(0)
    d.add([0], [[5, 10, 11]])
    assert propose(d, [5, 10, 11], 3)[0] == [12, 13, 14]
    assert d.glob.toks == [10, 11, 12, 13, 14, -1]


def test_the_higher_scoring_index_wins():
    d = drafter([3, 4], spec_factor=4.0)
    for out in ([50, 7, 8, 9, 9], [50, 7, 8, 9, 9]):  # two earlier outputs agree: score 2 x ...
        d.add([1], [[0]])
        propose(d, [0] + out, 1, slot=1)
        d.remove(1)
    seq = [50, 7, 6, 1, 50, 7, 2, 3, 50, 7]  # its own history: 6 or 2 (p = 1/2); the global index: 8 (p = 1)
    d.add([2], [seq])
    assert propose(d, seq, 2, slot=2)[0] == [8, 9]


@pytest.mark.parametrize("kw", [dict(max_depth=0), dict(min_prob=1.0), dict(spec_factor=0), dict(max_cached=-1)])
def test_bad_settings_are_refused(kw):
    with pytest.raises(ValueError, match="max_depth"):
        SuffixDrafter(**kw)


def test_a_long_plain_spell_costs_nothing_and_loses_nothing():
    """A sequence's own text is scanned when it drafts: nothing is kept before its first
    proposal, and after a spell without drafting every earlier pattern is found, as if it had
    drafted all along."""
    prompt = [1, 2, 3]
    filler = list(range(100, 200))
    seq = prompt + [40, 41, 42, 43, 44] + filler + [60, 61, 62, 63, 64] + filler[:2]
    d = drafter(prompt)
    assert d.local[0].n == 0  # nothing kept before its first proposal
    assert propose(d, seq + [40, 41], 4)[0] == [42, 43]  # an old pattern, from before the spell
    assert d.local[0].buf[:d.local[0].n].tolist() == seq + [40, 41]
    d = drafter(prompt)
    d.propose({0: seq[:20]}, np.array([0]), np.array([4]), None)  # drafting all along: the same
    assert propose(d, seq + [40, 41], 4)[0] == [42, 43]
    assert propose(d, seq + [40, 41, 42, 43, 44, 60, 61], 4)[0] == [62, 63]
