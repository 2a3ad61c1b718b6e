"""The compiled scan of a sequence's own text answers as the suffix walk on an index of it."""

from __future__ import annotations

import numpy as np
import pytest

from specdepth.workers.drafters.match_kernels import local_draft
from specdepth.workers.drafters.suffix import MATCH_LENGTHS, _Index, walk


@pytest.mark.parametrize("seed", range(6))
def test_the_scan_equals_the_indexed_walk_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    found = 0
    for _ in range(150):
        vocab = int(rng.integers(2, 12))  # small vocabularies: long matches, ties, overlaps
        seq = rng.integers(0, vocab, int(rng.integers(1, 120))).tolist()
        if rng.random() < 0.4:  # a repeated stretch, as code repeats
            a = int(rng.integers(0, len(seq)))
            seq = seq + seq[a:a + int(rng.integers(1, 70))]
        lengths = tuple(n for n in MATCH_LENGTHS if n <= int(rng.choice([1, 4, 24, 64])))
        budget, min_prob = int(rng.integers(1, 10)), float(rng.choice([0.0, 0.1, 0.3, 0.6]))
        spec_factor = float(rng.choice([0.5, 1.0, 2.0, 4.0]))
        idx = _Index()
        idx.extend(seq, lengths)
        want = walk(idx, seq[-lengths[-1]:], lengths, budget, min_prob, spec_factor)
        got = local_draft(np.array(seq + [7] * 5, np.int64), len(seq), np.array(lengths, np.int64),
                          budget, min_prob, spec_factor)  # a buffer longer than the text: read to n only
        if want is None:
            assert got is None
            continue
        found += 1
        assert got is not None
        assert got[0] == want.tokens and got[1] == want.top1  # exact floats
        assert got[2] == want.match and got[3] == want.score
    assert found > 50  # the comparison saw drafts, not only misses


@pytest.mark.parametrize("seed", range(4))
def test_the_global_index_draft_equals_its_walk_bit_for_bit(seed):
    """The global index's documents are walked compiled (`_Index.draft`) as `walk` states the
    rule: a separator is followed by nothing, occurrences never cross one."""
    rng = np.random.default_rng(seed)
    found = 0
    for _ in range(100):
        vocab = int(rng.integers(2, 10))
        lengths = tuple(n for n in MATCH_LENGTHS if n <= int(rng.choice([1, 4, 24])))
        idx = _Index()
        for _ in range(int(rng.integers(1, 6))):
            idx.extend(rng.integers(0, vocab, int(rng.integers(0, 40))).tolist(), lengths)
        context = rng.integers(0, vocab, int(rng.integers(1, 30))).tolist()
        budget, min_prob = int(rng.integers(1, 10)), float(rng.choice([0.0, 0.1, 0.3]))
        spec_factor = float(rng.choice([0.5, 1.0, 4.0]))
        want = walk(idx, context, lengths, budget, min_prob, spec_factor)
        got = idx.draft(context, lengths, budget, min_prob, spec_factor)
        if want is None:
            assert got is None
            continue
        found += 1
        assert (got.tokens, got.top1, got.match, got.score) == (want.tokens, want.top1, want.match, want.score)
    assert found > 30
