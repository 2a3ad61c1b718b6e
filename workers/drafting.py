"""The drafting loop: sequential draft passes, each sequence stopping at its budget or when asked.

One loop for the live runner and for replay's trace runner, so both ask `keep_fn` after the same
passes with the same features: a pass supplies position j + 1's features for the rows still
drafting, and the loop decides who drafts on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

# keep_fn(j, top1 (B, j), entropy (B, j), drafted (B,)) -> (B,) bool: draft position j + 1?
KeepFn = Callable[[int, np.ndarray, np.ndarray, np.ndarray], np.ndarray]
# draft_pass(j, rows (b,)) -> (top1 (b,), entropy (b,), ok (b,) bool): the features of position
# j + 1 for these rows; a row not ok (its draft cannot be trusted) drafts nothing more
DraftPass = Callable[[int, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]


@dataclass
class Drafted:
    drafted: np.ndarray  # (B,) int64: tokens drafted per sequence
    top1: np.ndarray  # (B, K) float: draft top-1 probability per position, 0 past drafted
    entropy: np.ndarray  # (B, K) float: draft entropy (nats)
    passes: int  # draft passes run
    keep_s: float  # wall time inside keep_fn
    first_pass_s: float  # wall time of the first pass (the catch-up), features included


def draft_loop(budgets: np.ndarray, draft_pass: DraftPass, keep_fn: KeepFn | None) -> Drafted:
    """Run draft passes until every sequence reached its budget or was told to stop.

    Args:
        budgets: (B,) int64 draft budgets L_r.
        draft_pass: runs pass j for the rows still drafting.
        keep_fn: asked after each pass (but the last possible) whether each sequence drafts on;
            None: every sequence drafts to its budget.
    """
    B, K = len(budgets), int(budgets.max(initial=0))
    top1, ent = np.zeros((B, K)), np.zeros((B, K))
    drafted = np.zeros(B, np.int64)
    active = budgets > 0
    j, keep_s, first_s = 0, 0.0, 0.0
    t_pass = time.perf_counter()
    while j < K and active.any():
        rows = np.flatnonzero(active)
        top1[rows, j], ent[rows, j], ok = draft_pass(j, rows)
        active[rows[~ok]] = False
        drafted[rows[active[rows]]] += 1
        j += 1
        if j == 1:
            first_s = time.perf_counter() - t_pass
        active &= drafted < budgets
        if keep_fn is not None and active.any() and j < K:
            t = time.perf_counter()
            active &= np.asarray(keep_fn(j, top1[:, :j], ent[:, :j], drafted), dtype=bool)
            keep_s += time.perf_counter() - t
    return Drafted(drafted, top1 * (np.arange(K) < drafted[:, None]), ent, j, keep_s, first_s)
