"""`PairRunner._check_finite`: a row fails where a position it verifies has a NaN or an inf
logit, and only there; the fast whole-pass check only decides when to look row by row."""

from __future__ import annotations

import numpy as np
import torch

from specdepth.workers.runner import PairRunner


def failed(logits: torch.Tensor, n_valid: list[int]) -> list[int]:
    return sorted(PairRunner._check_finite(logits, np.array(n_valid), "target"))


def test_only_rows_with_a_non_finite_logit_where_they_verify_fail() -> None:
    logits = torch.randn(4, 3, 16)
    assert failed(logits, [3, 3, 2, 1]) == []
    logits[0, 1, 5] = float("nan")
    logits[1, 2, 0] = float("-inf")
    logits[2, 2, 7] = float("inf")  # past row 2's verified positions (padding): no failure
    logits[3, 0, 3] = float("inf")
    assert failed(logits, [3, 3, 2, 1]) == [0, 1, 3]


def test_finite_logits_whose_sum_overflows_do_not_fail() -> None:
    logits = torch.full((2, 2, 4096), 3e35)  # each finite; their float32 sum is inf
    assert not bool(torch.isfinite(logits.sum()))
    assert failed(logits, [2, 2]) == []
