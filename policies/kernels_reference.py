"""The numpy reference of dspark's compiled allocation: the tests' oracle.

`allocate` is the allocation rule of policies/allocation.py written plainly: sort every slot,
compute Theta for every prefix of that order in one vectorised pass, stop at the first slot that
does not raise it. `plan_budgets` is the pre-draft version (the draft's own time is part of the
step); `ColumnAllocator` gives `allocate`'s answer when confidences arrive one position at a time,
as the controller's causal verify calls deliver them. The compiled kernels must give these
answers bit for bit: `plan_kernel` is `plan_budgets`, `VerifyColumns` is `ColumnAllocator`
(tests/policies/test_kernels.py). Nothing outside the tests calls this module.

The sorted values live in a "pool": ascending, ending with B * 2^32 (B >= 1 >= every survival, so
it sorts last), so the cumsum of the pool read backwards is tau for k = 0, 1, 2, ... slots. Slots
with s = 0 can never raise Theta and are left out.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from specdepth.policies.allocation import ONE, fixed_point, lengths_at
from specdepth.policies.base import StepCost

TargetTime = Callable[[np.ndarray, int], "np.ndarray | float"]  # (N array, context tokens) -> seconds

_HORIZON = 128  # `first_stop` looks at this many best slots before the whole pool


def _pool(q_t: np.ndarray) -> np.ndarray:
    """(m+1,) ascending positive slots of a (J, B) fixed-point array, then B * ONE."""
    pool = np.append(q_t[q_t > 0], q_t.shape[1] * ONE)
    pool.sort()
    return pool


def free_slots(times: np.ndarray) -> int:
    """How many slots are admitted whatever their survivals: while the step time stays the same,
    any positive slot raises Theta (tau grows by >= 1 in fixed point, far above rounding).

    Args:
        times: (S+1,) step time with k = 0..S slots.

    Returns:
        F such that times[0] == times[1] == ... == times[F] (bitwise).
    """
    changed = times[1:] != times[:-1]  # (S,)
    first = int(changed.argmax()) if changed.size else 0
    return first if changed.size and changed[first] else times.size - 1


def first_stop(pool: np.ndarray, times: np.ndarray, margin: float = 0.0, free: int = 0) -> tuple[int, float]:
    """How many of the best slots to admit: the prefix before Theta first stops improving.

    Args:
        pool: (m+1,) int64 ascending [s_m, ..., s_1, B] in fixed point (slots > 0).
        times: (>= m+1,) step time in seconds with k = 0..m slots (extra time included).
        margin: a slot is admitted only if it raises Theta by more than this fraction.
        free: `free_slots(times)` (or any smaller number): no stop can come before it.

    Returns:
        (k, Theta_k): the number of slots admitted and the throughput (tokens/s) with them. The
        last admitted slot is pool[-1 - k], the first refused one pool[-2 - k].
    """
    m = pool.size - 1
    if m <= free and not margin:
        return m, float(pool.sum()) / float(times[m]) / ONE
    if free < _HORIZON < m // 4:  # the stop is usually early: try the best slots first
        k, theta = _first_stop(pool[-_HORIZON - 1 :], times, margin)
        if k < _HORIZON:
            return k, theta  # the prefix rule: slots after the stop change nothing
    return _first_stop(pool, times, margin)


def _first_stop(pool: np.ndarray, times: np.ndarray, margin: float) -> tuple[int, float]:
    m = pool.size - 1
    theta = pool[::-1].cumsum() / times[: m + 1]  # (m+1,) tau * ONE / time; exact integer tau
    if m == 0:
        return 0, float(theta[0]) / ONE
    before = theta[:-1] * (1.0 + margin) if margin else theta[:-1]
    better = theta[1:] > before  # (m,) admitting slot k+1 raises Theta
    k = int(better.argmin())  # the first non-improvement
    if better[k]:
        k = m  # every slot improved
    return k, float(theta[k]) / ONE


def allocate(
    survival: np.ndarray,
    target_time: TargetTime,
    context_tokens: int = 0,
    extra_time: float = 0.0,
    margin: float = 0.0,
) -> np.ndarray:
    """Verify lengths maximising Theta by the sorted early-stop rule (see the module docstring).

    Args:
        survival: (B, J) s_{r,j}, non-increasing in j, zero past each sequence's drafted length.
        target_time: the cost callable (`StepCost.target_time`), vectorised over N.
        context_tokens: KV tokens in the batch, passed to `target_time`.
        extra_time: seconds already part of the step whatever is verified (e.g. drafting).
        margin: minimum relative Theta gain to admit a slot.

    Returns:
        (B,) int64 verify lengths d_r (0 = verify nothing; r still emits its one token).
    """
    q_t = fixed_point(survival)  # (J, B)
    n = q_t.shape[1]
    if n == 0:
        return np.zeros(0, np.int64)
    pool = _pool(q_t)  # (m+1,)
    times = extra_time + np.asarray(target_time(n + np.arange(pool.size), context_tokens), np.float64)
    k, _ = first_stop(pool, times, margin)
    return lengths_at(q_t, k, pool[-1 - k])


def _tau_upper(q_t: np.ndarray, head: int = _HORIZON) -> np.ndarray:
    """(M+1,) tau with the k best slots of any depth (fixed point), k = 0..M: exact up to k = head + 1,
    an upper bound beyond (no later slot is worth more than the head's last). Enough for the depth
    search's stopping bound, and an O(M) partition instead of a sort of all M slots."""
    pos = q_t[q_t > 0]
    start = q_t.shape[1] * ONE
    if pos.size <= 2 * head:
        return np.concatenate(([start], start + np.cumsum(np.sort(pos)[::-1])))
    top = np.partition(pos, pos.size - head - 1)[-head - 1:]  # the head + 1 largest
    top.sort()
    tau = np.empty(pos.size + 1, np.int64)
    tau[0] = start
    tau[1 : head + 2] = start + np.cumsum(top[::-1])
    tau[head + 2 :] = tau[head + 1] + int(top[0]) * np.arange(1, pos.size - head, dtype=np.int64)
    return tau


def plan_budgets(
    prior_survival: np.ndarray,
    cost: StepCost,
    context_tokens: int = 0,
    batch: int | None = None,
    margin: float = 0.0,
    price_draft: bool = True,
    target_by_n: np.ndarray | None = None,
    pass_time: float | None = None,
) -> np.ndarray:
    """Pre-draft budgets L_r: the allocation above, with the draft's depth priced in.

    For each depth D = 0..K the draft runs D sequential passes (D * draft_time(batch) seconds); the
    slots with j <= D are allocated by the sorted early-stop rule on the predicted survivals with that
    time as `extra`, and the D whose allocation has the best Theta wins (ties: the smaller D). When
    the batch alone saturates the compute knee nothing pays and every budget is 0.

    Shortcuts that do not change the answer: a depth whose slots all fit where the step time is flat
    admits them all (no sort needed); and the search ends once no deeper depth can win: tau with k
    slots is at most tau_all[k], with the k best slots of any depth (or any upper bound of it,
    `_tau_upper`), so for every D' >= D, Theta_D' <= max_k tau_all[k] / (D c + T_k).

    Args:
        prior_survival: (B, K) predicted survivals from history (non-increasing in j).
        cost: the step-time model.
        context_tokens: KV tokens in the batch (for a context-aware cost).
        batch: sequences in one draft pass (default B).
        margin: minimum relative Theta gain to admit a slot.
        price_draft: False ignores the draft's time (an ablation).
        target_by_n: optional (>= B (K + 1) + 1,) `cost.target_time(N)` for N = 0, 1, ... already
            computed by the caller (the same numbers; saves pricing them again).
        pass_time: optional `cost.draft_time(batch)`, likewise.

    Returns:
        (B,) int64 draft budgets, each <= K.
    """
    q_t = fixed_point(prior_survival)  # (K, B)
    depth, n = q_t.shape
    if depth == 0 or n == 0:
        return np.zeros(n, np.int64)
    n_pos = (q_t > 0).sum(axis=1)  # (K,) positive slots per position (non-increasing)
    slots = np.cumsum(n_pos)  # (K,) m_D: slots with j <= D
    tau_depth = n * ONE + np.cumsum(q_t.sum(axis=1))  # (K,) tau with every slot of j <= D, fixed point
    if target_by_n is not None and target_by_n.size > n + int(slots[-1]):
        target = target_by_n[n : n + int(slots[-1]) + 1]
    else:
        target = np.asarray(cost.target_time(n + np.arange(int(slots[-1]) + 1), context_tokens), np.float64)
    free = free_slots(target)
    if not price_draft:
        pass_time = 0.0
    elif pass_time is None:
        pass_time = cost.draft_time(n if batch is None else batch, context_tokens)
    best_theta, best_depth, best_k = n / float(target[0]), 0, 0
    pool, best_pool, tau_all = None, None, None  # sorted slots of depths 1..D, and of all depths
    saturated = False  # the last depth refused slots, or did not win: worth checking the bound
    for d in range(1, depth + 1):
        m = int(slots[d - 1])
        if n_pos[d - 1] == 0:
            break  # survival is non-increasing in j: nothing deeper either
        if saturated or best_depth < d - 1:  # can any deeper depth still win?
            if tau_all is None:
                tau_all = _tau_upper(q_t)  # (M+1,) at least tau with the k best slots of any depth
            if (tau_all / (target + d * pass_time)).max() <= best_theta * ONE:
                break
        if m <= free and not margin:  # all slots admitted: no order needed
            k, theta = m, float(tau_depth[d - 1]) / float(target[m] + d * pass_time) / ONE
        else:
            if pool is None:
                pool = _pool(q_t[:d])
            else:
                col = q_t[d - 1]
                pool = np.concatenate((col[col > 0], pool))
                pool.sort(kind="stable")  # an unsorted run before a sorted one: a sort and a merge
            k, theta = first_stop(pool, target[: m + 1] + d * pass_time, margin, free)
        saturated = k < m
        if theta > best_theta:
            best_theta, best_depth, best_k, best_pool = theta, d, k, pool
    if best_k == 0:
        return np.zeros(n, np.int64)
    if best_k == int(slots[best_depth - 1]):  # all admitted (the pool may not even exist)
        return (q_t[:best_depth] > 0).sum(axis=0, dtype=np.int64)
    return lengths_at(q_t[:best_depth], best_k, best_pool[-1 - best_k])


class ColumnAllocator:
    """`allocate` over confidences that arrive one position at a time (the causal verify calls).

    After `push`ing confidences c_1..c_j, `lengths()` equals `allocate(cumprod(c), ...)` over those
    j columns with the same step times, exactly: the survivals are the same products and the sorted
    slots the same multiset, so every number downstream is the same. Work is saved three ways, none
    of which changes an answer: while every slot fits where the step time is flat, all are admitted
    and nothing is sorted; a new column is merged into the sorted pool rather than sorting it all
    again; and once an answer has refused a slot worth more than every slot of the next column, it
    is final for the step (those slots sort after the refused one, and every later column is worth
    even less, row by row). `frozen` then says on how many columns the final answer rests.

    Args:
        n_seq: B.
        step_time: seconds of the step with k slots admitted, for an int array k (elementwise).
        margin: as in `allocate`.
        slots_hint: how many slots to price up front (more are priced when needed).
    """

    def __init__(self, n_seq: int, step_time: Callable[[np.ndarray], np.ndarray], margin: float = 0.0,
                 slots_hint: int = 0) -> None:
        self.n_seq, self.step_time, self.margin = n_seq, step_time, margin
        self.times = np.zeros(0)  # (S+1,) step time with k = 0..S slots
        self.free = -1  # up to this many slots are all admitted (see `free_slots`)
        self._price(max(slots_hint, n_seq))
        self.surv_t = np.ones((9, n_seq))  # (1 + J, B) survivals, row 0 = 1 (nothing drafted); grows
        self.q_t = np.zeros((8, n_seq), np.int64)  # (J, B) the same in fixed point
        self.j = 0  # columns pushed
        self.frozen = 0  # > 0: the answer is final; it depends on columns 1..frozen only
        self.positive = np.zeros(n_seq, np.int64)  # (B,) positive slots pushed, per sequence
        self._pool = np.array([n_seq * ONE], np.int64)  # ascending sorted slots, then B
        self._merged = 0  # columns whose slots are in the pool
        self._refused = 0  # the first slot the current answer refused, fixed point (0: none)
        self._lengths: np.ndarray | None = None  # the current answer, once computed

    def _price(self, slots: int) -> None:
        """Make `times` cover at least `slots` slots."""
        if self.times.size <= slots:
            size = max(slots + 1, 2 * self.times.size)
            self.times = np.asarray(self.step_time(np.arange(size)), np.float64)
            self.free = -1 if self.margin else free_slots(self.times)

    def push(self, conf: np.ndarray) -> None:
        """Add position j + 1: (B,) confidences c_{r,j+1} in [0, 1] (0 where not drafted)."""
        if self.frozen:
            return
        if self.j == self.q_t.shape[0]:  # grow the position capacity
            self.surv_t = np.concatenate((self.surv_t, np.ones_like(self.surv_t[1:])))
            self.q_t = np.concatenate((self.q_t, np.zeros_like(self.q_t)))
        surv = np.multiply(self.surv_t[self.j], conf, out=self.surv_t[self.j + 1])  # s_j = s_{j-1} c_j
        q = np.multiply(surv, ONE, out=self.q_t[self.j], casting="unsafe")  # floor, as `fixed_point`
        self.j += 1
        if self._refused and self._lengths is not None and q.max() < self._refused:
            self.frozen = self.j
            return
        self.positive = self.positive + (q > 0)  # a new array: an answer handed out stays as it was
        self._lengths = None

    def lengths(self) -> np.ndarray:
        """(B,) int64 verify lengths over the columns pushed so far (shared: do not modify)."""
        if self._lengths is None:
            slots = int(self.positive.sum())
            self._price(slots)
            if slots <= self.free:  # all admitted
                self._lengths = self.positive
                return self._lengths
            if self._merged < self.j:
                new = self.q_t[self._merged : self.j]
                self._pool = np.concatenate((new[new > 0], self._pool))
                self._pool.sort(kind="stable")  # unsorted slots before a sorted run: a sort and a merge
                self._merged = self.j
            pool = self._pool
            k, _ = first_stop(pool, self.times, self.margin, self.free)
            self._refused = int(pool[-2 - k]) if k + 1 < pool.size else 0
            self._lengths = lengths_at(self.q_t[: self.j], k, pool[-1 - k])
        return self._lengths
