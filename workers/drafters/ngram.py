"""N-gram lookup drafting (prompt lookup; vLLM's `ngram`, HF's prompt lookup), with no model.

Each sequence keeps an index of its own tokens (prompt and output): for every n in
[n_min, n_max], each n-gram maps to how often each token followed it, and which followed it last.
To draft position j the drafter takes the longest suffix of the tokens so far (committed ones and
the j - 1 it drafted) that occurred before, and proposes its most frequent continuation (the
latest on a tie); no such suffix stops the row's draft. The proposal is a function of the prefix,
so its q is one-hot. Features, from the same prefix: `top1` = count of the proposed continuation
/ (occurrences of the suffix + 1), which grows with repeated, consistent evidence, and
`entropy` = 1 / n, the shorter the matched suffix, the less it says.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specdepth.workers.drafters.base import Proposal, fixed_proposal
from specdepth.workers.drafting import KeepFn

NGRAM_MIN, NGRAM_MAX = 1, 4  # defaults, as `--ngram-min` / `--ngram-max`


@dataclass
class _Index:
    """One sequence's n-gram statistics over its first `seen` tokens."""
    seen: int = 0
    # per n (index n - n_min): n-gram -> {next token: count}; and n-gram -> the latest next token
    counts: list[dict[tuple[int, ...], dict[int, int]]] = field(default_factory=list)
    latest: list[dict[tuple[int, ...], int]] = field(default_factory=list)


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
        self.index: dict[int, _Index] = {}

    # ---- sequences ----------------------------------------------------------------------------
    def add(self, slots: list[int], seqs: list[list[int]]) -> None:
        for slot, toks in zip(slots, seqs):
            n_sizes = self.n_max - self.n_min + 1
            # indexed at its first proposal (`propose`): a sequence that never drafts costs nothing
            self.index[slot] = _Index(0, [{} for _ in range(n_sizes)], [{} for _ in range(n_sizes)])

    def commit(self, slot: int, n_committed: int) -> None:
        return None  # committed tokens only grow; `propose` indexes the new ones

    def remove(self, slot: int) -> None:
        self.index.pop(slot, None)

    def _extend(self, idx: _Index, toks: list[int]) -> None:
        """Index the continuations of every n-gram that ends before toks[t], t >= idx.seen."""
        for t in range(max(idx.seen, 1), len(toks)):
            nxt = toks[t]
            for k, n in enumerate(range(self.n_min, min(self.n_max, t) + 1)):
                key = tuple(toks[t - n:t])
                c = idx.counts[k].get(key)
                if c is None:
                    idx.counts[k][key] = {nxt: 1}
                else:
                    c[nxt] = c.get(nxt, 0) + 1
                idx.latest[k][key] = nxt
        idx.seen = len(toks)

    def lookup(self, idx: _Index, toks: list[int]) -> tuple[int, float, float] | None:
        """The proposal after `toks` (which extend the indexed ones): (token, top1, entropy), or
        None when no suffix of n_min or more tokens occurred before."""
        for n in range(min(self.n_max, len(toks)), self.n_min - 1, -1):
            k = n - self.n_min
            key = tuple(toks[len(toks) - n:])
            c = idx.counts[k].get(key)
            if c is None:
                continue
            latest = idx.latest[k][key]
            tok, best = latest, c[latest]
            for cand, cnt in c.items():
                if cnt > best:
                    tok, best = cand, cnt
            return tok, best / (sum(c.values()) + 1.0), 1.0 / n
        return None

    # ---- drafting -----------------------------------------------------------------------------
    def propose(self, seqs: dict[int, list[int]], slots: np.ndarray, budgets: np.ndarray,
                keep_fn: KeepFn | None) -> Proposal:
        """Each row's whole draft first (lookups are microseconds), then the draft loop reads it."""
        drafts = {}
        for r in np.flatnonzero(budgets > 0).tolist():
            slot = int(slots[r])
            idx, seq = self.index[slot], seqs[slot]
            if idx.seen < len(seq):
                self._extend(idx, seq)
            ctx, toks, top1, ent = seq[-self.n_max:], [], [], []
            for _ in range(int(budgets[r])):
                hit = self.lookup(idx, ctx)
                if hit is None:
                    break
                toks.append(hit[0])
                top1.append(hit[1])
                ent.append(hit[2])
                ctx = ctx[1:] + [hit[0]] if len(ctx) == self.n_max else ctx + [hit[0]]
            drafts[r] = (toks, top1, ent)
        return fixed_proposal(drafts, budgets, keep_fn, self.device)
