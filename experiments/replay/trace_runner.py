"""The trace runner: the step loop's runner in replay, with the models replaced by recorded traces.

A sequence is a trace request at output position t. Its draft chain at t (recorded from the true
prefix) supplies the features each draft pass shows the policy, and `match[t]` how many of the
chain's tokens the target keeps: verifying d accepts min(d, match) and emits that + 1 (DESIGN.md
"Traces and exact replay"). Sampling traces keep each chain position with its recorded
probability 1 - TV(p, q) until the first rejection, drawn once a step (seeded; approximate).
Times come from the cost model, never the wall clock, and advance the simulated clock `now`.

Hybrid (`free=`): a second trace of the same requests, recorded with a model-free drafter, gives
each position a second chain. Each step every sequence's free chain is shown to the policy's
`choose_drafter` (cut to its cap), and the sequences that drop it draft the model's chain; a
sequence's outcome is its chosen chain's match. Only model chains cost draft passes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specdepth.experiments.replay.traces import TraceSet
from specdepth.workers.drafting import KeepFn, draft_loop
from specdepth.workers.padding import free_verify
from specdepth.workers.runner import StepResult, VerifyFn


class _Hybrid:
    """What the engine reads off a live hybrid drafter: it chooses per row, and drafts with a model."""
    name, model_free, chooses = "hybrid", False, True


def check_hybrid(model: TraceSet, free: TraceSet) -> None:
    """Raises ValueError unless `free` is a greedy model-free trace of `model`'s requests (the same
    outputs, request by request) and `model` a greedy draft-model one."""
    from specdepth.workers.drafters.names import MODEL_FREE
    kinds = (model.header.meta.get("drafter", "model"), free.header.meta.get("drafter", "model"))
    if kinds[0] != "model" or kinds[1] not in MODEL_FREE:
        raise ValueError(f"a hybrid replay takes a draft-model trace and a model-free one; got {kinds[0]} and {kinds[1]}")
    if model.header.sampling or free.header.sampling:
        raise ValueError("a hybrid replay takes greedy traces only")
    if len(model) != len(free) or any(len(a.tokens) != len(b.tokens) or (a.tokens != b.tokens).any()
                                      for a, b in zip(model.requests, free.requests)):
        raise ValueError("the model-free trace is not of the same requests: record both with the same "
                         "prompts, --max-new-tokens and --batch")


class TraceRunner:
    """`adaptive.engine.Runner` over traces. A request's `key` is its index in the per-request
    arrays given to `requests` (its trace, output length and context)."""

    vocab_size = 1  # requests carry a one-token placeholder prompt
    max_len = 2**62  # no context limit: a replayed request ends at its output length

    def __init__(self, traces: TraceSet, cost: Any, n_slots: int, k_max: int, seed: int = 0,
                 free: TraceSet | None = None) -> None:
        """`free`: a model-free trace of the same requests, for a hybrid replay (`check_hybrid`)."""
        self.cost, self.n_slots, self.max_depth = cost, n_slots, k_max
        self.free_top1: np.ndarray | None = None  # (P, K) the model-free chains' features (hybrid)
        if free is not None:
            check_hybrid(traces, free)
            self.drafter = _Hybrid()
            self.free_match, self.free_top1 = free.match, free.top1[:, :k_max]
            self.free_ent = free.entropy[:, :k_max]
        self.match, self.top1, self.ent = traces.match, traces.top1[:, :k_max], traces.entropy[:, :k_max]
        self.accept_prob = None if traces.accept_prob is None else traces.accept_prob[:, :k_max]
        self.offsets, self.lengths = traces.offsets, traces.lengths
        self.rng = np.random.default_rng(seed)
        self.req = np.zeros(n_slots, np.int64)  # request index in each slot
        self.pos = np.zeros(n_slots, np.int64)  # its output position t
        self.free = np.ones(n_slots, bool)
        self.now = 0.0  # the simulated clock, seconds
        self.busy = 0.0  # seconds spent in steps
        self.step_tokens = self.wasted = 0  # verified tokens in all, and those rejected
        self._slots = np.zeros(0, np.int64)  # (B,) the step's sequences
        self._match_now: np.ndarray | None = None  # (B,) their outcomes, once drawn

    def requests(self, trace_index: np.ndarray, out_len: np.ndarray, context: np.ndarray) -> None:
        """The per-request arrays (n,): trace request, output length, context (prompt) tokens."""
        self.r_trace, self.r_len, self.r_ctx = trace_index, out_len, context
        self.r_off, self.r_tlen = self.offsets[trace_index], self.lengths[trace_index]

    def clock(self) -> float:
        return self.now

    # ---- the Runner protocol ---------------------------------------------------------------
    def add(self, tokens: list[int], key: Any = None, sampling: Any = None) -> int:
        """A slot for request `key`; `sampling` is the trace's (replay draws acceptance from it)."""
        slot = int(np.flatnonzero(self.free)[0])  # the lowest free slot
        self.free[slot], self.req[slot], self.pos[slot] = False, int(key), 0
        return slot

    def remove(self, slot: int) -> None:
        self.free[slot] = True

    def context_lens(self, slots: np.ndarray) -> np.ndarray:
        """(B,) context tokens; called once a step, before the plan: these are the step's sequences."""
        self._slots, self._match_now = np.asarray(slots), None
        return self.r_ctx[self.req[slots]] + self.pos[slots]

    def oracle_match(self) -> np.ndarray:
        """(B,) the leading draft tokens the target keeps this step, for the step's sequences,
        capped by what each may still emit; drawn once a step (sampling traces)."""
        if self._match_now is None:
            req, t = self.req[self._slots], self.pos[self._slots]
            ptr = self.r_off[req] + t % self.r_tlen[req]  # (B,) flat trace position (wraps)
            room = self.r_len[req] - t - 1  # (B,) tokens that may still be accepted
            self._match_now = np.minimum(self._match(ptr), room)
        return self._match_now

    def step(self, slots: np.ndarray, budgets: np.ndarray, keep_fn: KeepFn | None,
             verify_fn: VerifyFn | None, choose_fn: Any = None, caps: np.ndarray | None = None) -> StepResult:
        B, req, t = len(slots), self.req[slots], self.pos[slots]
        ptr = self.r_off[req] + t % self.r_tlen[req]  # (B,)
        match = self.oracle_match()
        context = int((self.r_ctx[req] + t).sum())
        take = None  # (B,) bool rows that keep the free chain (hybrid)
        if self.free_top1 is not None:
            take, f_top1, f_ent, f_drafted = self._free_chains(ptr, budgets if caps is None else caps, choose_fn)
            budgets = np.where(take, 0, budgets)
            room = self.r_len[req] - t - 1
            match = np.where(take, np.minimum(self.free_match[ptr], room), match)

        def draft_pass(j: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            top1 = self.top1[ptr[rows], j]  # 0 where a model-free drafter's recorded chain ended
            return top1, self.ent[ptr[rows], j], top1 > 0

        dr = draft_loop(budgets, draft_pass, keep_fn)
        drafted, top1 = dr.drafted, dr.top1
        ent = dr.entropy * (np.arange(top1.shape[1]) < drafted[:, None])  # (B, J) 0 past drafted
        if take is not None and take.any():  # the free rows' chains in place of the model's
            J = max(top1.shape[1], f_top1.shape[1])
            top1, ent = _widen(top1, J), _widen(ent, J)
            top1[take], ent[take] = _widen(f_top1, J)[take], _widen(f_ent, J)[take]
            drafted = np.where(take, f_drafted, drafted)
        verify = drafted.copy() if verify_fn is None else np.asarray(verify_fn(top1, ent, drafted), np.int64)
        verify = free_verify(verify, drafted)  # clamped and extended as the live runner does
        accepted = np.minimum(verify, match)
        N = B + int(verify.sum())
        rows_per_pass = (dr.drafted[None, :] > np.arange(dr.passes)[:, None]).sum(1)  # (passes,) rows a pass drafts (model rows)
        draft_s = sum(float(self.cost.draft_time(int(b), context)) for b in rows_per_pass)
        target_s = float(self.cost.target_time(N, context, B))
        self.now += draft_s + target_s
        self.busy += draft_s + target_s
        self.pos[slots] = t + accepted + 1
        self.step_tokens += N
        self.wasted += int((verify - accepted).sum())
        first_s = float(self.cost.draft_time(int(rows_per_pass[0]), context)) if dr.passes else 0.0
        emitted = [[0] * (int(a) + 1) for a in accepted]  # placeholder tokens: only their count matters
        # the decision times are the cost model's too (none): a replay never reads the wall clock
        return StepResult(np.asarray(slots), drafted, verify, accepted, emitted, top1, ent, draft_s, target_s,
                          dr.passes, N, context, first_pass_s=first_s, free=take)

    def _free_chains(self, ptr: np.ndarray, caps: np.ndarray, choose_fn: Any):
        """The free chains at these positions cut to `caps`, and the rows that keep them."""
        K = int(caps.max(initial=0))
        cut = np.arange(K)[None, :] < caps[:, None]  # (B, K)
        f_top1 = self.free_top1[ptr, :K] * cut
        f_drafted = np.cumprod(f_top1 > 0, axis=1).sum(1).astype(np.int64)  # (B,)
        f_top1 = f_top1 * (np.arange(K)[None, :] < f_drafted[:, None])
        f_ent = self.free_ent[ptr, :K] * (f_top1 > 0)
        take = f_drafted > 0 if choose_fn is None else np.asarray(choose_fn(f_top1, f_ent, f_drafted), bool)
        return take, f_top1, f_ent, f_drafted

    def _match(self, ptr: np.ndarray) -> np.ndarray:
        """(B,) how many leading chain tokens the target keeps at these positions: recorded
        (greedy, exact), or drawn once per step for the whole chain from accept_prob (sampling):
        verifying d then keeps min(d, that), as rejection sampling position by position would."""
        if self.accept_prob is None:
            return self.match[ptr]
        ok = self.rng.random((len(ptr), self.max_depth)) < self.accept_prob[ptr]  # (B, K)
        return np.cumprod(ok, axis=1).sum(1).astype(np.int64)


def _widen(a: np.ndarray, J: int) -> np.ndarray:
    """(B, j) -> (B, J) zero-padded on the right (a copy)."""
    out = np.zeros((a.shape[0], J))
    out[:, :a.shape[1]] = a
    return out
