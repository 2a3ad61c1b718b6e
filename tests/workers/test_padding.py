"""The padding rule the engine and the replay share: when a ragged pass runs padded, and what the
padding verifies for free."""

from __future__ import annotations

import numpy as np

from specdepth.workers.padding import PAD_ALL, free_verify, runs_padded


def test_a_nearly_full_verify_pass_verifies_its_padding():
    drafted = np.array([2, 2, 3, 1] + [2] * 60)
    verify = np.array([2, 1, 2, 1] + [2] * 60)  # 64 rows padded to 3 tokens: 192 computed, 190 valid
    assert runs_padded(64, 3, 190)
    np.testing.assert_array_equal(free_verify(verify, drafted), np.minimum(drafted, 2))  # never past drafted
    assert free_verify(verify, drafted)[2] == 2  # nor past the widest row


def test_a_ragged_pass_keeps_its_verify_lengths():
    verify = np.array([4, 0, 0, 0])  # 4 rows padded to 5: 20 computed for 8 valid, packed instead
    assert not runs_padded(4, 5, 8)
    np.testing.assert_array_equal(free_verify(verify, np.array([4, 4, 4, 4])), verify)
    np.testing.assert_array_equal(free_verify(np.zeros(3, np.int64), np.ones(3, np.int64)), np.zeros(3))
    assert PAD_ALL < 1
