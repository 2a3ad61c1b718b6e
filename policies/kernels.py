"""Compiled loops for dspark's per-step decisions (numba): the plan, keep-drafting, and the
sorted-slot helpers they share with the causal verify answers (policies/verify_columns.py).

In numpy each decision is a few dozen small array calls, mostly per-call overhead; here each is
one compiled call doing the same arithmetic as plain loops.

Exactness: `plan_kernel` gives the numpy reference's answers bit for bit
(policies/kernels_reference.py `plan_budgets`; tests/policies/test_kernels.py compares them on
random cases). Survivals are the same float products, slots the same int64 fixed point
(s * 2^32, exact integer sums), and Theta the same IEEE divisions in the same order.
`keep_kernel` *is* dspark's keep-drafting rule (no numpy twin to match).

Everything here is pure arithmetic on arrays passed in: no state, clock or RNG.
"""

from __future__ import annotations

import numpy as np
from numba import njit

ONE = 1 << 32  # fixed point, as policies.allocation.ONE
ONE_F = float(ONE)


@njit(cache=True)
def clip_unit(x: float) -> float:
    """x clipped to [0, 1], NaN read as 0 (np.fmin(np.fmax(x, 0), 1))."""
    if x > 0.0:
        return x if x < 1.0 else 1.0
    return 0.0


@njit(cache=True)
def merge_desc(pool: np.ndarray, m: int, col: np.ndarray, out: np.ndarray) -> int:
    """Merge col's positive values into pool[:m] (descending) -> out; returns the new length."""
    srt = np.empty(col.size, col.dtype)
    return _merge_two(pool, m, srt, _desc(col, srt), out)


@njit(cache=True)
def first_stop_desc(pool: np.ndarray, m: int, n: int, times: np.ndarray, extra: float, margin: float,
                    flat: int) -> tuple[int, float]:
    """kernels_reference.first_stop over the descending pool[:m]: (k admitted, Theta_k * ONE).

    `flat`: times[0] == ... == times[flat] (see `_flat`). With no margin no stop comes before it:
    there each slot raises tau (by >= 1, exactly) and not the time, so the scan starts there."""
    tau = n * ONE
    k = min(flat, m) if not margin else 0
    for i in range(k):
        tau += pool[i]
    theta = tau / (times[k] + extra)
    while k < m:
        nxt = tau + pool[k]
        th = nxt / (times[k + 1] + extra)
        before = theta * (1.0 + margin) if margin else theta
        if not th > before:
            break
        tau, theta, k = nxt, th, k + 1
    return k, theta


@njit(cache=True)
def _flat(times: np.ndarray) -> int:
    """F with times[0] == times[1] == ... == times[F] (kernels_reference.free_slots)."""
    f = 0
    while f + 1 < times.size and times[f + 1] == times[0]:
        f += 1
    return f


@njit(cache=True)
def lengths_into(q: np.ndarray, depth: int, k: int, vstar: int, out: np.ndarray) -> None:
    """allocation.lengths_at into `out`: per-sequence counts of the k best slots of q[:depth], ties in (j, r) order."""
    n = q.shape[1]
    out[:] = 0
    if k == 0:
        return
    total = 0
    for j in range(depth):
        for r in range(n):
            if q[j, r] >= vstar:
                out[r] += 1
                total += 1
    excess = total - k  # tied with the k-th best but ranked after it: drop the last ones
    j = depth - 1
    while excess > 0 and j >= 0:
        r = n - 1
        while excess > 0 and r >= 0:
            if q[j, r] == vstar:
                out[r] -= 1
                excess -= 1
            r -= 1
        j -= 1


@njit(cache=True)
def _cannot_win(pool: np.ndarray, m: int, col: np.ndarray, mc: int, copies: int, n: int, total: int,
                times: np.ndarray, tail: np.ndarray, extra: float, bar: float) -> bool:
    """True if no depth D >= d can beat `bar` (best Theta * ONE): a shortcut of plan_kernel's search
    that changes no answer. pool[:m]: the slots of depths < d, col[:mc] the positive slots of depth
    d (both descending). A row's survival is non-increasing in j, so each of its slots at depths
    d..K is at most its slot at d: tau with k slots of any depth D >= d is at most n plus the k
    best of pool and `copies` = K - d + 1 of each slot of col, and never more than `total` (every
    slot); each such depth pays at least `extra` = d draft passes; `tail[k]` = min(times[k:]). The
    tests multiply rather than divide, with a 1e-9 relative safety margin, far above rounding:
    they only say True where the exact quotient tau / time is at most `bar`, so a depth that
    could win is never skipped. Once tau reaches `total` it stays there, and the test is monotone
    in the time (rounding is), so the remaining k are settled at once by the fastest of them."""
    safe = bar * (1.0 - 1e-9)
    if total <= safe * (tail[0] + extra):
        return True
    tau, i, c, left = n * ONE, 0, 0, copies
    for k in range(1, times.size):
        if i < m and (c >= mc or pool[i] >= col[c]):
            tau += pool[i]
            i += 1
        elif c < mc:
            tau += col[c]
            left -= 1
            if left == 0:
                c, left = c + 1, copies
        else:
            tau = total  # every slot counted (their bound sums to at least `total`)
        if tau >= total:
            return not total > safe * (tail[k] + extra)
        if tau > safe * (times[k] + extra):
            return False
    return True


