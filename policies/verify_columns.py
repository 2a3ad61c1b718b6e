"""The causal verify answers, column by column, compiled (numba): `VerifyColumns`.

The controller asks `verify` once per position j with columns 1..j. `VerifyColumns` answers each
call with the allocation of the columns shown, reusing the step's earlier work: a new column is
merged into the sorted slots, and once an answer has refused a slot worth more than every slot of
the next column it is final for the step. Before reusing anything it checks, value for value, that
the columns its answer rests on are those shown now. The answers equal the numpy reference's,
bit for bit (policies/kernels_reference.py `allocate`, `ColumnAllocator`; tests/policies/test_kernels.py).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit

from specdepth.policies.kernels import ONE_F, clip_unit, first_stop_desc, lengths_into, merge_desc

# VerifyColumns.state: columns pushed, frozen at (0: not), first refused slot, answer valid, slots in the
# pool, columns merged into it, which of the two pools is current, started
_J, _FROZEN, _REFUSED, _VALID, _M, _MERGED, _CUR, _STARTED = range(8)
_SLOTS = 8


@njit(cache=True)
def _same(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)  # NaN matches NaN


@njit(cache=True)
def _verify_call(conf: np.ndarray, drafted: np.ndarray, context_lens: np.ndarray, state: np.ndarray,
                 surv: np.ndarray, q: np.ndarray, raw: np.ndarray, shown: np.ndarray, contexts: np.ndarray,
                 positive: np.ndarray, pools: np.ndarray, lengths: np.ndarray, times: np.ndarray,
                 extra: float, margin: float) -> int:
    """One causal verify call with columns 1..j = conf.shape[1] (see VerifyColumns.answer).

    Returns 0 (lengths written), 1 (the columns shown are not those the state rests on: start
    afresh) or 2 (more slots than `times` prices: price more and call again; nothing changed)."""
    n, j = conf.shape
    seen = state[_FROZEN] or state[_J]  # columns the current answer rests on
    if state[_STARTED]:  # the same step, unless what was shown before differs now
        if seen > j or (not state[_FROZEN] and j > state[_J] + 1):
            return 1
        for r in range(n):
            if context_lens[r] != contexts[r] or min(drafted[r], seen) != shown[r]:
                return 1
            for i in range(seen):
                if not _same(conf[r, i], raw[i, r]):
                    return 1
    else:  # the step's first call: what it reads, it writes first
        contexts[:] = context_lens
        surv[:] = 1.0
        positive[:] = 0
        shown[:] = 0
        state[_STARTED] = 1
    if not state[_FROZEN] and state[_J] < j and (positive.sum() + n * (j - state[_J])) >= times.size:
        return 2
    # push positions state[_J] + 1 .. j (kernels_reference.ColumnAllocator.push)
    while state[_J] < j and not state[_FROZEN]:
        i = state[_J]
        top = 0
        for r in range(n):
            raw[i, r] = conf[r, i]
            c = clip_unit(conf[r, i]) if drafted[r] > i else 0.0
            surv[r] = surv[r] * c
            v = np.int64(surv[r] * ONE_F)
            q[i, r] = v
            top = max(top, v)
        state[_J] = i + 1
        if state[_REFUSED] and state[_VALID] and top < state[_REFUSED]:
            state[_FROZEN] = i + 1  # final: every later slot sorts after one already refused
            break
        for r in range(n):
            positive[r] += q[i, r] > 0
        state[_VALID] = 0
    seen = state[_FROZEN] or state[_J]
    for r in range(n):
        shown[r] = min(drafted[r], seen)
    if state[_VALID]:
        return 0
    # the answer over the columns pushed (kernels_reference.ColumnAllocator.lengths)
    state[_VALID] = 1
    slots = positive.sum()
    flat = 0  # times[0] == ... == times[flat], counted as far as `slots` (see first_stop_desc)
    if not margin:
        while flat < slots and times[flat + 1] + extra == times[0] + extra:
            flat += 1
        if flat == slots:  # all admitted
            lengths[:] = positive
            return 0
    m = state[_M]
    while state[_MERGED] < state[_J]:
        cur = state[_CUR]
        m = merge_desc(pools[cur], m, q[state[_MERGED]], pools[1 - cur])
        state[_CUR] = 1 - cur
        state[_MERGED] += 1
    state[_M] = m
    pool = pools[state[_CUR]]
    k, _ = first_stop_desc(pool, m, n, times, extra, margin, flat)
    state[_REFUSED] = pool[k] if k < m else 0
    lengths_into(q, state[_J], k, pool[k - 1] if k else 0, lengths)
    return 0


class VerifyColumns:
    """One step's causal verify answers: kernels_reference.ColumnAllocator, compiled, with the
    check that each call continues the step's earlier ones. Same answers as `allocate` over the
    columns shown (tests/policies/test_kernels.py).

    Args:
        n_seq: B.
        times: (S+1,) seconds of the step with k = 0..S slots admitted, less `extra`.
        margin: as in `allocate`.
        step_time: seconds with k slots for an int array k, less `extra`, to price past S (None: S
            is enough).
        extra: seconds every step pays on top (the step's sunk draft passes): the step with k
            slots takes times[k] + extra, added where it is read (the same float as adding it to
            every entry first, without building that array every step).
    """

    def __init__(self, n_seq: int, times: np.ndarray, margin: float = 0.0,
                 step_time: Callable[[np.ndarray], np.ndarray] | None = None, extra: float = 0.0) -> None:
        self.n_seq, self.margin, self.extra = n_seq, float(margin), float(extra)
        self.times = np.asarray(times, np.float64)  # (S+1,) step time with k = 0..S slots, less `extra`
        self.step_time = step_time  # prices more slots when a step has more than S
        self.state = np.zeros(_SLOTS, np.int64)
        self._surv = np.ones(n_seq)  # (B,) survival of the last column pushed
        self._q = np.zeros((8, n_seq), np.int64)  # (J, B) fixed-point survivals; grows
        self._raw = np.zeros((8, n_seq))  # (J, B) the confidences shown, as shown
        self._shown = np.zeros(n_seq, np.int64)  # (B,) min(drafted, columns the answer rests on)
        self._contexts = np.zeros(n_seq, np.int64)  # (B,) context lengths shown
        self._positive = np.zeros(n_seq, np.int64)  # (B,) positive slots pushed, per sequence
        self._pools = np.empty((2, 8 * n_seq), np.int64)  # the sorted slots (descending) and a spare
        self._lengths = np.zeros(n_seq, np.int64)

    def reset(self, times: np.ndarray, step_time: Callable[[np.ndarray], np.ndarray] | None = None,
              extra: float = 0.0) -> None:
        """Start a new step with the same B, keeping the buffers (what a step reads, it writes first)."""
        self.times, self.step_time, self.extra = np.asarray(times, np.float64), step_time, float(extra)
        self.state[:] = 0  # not started: the first call sets what it reads (`_verify_call`)

    @property
    def j(self) -> int:
        return int(self.state[_J])

    @property
    def frozen(self) -> int:
        return int(self.state[_FROZEN])

    def _grow(self, depth: int) -> None:
        old = self._q.shape[0]
        new = max(depth, 2 * old)
        self._q = np.concatenate((self._q, np.zeros((new - old, self.n_seq), np.int64)))
        self._raw = np.concatenate((self._raw, np.zeros((new - old, self.n_seq))))
        pools = np.empty((2, new * self.n_seq), np.int64)
        pools[:, : self._pools.shape[1]] = self._pools
        self._pools = pools

    def answer(self, conf: np.ndarray, drafted: np.ndarray, context_lens: np.ndarray) -> np.ndarray | None:
        """Verify lengths over columns 1..j of `conf` (B, j): raw confidences, clipped to [0, 1]
        here, 0 where `drafted` <= the position's index. None if the columns shown differ from
        those the earlier calls rest on (the caller starts a fresh instance).

        Returns:
            (B,) int64 verify lengths (shared with later calls: copy before modifying).
        """
        if conf.shape[1] > self._q.shape[0]:
            self._grow(conf.shape[1])
        while True:
            if not self.state[_VALID]:
                self._lengths = np.empty(self.n_seq, np.int64)  # an answer handed out stays as it was
            status = _verify_call(conf, drafted, context_lens, self.state, self._surv, self._q, self._raw,
                                  self._shown, self._contexts, self._positive, self._pools, self._lengths,
                                  self.times, self.extra, self.margin)
            if status == 0:
                return self._lengths
            if status == 1:
                return None
            if self.step_time is None:
                raise ValueError(f"VerifyColumns: more slots than the {self.times.size - 1} priced")
            size = max(int(self._positive.sum()) + self.n_seq * conf.shape[1] + 1, 2 * self.times.size)
            self.times = np.asarray(self.step_time(np.arange(size)), np.float64)
