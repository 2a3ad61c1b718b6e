"""Compiled suffix matching over one sequence's own tokens (numba), for the suffix drafter.

A sequence's own text is matched by scanning it, not through an index: one pass finds, for every
earlier position, how many tokens before it agree with the sequence's end. A scan of a few hundred
tokens is a microsecond or two compiled, so a sequence costs nothing until it drafts and nothing
to keep up while it does not (an index costs ~40 us a committed token in Python, paid at the
first proposal for the whole prompt).

Exactness: `local_draft` gives the answers of `suffix.walk` on an index of the same tokens, with
no separator, bit for bit (tests/workers/drafters/test_match_kernels.py compares them on random
cases): the same occurrences in the same order, the same tie rule, the same float divisions.
"""

from __future__ import annotations

import numpy as np
from numba import njit


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
    """The suffix-tree walk from `occ` over toks[:n] (`suffix.walk`'s rule): writes the draft into
    out_tok, out_top1 (each >= budget long); returns (tokens drafted, score)."""
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
            if p < n:
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
