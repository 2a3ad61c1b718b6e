"""`greedy_verify` (one compiled call) against its rule in numpy statements, on random cases
and on the shapes a step gives it (a draft sliced to the deepest verify length, rows verifying
nothing, a plain step with no draft at all)."""

from __future__ import annotations

import numpy as np
import pytest

from specdepth.workers.sampler import greedy_verify


def reference(draft_tokens: np.ndarray, target_argmax: np.ndarray,
              verify_len: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rule: a row accepts its leading drafts, within its verify length, that equal the
    target's argmax, and emits those and the target's next token; -1 after."""
    B, D = draft_tokens.shape
    ok = (draft_tokens == target_argmax[:, :D]) & (np.arange(D)[None, :] < verify_len[:, None])  # (B, D)
    accepted = np.cumprod(ok, axis=1).sum(axis=1) if D else np.zeros(B, np.int64)  # (B,)
    return accepted, np.where(np.arange(D + 1)[None, :] <= accepted[:, None], target_argmax, -1)


def test_greedy_verify_equals_its_rule_on_random_cases() -> None:
    rng = np.random.default_rng(0)
    for _ in range(3000):
        B, J = int(rng.integers(1, 6)), int(rng.integers(0, 9))
        drafts = rng.integers(0, 3, (B, J + 2))  # a small vocabulary: long agreeing runs
        verify = rng.integers(0, J + 1, B)
        D = int(verify.max(initial=0))
        target = rng.integers(0, 3, (B, D + 1))
        got, want = greedy_verify(drafts[:, :D], target, verify), reference(drafts[:, :D], target, verify)
        assert got[0].dtype == np.int64 and got[1].dtype == np.int64
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_greedy_verify_on_a_steps_shapes() -> None:
    drafts = np.array([[5, 6, 7, 8], [5, 6, 7, 8], [1, 2, 3, 4]])
    target = np.array([[5, 6, 9, 0], [5, 6, 7, 8], [9, 9, 9, 9]])
    verify = np.array([3, 2, 0])  # row 1 accepts as far as it verifies; row 2 verifies nothing
    accepted, out = greedy_verify(drafts[:, :3], target, verify)
    assert accepted.tolist() == [2, 2, 0]
    assert out.tolist() == [[5, 6, 9, -1], [5, 6, 7, -1], [9, -1, -1, -1]]
    accepted, out = greedy_verify(np.zeros((2, 0), np.int64), np.array([[4], [7]]), np.zeros(2, np.int64))
    assert accepted.tolist() == [0, 0] and out.tolist() == [[4], [7]]  # a plain step: the argmax alone


def test_greedy_verify_refuses_shapes_that_disagree() -> None:
    ok_draft, ok_target, ok_len = np.zeros((2, 3), np.int64), np.zeros((2, 4), np.int64), np.zeros(2, np.int64)
    for draft, target, lens in ((ok_draft, ok_target[:, :3], ok_len), (ok_draft, ok_target, ok_len[:1]),
                                (ok_draft[0], ok_target, ok_len), (ok_draft, ok_target[:1], ok_len)):
        with pytest.raises(ValueError, match="greedy_verify: shapes"):
            greedy_verify(draft, target, lens)