@njit(cache=True)
def _desc(col: np.ndarray, out: np.ndarray) -> int:
    """col's positive values, descending -> out; returns how many."""
    pos = np.sort(col[col > 0])  # ascending
    m = pos.size
    for i in range(m):
        out[i] = pos[m - 1 - i]
    return m


@njit(cache=True)
def _merge_two(a: np.ndarray, ma: int, b: np.ndarray, mb: int, out: np.ndarray) -> int:
    """Merge the descending a[:ma] and b[:mb] -> out (descending); returns the length."""
    i, k, o = 0, 0, 0
    while i < ma and k < mb:
        if a[i] >= b[k]:
            out[o] = a[i]
            i += 1
        else:
            out[o] = b[k]
            k += 1
        o += 1
    while i < ma:
        out[o] = a[i]
        i += 1
        o += 1
    while k < mb:
        out[o] = b[k]
        k += 1
        o += 1
    return o


@njit(cache=True)
def _tail_min(times: np.ndarray) -> np.ndarray:
    """(S,) tail[k] = min(times[k:])."""
    tail = np.empty_like(times)
    lo = times[times.size - 1]
    for k in range(times.size - 1, -1, -1):
        lo = min(lo, times[k])
        tail[k] = lo
    return tail


@njit(cache=True)
def plan_kernel(prior_conf: np.ndarray, times: np.ndarray, pass_time: float, margin: float,
                ceiling: int = 0, first: float = 0.0) -> tuple[np.ndarray, int]:
    """kernels_reference.plan_budgets(cumprod(unit(prior_conf))) with `times` = target time by slot count.

    Args:
        prior_conf: (B, K) predicted per-position acceptance.
        times: (>= B K + 1,) target time with B + k tokens, k = 0, 1, ...
        pass_time: seconds of one draft pass over the batch (0: not priced).
        margin: minimum relative Theta gain to admit a slot.
        ceiling: > 0: every positive budget becomes this (a dynamic depth's ceiling; dspark sets
            its own after the plan, as whether to apply it depends on the plan's depth).
        first: seconds a step that drafts at all pays once on top of its passes (dspark's price
            of the draft's catch-up after a spell without drafting).

    Returns:
        (B,) int64 budgets, and the largest.
    """
    n, depth = prior_conf.shape
    budgets = np.zeros(n, np.int64)
    if n == 0 or depth == 0:
        return budgets, 0
    q = np.empty((depth, n), np.int64)  # (K, B) position-major fixed-point survivals
    col_pos = np.zeros(depth, np.int64)  # per column: positive slots and their sum
    col_sum = np.zeros(depth, np.int64)
    for r in range(n):
        s = 1.0
        for j in range(depth):
            s = clip_unit(prior_conf[r, j]) * s if j else clip_unit(prior_conf[r, 0])
            v = np.int64(s * ONE_F)
            q[j, r] = v
            col_pos[j] += v > 0
            col_sum[j] += v
    times = times[: n * depth + 1]
    flat = _flat(times) if not margin else 0
    tail = times[:0]  # min(times[k:]) by k, once needed
    total = n * ONE + col_sum.sum()  # tau with every slot
    srt = np.empty((depth, n), np.int64)  # each column's positive slots, descending, once sorted
    done = 0  # columns sorted
    pool = np.empty(n * depth, np.int64)  # descending slots of the columns merged so far
    spare = np.empty(n * depth, np.int64)
    m, merged = 0, 0
    slots, tau = 0, n * ONE  # positive slots and tau with every slot of depths <= d
    best_theta, best_d, best_k, best_v = n / times[0], 0, 0, 0
    refused = False  # the last depth refused slots
    for d in range(1, depth + 1):
        if col_pos[d - 1] == 0:
            break  # survival is non-increasing in j: nothing deeper either
        extra = d * pass_time + first
        if d > 1 and (refused or best_d < d - 1):  # can any depth from here on still win?
            while done < d:
                _desc(q[done], srt[done])
                done += 1
            while merged < d - 1:
                m = _merge_two(pool, m, srt[merged], col_pos[merged], spare)
                pool, spare, merged = spare, pool, merged + 1
            if tail.size == 0:
                tail = _tail_min(times)
            if _cannot_win(pool, m, srt[d - 1], col_pos[d - 1], depth - d + 1, n, total, times, tail, extra,
                           best_theta * ONE_F):
                break
        slots += col_pos[d - 1]
        tau += col_sum[d - 1]
        if slots <= flat:  # every slot admitted (see first_stop_desc); no order needed
            k, theta = slots, tau / (times[slots] + extra)
        else:
            while done < d:
                _desc(q[done], srt[done])
                done += 1
            while merged < d:
                m = _merge_two(pool, m, srt[merged], col_pos[merged], spare)
                pool, spare, merged = spare, pool, merged + 1
            k, theta = first_stop_desc(pool, m, n, times, extra, margin, flat)
        refused = k < slots
        if theta / ONE_F > best_theta:
            best_theta, best_d, best_k = theta / ONE_F, d, k
            best_v = pool[k - 1] if refused else 1  # 1: the smallest positive slot there can be
    lengths_into(q, best_d, best_k, best_v, budgets)
    if ceiling > 0 and best_k > 0:
        return raised(budgets, ceiling), ceiling
    return budgets, budgets.max()


