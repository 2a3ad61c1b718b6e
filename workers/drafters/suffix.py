"""Suffix drafting (SuffixDecoding, arXiv 2411.04975; vLLM's and Arctic Inference's `suffix`).

Two sources of patterns: the sequence's own prompt and output so far, scanned when it drafts
(`match_kernels`: no index to build or keep up, so a sequence that never drafts costs nothing),
and a global index of patterns -> where they occurred over the outputs of earlier sequences
(bounded to `max_cached` tokens, oldest dropped first). To draft, the longest recent suffix of
the sequence (up to `max_depth` tokens, matched at the lengths in MATCH_LENGTHS) is found in
each; from its occurrences the draft walks the most frequent next token (the latest on a tie),
keeping the occurrences that agree, exactly as a walk down a suffix tree. It stops where the
estimated probability of the whole draft so far, occurrences that agree / occurrences matched,
falls below `min_prob`, or past `spec_factor` x the matched length. Of the two sources' drafts
the one with the higher score (the sum of those probabilities, its expected accepted tokens) is
proposed.

The proposal is a function of the prefix (and of finished sequences), so q is one-hot.
Features: `top1` = agreeing / (matched + 1) occurrences at that position, `entropy` = 1 / the
matched length.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specdepth.workers.drafters.base import Proposal, TokenBuffer, fixed_proposal
from specdepth.workers.drafters.match_kernels import SEP, local_draft, walk_tokens
from specdepth.workers.drafting import KeepFn

MATCH_LENGTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # suffix lengths indexed and matched


@dataclass
class _Index:
    """Token lists and, for each indexed pattern (a tuple of MATCH_LENGTHS tokens or fewer), the
    positions of the tokens that followed it."""
    toks: list[int] = field(default_factory=list)
    where: dict[tuple[int, ...], list[int]] = field(default_factory=dict)
    buf: TokenBuffer = field(default_factory=TokenBuffer)  # toks as int64, for the compiled walk

    def extend(self, doc: list[int], lengths: tuple[int, ...]) -> None:
        """Append one document (no SEP inside) and its separator; index each of its tokens after
        the first under the patterns of each length in `lengths` (ascending) that end right
        before it within the document."""
        base = len(self.toks)
        self.toks.extend(doc)
        self.toks.append(SEP)
        tup, where = tuple(doc), self.where
        for i in range(1, len(doc)):
            t = base + i
            for n in lengths:
                if n > i:
                    break
                key = tup[i - n:i]  # a tuple slice: no list made and converted per pattern
                occ = where.get(key)
                if occ is None:
                    where[key] = [t]
                else:
                    occ.append(t)
        self.buf.sync(self.toks)

    def longest(self, context: list[int], lengths: tuple[int, ...]) -> tuple[list[int], int]:
        """(positions that followed it, its length) of the longest suffix of `context` indexed at
        one of `lengths`; ([], 0) where none is."""
        for n in reversed(lengths):
            if n <= len(context):
                occ = self.where.get(tuple(context[len(context) - n:]))
                if occ:
                    return occ, n
        return [], 0

    def draft(self, context: list[int], lengths: tuple[int, ...], budget: int, min_prob: float,
              spec_factor: float) -> _Draft | None:
        """`walk(self, ...)`, its walk compiled (`match_kernels.walk_tokens`, the same floats)."""
        occ, match = self.longest(context, lengths)
        if not occ:
            return None
        out_tok, out_top1 = np.empty(budget, np.int64), np.empty(budget)
        j, score = walk_tokens(self.buf.buf, self.buf.n, np.array(occ, np.int64), match, budget, min_prob,
                               spec_factor, out_tok, out_top1)
        return _Draft(out_tok[:j].tolist(), out_top1[:j].tolist(), match, score) if j else None


@dataclass
class _Draft:
    tokens: list[int]
    top1: list[float]
    match: int  # the matched suffix's length
    score: float  # sum of the estimated probabilities: expected accepted tokens


def walk(index: _Index, context: list[int], lengths: tuple[int, ...], budget: int,
         min_prob: float, spec_factor: float) -> _Draft | None:
    """The suffix-tree walk from the longest suffix of `context` found in `index` (module doc): the
    rule as written, which `_Index.draft` runs compiled."""
    occ, match = index.longest(context, lengths)
    if not occ:
        return None
    toks, end = index.toks, len(index.toks)
    limit = min(budget, max(1, int(spec_factor * match)))
    out, top1, score, total = [], [], 0.0, len(occ)
    while len(out) < limit:
        counts: dict[int, int] = {}
        latest: dict[int, int] = {}
        for p in occ:
            if p < end:
                tok = toks[p]
                if tok != SEP:
                    counts[tok] = counts.get(tok, 0) + 1
                    latest[tok] = p
        if not counts:
            break
        best = max(counts, key=lambda c: (counts[c], latest[c]))
        prob = counts[best] / total  # occurrences of the whole draft so far / of the matched suffix
        if prob < min_prob:
            break
        out.append(best)
        top1.append(counts[best] / (len(occ) + 1.0))
        score += prob
        occ = [p + 1 for p in occ if p < end and toks[p] == best]
    return _Draft(out, top1, match, score) if out else None


class SuffixDrafter:
    name = "suffix"
    model_free = True

    def __init__(self, runner=None, max_depth: int = 24, min_prob: float = 0.1, spec_factor: float = 1.0,
                 max_cached: int = 1 << 16) -> None:
        """Args: runner: the `PairRunner` (its device); max_depth: the longest suffix matched;
        min_prob: the draft stops below this estimated probability; spec_factor: drafts at most
        this x the matched length; max_cached: tokens of earlier outputs in the global index.

        Raises:
            ValueError: a setting out of range.
        """
        if max_depth < 1 or not 0 <= min_prob < 1 or spec_factor <= 0 or max_cached < 0:
            raise ValueError(f"need max_depth >= 1, 0 <= min_prob < 1, spec_factor > 0, max_cached >= 0; "
                             f"got {max_depth}, {min_prob}, {spec_factor}, {max_cached}")
        self.lengths = tuple(n for n in MATCH_LENGTHS if n <= max_depth)
        self.min_prob, self.spec_factor, self.max_cached = min_prob, spec_factor, max_cached
        self.device = "cpu" if runner is None else runner.device
        self.lengths_arr = np.array(self.lengths, np.int64)
        self.local: dict[int, TokenBuffer] = {}
        self.prompt_len: dict[int, int] = {}
        self.outputs: list[list[int]] = []  # the global index's documents, oldest first
        self._size = 0  # their tokens, with a separator each
        self.glob = _Index()  # indexes outputs[:_indexed]
        self._indexed = 0

    # ---- sequences ----------------------------------------------------------------------------
    def add(self, slots: list[int], seqs: list[list[int]]) -> None:
        for slot, toks in zip(slots, seqs):
            self.local[slot] = TokenBuffer()  # filled at its proposals (`propose`)
            self.prompt_len[slot] = len(toks)

    def commit(self, slot: int, n_committed: int) -> None:
        return None  # committed tokens only grow; `propose` reads the new ones

    def remove(self, slot: int) -> None:
        """The sequence's output (as far as its last proposal) joins the global index's documents;
        they are indexed at the next proposal (`index`), so a run that stops drafting stops paying."""
        own = self.local.pop(slot, None)
        start = self.prompt_len.pop(slot, 0)
        if own is None or self.max_cached == 0 or own.n <= start:
            return
        out = own.buf[start:own.n][-(self.max_cached - 1):].tolist() if self.max_cached > 1 else []
        self.outputs.append(out)
        self._size += len(out) + 1
        if self._size <= self.max_cached:
            return
        # over the bound: keep the newest outputs that fill half of it, to be re-indexed (half, so
        # that the next rebuild is max_cached / 2 new tokens away, not at the next request)
        kept, size = [], 0
        for doc in reversed(self.outputs):
            if size + len(doc) + 1 > max(self.max_cached // 2, len(out) + 1):
                break
            kept.append(doc)
            size += len(doc) + 1
        self.outputs, self._size = kept[::-1], size
        self.glob, self._indexed = _Index(), 0

    def index(self) -> _Index:
        """The global index, brought up to date with the outputs finished since it last was."""
        for doc in self.outputs[self._indexed:]:
            self.glob.extend(doc, self.lengths)
        self._indexed = len(self.outputs)
        return self.glob

    # ---- drafting -----------------------------------------------------------------------------
    def propose(self, seqs: dict[int, list[int]], slots: np.ndarray, budgets: np.ndarray,
                keep_fn: KeepFn | None) -> Proposal:
        drafts = {}
        rows = np.flatnonzero(budgets > 0).tolist()
        glob = self.index() if rows else self.glob
        for r in rows:
            slot = int(slots[r])
            own, seq, budget = self.local[slot], seqs[slot], int(budgets[r])
            own.sync(seq)
            best = None
            hit = local_draft(own.buf, own.n, self.lengths_arr, budget, self.min_prob, self.spec_factor)
            if hit is not None:
                best = _Draft(*hit)
            if glob.where:
                d = glob.draft(seq[-self.lengths[-1]:], self.lengths, budget, self.min_prob, self.spec_factor)
                if d is not None and (best is None or d.score > best.score):
                    best = d
            if best is not None:
                drafts[r] = (best.tokens, best.top1, [1.0 / best.match] * len(best.tokens))
        return fixed_proposal(drafts, budgets, keep_fn, self.device)
