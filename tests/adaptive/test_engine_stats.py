"""The engine's per-position counts, counted a step at a time."""

from __future__ import annotations

import numpy as np
import pytest

from specdepth.adaptive.engine import EngineStats, count_positions


@pytest.mark.parametrize("seed", range(20))
def test_count_positions_is_the_per_sequence_rule(seed):
    """Position j verified means the j - 1 before it were accepted: each sequence counts positions
    up to its first rejection as verified, and its accepted ones as accepted."""
    rng = np.random.default_rng(seed)
    K = int(rng.integers(0, 9))
    st, want = EngineStats.empty(K), EngineStats.empty(K)
    for _ in range(5):
        B = int(rng.integers(0, 12))
        d = rng.integers(0, K + 1, B)
        a = np.minimum(rng.integers(0, K + 1, B), d)
        count_positions(st, d, a)
        for dr, ar in zip(d.tolist(), a.tolist()):
            want.pos_verified[:dr] += 1
            want.pos_accepted[:ar] += 1
            if dr > ar:
                want.pos_verified[ar + 1:dr] -= 1
    assert np.array_equal(st.pos_verified, want.pos_verified)
    assert np.array_equal(st.pos_accepted, want.pos_accepted)