@njit(cache=True)
def raised(budgets: np.ndarray, ceiling: int) -> np.ndarray:
    """(B,) int64: `ceiling` where budgets > 0, else 0 (a new array)."""
    out = np.zeros(budgets.size, np.int64)
    for r in range(budgets.size):
        if budgets[r] > 0:
            out[r] = ceiling
    return out


@njit(cache=True)
def keep_kernel(conf: np.ndarray, drafted: np.ndarray, budgets: np.ndarray, prior: np.ndarray, streak: float,
                times: np.ndarray, pass_one: float, pass_all: float, margin: float,
                horizon: int = 1) -> tuple[np.ndarray, float, int]:
    """dspark's keep-drafting rule after draft pass j (see policies/dspark.py).

    Position j + l of sequence r is worth s_{r,j} c_1 ... c_l expected tokens, c_l = c-hat_{r,j+l}:
    the prior's rate for that position blended with the last confidence (`streak`); 0 where r has
    stopped or its budget ends. Sequences are ranked by the worth of their next position; for
    every prefix of that ranking (k sequences) and every h <= `horizon` further passes,
    Theta = (tau + their worth over h positions) / (sunk draft time + h passes over k rows + the
    target step with k h more tokens). If the best beats Theta now, its sequences draft on. A pass
    over k rows is priced on the line between one row and the batch: pass_one + (pass_all -
    pass_one) (k - 1) / (B - 1).

    Args:
        conf: (B, j) calibrated confidences of positions 1..j (0 where not drafted).
        drafted: (B,) positions each sequence has drafted.
        budgets: (B,) the plan's budgets (no sequence drafts past its own).
        prior: (B, K) the prior's per-position rates (K > j).
        streak: weight of the last confidence (vs the prior) in c-hat.
        times: target time by total step tokens N (covering up to B (K + 1)).
        pass_one: seconds of a draft pass over one row.
        pass_all: seconds of a draft pass over the batch (each pass so far).
        margin: minimum relative Theta gain.
        horizon: passes looked ahead (1: does the next pass pay; more: do the next h, for some h).

    Returns:
        (B,) bool: who drafts position j + 1; the predicted relative gain in Theta of drafting on
        (best Theta / Theta now - 1; 0 when nobody does); and how many draft on.
    """
    n, j = conf.shape
    keep = np.zeros(n, np.bool_)
    horizon = min(horizon, prior.shape[1] - j)
    if horizon <= 0:
        return keep, 0.0, 0
    worth = np.zeros((n, horizon))  # (B, H) expected tokens from drafting 1..H more positions
    tau_now = float(n)
    n_now = n
    any_drafting = False
    for r in range(n):
        s = 1.0
        for i in range(j):
            s = s * clip_unit(conf[r, i])
            tau_now += s
        n_now += drafted[r]
        if drafted[r] == j:
            last, p, g = streak * clip_unit(conf[r, j - 1]), s, 0.0
            for h in range(horizon):
                if j + h < budgets[r]:
                    p = p * ((1.0 - streak) * clip_unit(prior[r, j + h]) + last)
                    g += p
                worth[r, h] = g
            any_drafting = any_drafting or worth[r, 0] > 0.0
    if not any_drafting:
        return keep, 0.0, 0
    # best first, ties by row: one int64 sort of (worth, row) keys, worth in steps of 2^-(62 - bits)
    # (finer than any difference that matters; a stable argsort costs twice as much)
    bits = 1
    while (1 << bits) < n:
        bits += 1
    scale = float(1 << (62 - bits))
    keys = np.empty(n, np.int64)
    for r in range(n):
        keys[r] = ((np.int64(scale) - np.int64(worth[r, 0] * scale)) << bits) | r
    keys.sort()
    mask = (1 << bits) - 1
    sunk = j * pass_all
    theta_now = tau_now / (sunk + times[n_now])
    best, best_theta = -1, -np.inf
    rise = max(n - 1, 1)
    for h in range(horizon):
        g = 0.0
        for k in range(n):
            g += worth[keys[k] & mask, h]
            pass_k = pass_one + (pass_all - pass_one) * k / rise  # a pass over k + 1 rows
            th = (tau_now + g) / (sunk + (h + 1) * pass_k + times[n_now + (k + 1) * (h + 1)])
            if th > best_theta:
                best, best_theta = k, th
    if best_theta > theta_now * (1.0 + margin):
        kept = 0
        for k in range(best + 1):
            r = keys[k] & mask
            keep[r] = worth[r, 0] > 0.0
            kept += keep[r]
        return keep, best_theta / theta_now - 1.0, kept
    return keep, 0.0, 0
