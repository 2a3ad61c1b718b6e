"""The drafter protocol: propose up to L_r tokens per sequence, with q and confidence features.

A drafter proposes, for each running sequence r, up to `budgets[r]` tokens continuing its
committed tokens, through the shared `draft_loop` (so `keep_fn` is asked after the same positions
whatever the drafter). With each token it gives the distribution q it came from (None: one-hot,
a deterministic proposal or a greedy draft; the rejection sampler then accepts x with probability
p(x)) and two confidence features per position, computed from the prefix only (the lossless rule,
DESIGN.md): `top1` in (0, 1] and `entropy` >= 0. The draft model gives its top-1 probability and
entropy; a model-free drafter gives numbers of the same kind (a continuation frequency, a match
length), which the acceptance model calibrates like any other.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from specdepth.workers.drafting import Drafted, KeepFn, draft_loop


@dataclass
class Proposal:
    tokens: torch.Tensor  # (B, J) long: drafted tokens, J >= 1; entries past drafted[r] are ignored
    qprobs: torch.Tensor | None  # (B, J, V) float: the q each token was drawn from; None: one-hot q
    drafted: Drafted  # counts (B,), features (B, J), passes and timings
    free: np.ndarray | None = None  # (B,) bool: rows drafted model-free (a hybrid drafter); None: all one drafter's


class Drafter(Protocol):
    """What the runner asks of a drafter. Slots are the runner's; `seqs[slot]` is a sequence's
    committed tokens (prompt and output), which only grow while the slot is held."""

    name: str
    model_free: bool  # True: drafting costs no model pass (the cost model prices it as free)

    def add(self, slots: list[int], seqs: list[list[int]]) -> None:
        """New sequences took these slots (prefill whatever the drafter keeps)."""

    def propose(self, seqs: dict[int, list[int]], slots: np.ndarray, budgets: np.ndarray,
                keep_fn: KeepFn | None) -> Proposal:
        """Draft up to budgets[r] tokens for each slot. Args: slots (B,) int64, budgets (B,) int64."""

    def commit(self, slot: int, n_committed: int) -> None:
        """The step committed: `slot` now holds `n_committed` tokens (drop state past them)."""

    def remove(self, slot: int) -> None:
        """The sequence left its slot."""



class TokenBuffer:
    """A sequence's committed tokens as far as its last proposal, in a growing int64 buffer (for
    the compiled matching of workers/drafters/match_kernels.py)."""

    def __init__(self) -> None:
        self.buf = np.zeros(256, np.int64)
        self.n = 0

    def sync(self, seq: list[int]) -> None:
        """Append the tokens of `seq` (which extends what is held) past the first n."""
        if len(seq) > len(self.buf):
            grown = np.zeros(max(len(seq), 2 * len(self.buf)), np.int64)
            grown[:self.n] = self.buf[:self.n]
            self.buf = grown
        if self.n < len(seq):
            self.buf[self.n:len(seq)] = seq[self.n:]
            self.n = len(seq)


def fixed_proposal(drafts: dict[int, tuple[list[int], list[float], list[float]]], budgets: np.ndarray,
                   keep_fn: KeepFn | None, device: str | torch.device = "cpu") -> Proposal:
    """The proposal of a drafter that makes each row's whole draft at once (a model-free one):
    `drafts[r]` = (tokens, top1, entropy) of row r, at most budgets[r] long; the draft loop then
    reads them position by position, asking `keep_fn` as after model passes. q is one-hot."""
    B, K = len(budgets), int(budgets.max(initial=0))
    tokens = np.zeros((B, max(K, 1)), np.int64)  # (B, J)
    feats = np.zeros((B, max(K, 1), 2))  # (B, J, (top1, entropy))
    n_drafted = np.zeros(B, np.int64)
    for r, (toks, top1, ent) in drafts.items():
        n = len(toks)
        tokens[r, :n], feats[r, :n, 0], feats[r, :n, 1], n_drafted[r] = toks, top1, ent, n

    if keep_fn is None:
        return Proposal(torch.from_numpy(tokens).to(device), None, read_off(budgets, feats, n_drafted))

    def draft_pass(j: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return feats[rows, j, 0], feats[rows, j, 1], n_drafted[rows] > j

    return Proposal(torch.from_numpy(tokens).to(device), None, draft_loop(budgets, draft_pass, keep_fn))


def read_off(budgets: np.ndarray, feats: np.ndarray, n_drafted: np.ndarray) -> Drafted:
    """`draft_loop`'s result for whole drafts when no `keep_fn` is asked, read off in a few array
    calls instead of one round of them per position (~0.1 ms a step here). A row of budget > 0
    takes part in the loop's passes up to its last token, and one more where its draft ended short
    of its budget; the loop runs as many passes as its longest-running row.

    Args:
        budgets: (B,) int64; feats: (B, >= K, 2) float (top1, entropy), 0 past each draft;
        n_drafted: (B,) int64 tokens drafted, at most the budgets.
    """
    t = time.perf_counter()
    K = int(budgets.max(initial=0))
    runs = budgets > 0
    last = np.where(n_drafted < budgets, n_drafted + 1, n_drafted)[runs]  # (b,) passes each row takes part in
    passes = int(last.max(initial=0))
    return Drafted(np.where(runs, n_drafted, 0), feats[:, :K, 0].copy(), feats[:, :K, 1].copy(), passes, 0.0,
                   time.perf_counter() - t if passes else 0.0)
