"""N-gram lookup drafting (prompt lookup; vLLM's `ngram`, HF's prompt lookup), with no model.

To draft position j the drafter takes the longest suffix (n_min to n_max tokens) of the tokens
so far (committed ones and the j - 1 it drafted) that occurred in the committed ones, and proposes
its most frequent continuation there (the latest on a tie); no such suffix stops the row's draft.
The committed tokens are scanned when a sequence drafts (`match_kernels.ngram_draft`), so a
sequence costs nothing until it drafts and nothing to keep up while it does not. The proposal is
a function of the prefix, so its q is one-hot. Features, from the same prefix: `top1` = count of the proposed continuation
/ (occurrences of the suffix + 1), which grows with repeated, consistent evidence, and
`entropy` = 1 / n, the shorter the matched suffix, the less it says.
"""

from __future__ import annotations

import numpy as np

from specdepth.workers.drafters.base import Proposal, TokenBuffer, fixed_proposal
from specdepth.workers.drafters.match_kernels import ngram_draft
from specdepth.workers.drafting import KeepFn

NGRAM_MIN, NGRAM_MAX = 1, 4  # defaults, as `--ngram-min` / `--ngram-max`


class NgramDrafter:
    name = "ngram"
    model_free = True

    def __init__(self, runner=None, ngram_min: int = NGRAM_MIN, ngram_max: int = NGRAM_MAX) -> None:
        """Args: runner: the `PairRunner` (its device); ngram_min, ngram_max: the suffix lengths
        matched, longest first.

        Raises:
            ValueError: 1 <= ngram_min <= ngram_max does not hold.
        """
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {ngram_min} and {ngram_max}")
        self.n_min, self.n_max = ngram_min, ngram_max
        self.device = "cpu" if runner is None else runner.device
        self.tokens: dict[int, TokenBuffer] = {}

    # ---- sequences ----------------------------------------------------------------------------
    def add(self, slots: list[int], seqs: list[list[int]]) -> None:
        for slot in slots:
            self.tokens[slot] = TokenBuffer()  # filled at its proposals (`propose`)

    def commit(self, slot: int, n_committed: int) -> None:
        return None  # committed tokens only grow; `propose` reads the new ones

    def remove(self, slot: int) -> None:
        self.tokens.pop(slot, None)

    # ---- drafting -----------------------------------------------------------------------------
    def propose(self, seqs: dict[int, list[int]], slots: np.ndarray, budgets: np.ndarray,
                keep_fn: KeepFn | None) -> Proposal:
        """Each row's whole draft first (a compiled scan, microseconds), then the draft loop reads it."""
        drafts = {}
        for r in np.flatnonzero(budgets > 0).tolist():
            slot, budget = int(slots[r]), int(budgets[r])
            own = self.tokens[slot]
            own.sync(seqs[slot])
            toks, top1, ent = np.empty(budget, np.int64), np.empty(budget), np.empty(budget)
            j = ngram_draft(own.buf, own.n, self.n_min, self.n_max, budget, toks, top1, ent)
            drafts[r] = (toks[:j].tolist(), top1[:j].tolist(), ent[:j].tolist())
        return fixed_proposal(drafts, budgets, keep_fn, self.device)
