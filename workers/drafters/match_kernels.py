"""Compiled matching over one sequence's own tokens (numba), for the suffix and n-gram drafters.

A sequence's own text is matched by scanning it, not through an index: one pass finds, for every
earlier position, how many tokens before it agree with the sequence's end. A scan of a few hundred
tokens is a microsecond or two compiled, so a sequence costs nothing until it drafts and nothing
to keep up while it does not (an index costs ~40 us a committed token in Python, paid at the
first proposal for the whole prompt).

Exactness: `local_draft` gives the answers of `suffix.walk` on an index of the same tokens, with
no separator, bit for bit (tests/workers/drafters/test_match_kernels.py compares them on random
cases): the same occurrences in the same order, the same tie rule, the same float divisions.
`ngram_draft` gives those of the n-gram rule on an index of n-gram counts (tests/workers/drafters/
test_ngram.py, on random cases).
"""

from __future__ import annotations

import numpy as np
from numba import njit

SEP = -1  # between the documents of a token array (the suffix drafter's global index): never a token


@njit(cache=True)
def longest_match(toks: np.ndarray, n: int, lengths: np.ndarray) -> tuple[np.ndarray, int]:
    """(occ, match): the positions that followed each earlier occurrence of the longest suffix of
    toks[:n] whose length is in `lengths` (ascending), in order; (empty, 0) where none occurred.
    An occurrence ends before the last token (it has a successor), and may overlap the suffix."""
    longest = lengths[-1]
    agree = np.zeros(max(n - 1, 0), np.int64)  # (n - 1,) tokens agreeing backward from e with the end
    best = 0
    for e in range(n - 1):
        k = 0
        while k < longest and k <= e and toks[e - k] == toks[n - 1 - k]:
            k += 1
        agree[e] = k
        if k > best:
            best = k
    match = 0
    for length in lengths:
        if length <= best:
            match = length
    if match == 0:
        return np.zeros(0, np.int64), 0
    count = 0
    for e in range(n - 1):
        if agree[e] >= match:
            count += 1
    occ = np.empty(count, np.int64)
    i = 0
    for e in range(n - 1):
        if agree[e] >= match:
            occ[i] = e + 1
            i += 1
    return occ, match


@njit(cache=True)
def walk_tokens(toks: np.ndarray, n: int, occ: np.ndarray, match: int, budget: int, min_prob: float,
                spec_factor: float, out_tok: np.ndarray, out_top1: np.ndarray) -> tuple[int, float]:
    """The suffix-tree walk from `occ` over toks[:n] (`suffix.walk`'s rule; a SEP is followed by
    nothing): writes the draft into out_tok, out_top1 (each >= budget long); returns (tokens
    drafted, score)."""
    limit = min(budget, max(1, int(spec_factor * match)))
    total = occ.size
    cur = occ.copy()
    m = cur.size
    score = 0.0
    j = 0
    vals = np.empty(m, np.int64)
    pos = np.empty(m, np.int64)
    while j < limit:
        c = 0
        for i in range(m):
            p = cur[i]
            if p < n and toks[p] != SEP:
                vals[c] = toks[p]
                pos[c] = p
                c += 1
        if c == 0:
            break
        order = np.argsort(vals[:c], kind="mergesort")  # equal tokens together, positions ascending
        best_tok, best_cnt, best_late = -1, 0, -1
        i = 0
        while i < c:
            tok = vals[order[i]]
            cnt, late = 0, -1
            while i < c and vals[order[i]] == tok:
                late = max(late, pos[order[i]])
                cnt += 1
                i += 1
            if cnt > best_cnt or (cnt == best_cnt and late > best_late):
                best_tok, best_cnt, best_late = tok, cnt, late
        prob = best_cnt / total
        if prob < min_prob:
            break
        out_tok[j] = best_tok
        out_top1[j] = best_cnt / (m + 1.0)
        score += prob
        j += 1
        k = 0
        for i in range(m):
            p = cur[i]
            if p < n and toks[p] == best_tok:
                cur[k] = p + 1
                k += 1
        m = k
    return j, score


def local_draft(toks: np.ndarray, n: int, lengths: np.ndarray, budget: int, min_prob: float,
                spec_factor: float) -> tuple[list[int], list[float], int, float] | None:
    """(tokens, top1, match, score) of the walk from the longest suffix of toks[:n] matched in
    toks[:n] itself, or None where nothing is drafted."""
    occ, match = longest_match(toks, n, lengths)
    if match == 0:
        return None
    out_tok, out_top1 = np.empty(budget, np.int64), np.empty(budget)
    j, score = walk_tokens(toks, n, occ, match, budget, min_prob, spec_factor, out_tok, out_top1)
    return (out_tok[:j].tolist(), out_top1[:j].tolist(), match, score) if j else None


@njit(cache=True)
def _ngram_next(toks: np.ndarray, n: int, ctx: np.ndarray, c: int, n_min: int, n_max: int,
                vals: np.ndarray) -> tuple[int, int, int, int]:
    """The n-gram drafter's next token after ctx[:c] from toks[:n] (`ngram.NgramDrafter.lookup`'s
    rule on an index of toks[:n]): (token, its count, occurrences, suffix length); length 0: none."""
    for size in range(min(n_max, c), n_min - 1, -1):
        m = 0
        for t in range(size, n):
            i = 0
            while i < size and toks[t - size + i] == ctx[c - size + i]:
                i += 1
            if i == size:
                vals[m] = toks[t]  # in order of t: the continuations as the index counted them
                m += 1
        if m == 0:
            continue
        latest = vals[m - 1]
        order = np.argsort(vals[:m], kind="mergesort")  # equal tokens together, first occurrence first
        best, top, top_first, top_tok = 0, 0, m, 0
        i = 0
        while i < m:
            tok, first, cnt = vals[order[i]], order[i], 0
            while i < m and vals[order[i]] == tok:
                cnt += 1
                i += 1
            if tok == latest:
                best = cnt
            if cnt > top or (cnt == top and first < top_first):
                top, top_first, top_tok = cnt, first, tok
        # the index keeps continuations in order of first occurrence, and a strictly higher count
        # than the latest's replaces it: the first in that order among the most frequent
        best_tok = latest
        if top > best:
            best_tok, best = top_tok, top
        return best_tok, best, m, size
    return 0, 0, 0, 0


@njit(cache=True)
def ngram_draft(toks: np.ndarray, n: int, n_min: int, n_max: int, budget: int, out_tok: np.ndarray,
                out_top1: np.ndarray, out_ent: np.ndarray) -> int:
    """Up to `budget` tokens continuing toks[:n], each the n-gram drafter's lookup on toks[:n]
    after the committed tokens and the ones drafted before it; returns how many."""
    ctx = np.empty(n_max + budget, np.int64)
    c = min(n, n_max)
    ctx[:c] = toks[n - c:n]
    vals = np.empty(max(n, 1), np.int64)
    for j in range(budget):
        tok, cnt, total, size = _ngram_next(toks, n, ctx, c, n_min, n_max, vals)
        if size == 0:
            return j
        out_tok[j], out_top1[j], out_ent[j] = tok, cnt / (total + 1.0), 1.0 / size
        ctx[c] = tok
        c += 1
    return budget
