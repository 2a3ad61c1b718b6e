"""The step loop: continuous batching around a runner, depths from a Controller.

One loop for every way specdepth runs: in process over a `PairRunner`, inside a Ray replica
(adaptive/replicas/replica.py), and in replay over a trace runner (experiments/replay/simulator.py); the `Runner`
protocol is all it needs of them. Requests wait in a queue and take a free slot as others finish.
Each step: the controller plans draft budgets (capped by what each request may still emit), the
runner drafts, verifies and commits, emitted tokens stream to their requests (`on_token`), the
controller learns from the step, and finished requests leave. A request that fails (bad input,
NaN logits, an invalid depth from a plain depth function) ends with an error naming it; the
others go on.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

import numpy as np

from specdepth.adaptive.controller import Controller, StepRecord
from specdepth.workers.drafting import KeepFn
from specdepth.workers.runner import StepResult, VerifyFn
from specdepth.workers.sampler import SamplingParams


class Runner(Protocol):
    """What the step loop drives: slots of sequences, stepped together."""

    max_depth: int  # K, the largest draft budget
    max_len: int  # context limit in tokens
    vocab_size: int
    n_slots: int  # sequences held at once

    def add(self, tokens: list[int], key: Any = None, sampling: Optional[SamplingParams] = None) -> int:
        """Claim a slot for a sequence (prefilled); `key`: the request's `Request.key`;
        `sampling`: its own settings (None: the runner's)."""

    def remove(self, slot: int) -> None: ...

    def context_lens(self, slots: np.ndarray) -> np.ndarray:
        """(B,) committed tokens of these sequences; called once a step, before the plan."""

    def step(self, slots: np.ndarray, budgets: np.ndarray, keep_fn: Optional[KeepFn],
             verify_fn: Optional[VerifyFn]) -> StepResult: ...


class RequestError(ValueError):
    """A request that cannot be served; the message names the request."""

    def __init__(self, request_id: str, msg: str) -> None:
        super().__init__(f"request {request_id!r}: {msg}")
        self.request_id = request_id


@dataclass
class Request:
    request_id: str
    prompt_ids: list[int]
    max_new_tokens: int = 64
    ignore_eos: bool = False  # generate exactly max_new_tokens (benchmarks)
    on_token: Optional[Callable[[str, list[int]], None]] = None  # streaming callback
    key: Any = None  # what the runner knows the request by besides its tokens (replay: its trace)
    sampling: Optional[SamplingParams] = None  # its own temperature, top-p and seed (None: the runner's)


@dataclass
class RequestOutput:
    request_id: str
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    finish_reason: Optional[str] = None  # "length" | "eos" | "context" | "error"
    error: Optional[Exception] = None
    steps: int = 0  # sequence-steps this request took part in
    verified: int = 0  # draft tokens verified
    accepted: int = 0  # draft tokens accepted
    t_submit: float = 0.0
    t_first: float = 0.0
    t_done: float = 0.0

    @classmethod
    def empty(cls, max_depth: int) -> "EngineStats":
        """No steps yet, with per-position counts for draft positions 1..max_depth."""
        return cls(pos_verified=np.zeros(max_depth, np.int64), pos_accepted=np.zeros(max_depth, np.int64))

    @property
    def acceptance_length(self) -> float:
        """Mean emitted tokens per step (accepted + the target's own token)."""
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0


# depth_fn(seq_ids, context_lens) -> (B,) budgets: a plain alternative to a Controller, for tests
DepthFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass
class EngineStats:
    steps: int = 0
    seq_steps: int = 0
    emitted: int = 0
    draft_s: float = 0.0
    target_s: float = 0.0
    control_s: float = 0.0  # the controller: plan, keep_drafting and verify callbacks, observe
    prefill_s: float = 0.0  # admission: the prompts' prefill passes
    sample_s: float = 0.0  # the verdict: sampling and the acceptance rule (`StepResult.sample_s`)
    commit_s: float = 0.0  # the commit: the runner's (tokens, KV, drafter) and the engine's (outputs, stops)
    # the controller's benchmark bookkeeping (`Controller.cost_track`), left out of control_s and
    # of the time outside the passes: a deployed engine does not do it (a benchmark's wall
    # clock subtracts it too)
    track_s: float = 0.0
    pos_verified: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (K,)
    pos_accepted: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (K,)
    # per step: (N step tokens, context tokens, draft_s, target_s, draft passes, batch size, seconds
    # outside the model passes (nan where not measured))
    step_log: list[tuple[int, int, float, float, int, int, float]] = field(default_factory=list)

    @classmethod
    def empty(cls, max_depth: int) -> "EngineStats":
        """No steps yet, with per-position counts for draft positions 1..max_depth."""
        return cls(pos_verified=np.zeros(max_depth, np.int64), pos_accepted=np.zeros(max_depth, np.int64))

    @property
    def acceptance_length(self) -> float:
        return self.emitted / self.seq_steps if self.seq_steps else 0.0

    def add(self, other: "EngineStats") -> None:
        """Count another loop's steps in these (a replica's round, in the cluster's totals)."""
        for name in ("steps", "seq_steps", "emitted", "draft_s", "target_s", "control_s", "prefill_s", "sample_s",
                     "commit_s", "track_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        K = max(len(self.pos_verified), len(other.pos_verified))
        for name in ("pos_verified", "pos_accepted"):
            mine, theirs = getattr(self, name), getattr(other, name)
            total = np.zeros(K, np.int64)
            total[:len(mine)] += mine
            total[:len(theirs)] += theirs
            setattr(self, name, total)
        self.step_log.extend(other.step_log)


def validate_request(req: Request, max_len: int, vocab_size: int) -> None:
    """Raises RequestError naming the request for input that cannot be served."""
    rid, ids = req.request_id, req.prompt_ids
    if not ids:
        raise RequestError(rid, "empty prompt")
    if len(ids) >= max_len:
        raise RequestError(rid, f"prompt of {len(ids)} tokens does not fit the context of {max_len} tokens")
    bad = [t for t in ids if not 0 <= int(t) < vocab_size]
    if bad:
        raise RequestError(rid, f"token ids out of range [0, {vocab_size}): {bad[:5]}")
    if req.max_new_tokens <= 0:
        raise RequestError(rid, f"max_new_tokens must be > 0, got {req.max_new_tokens}")


def submit_all(engine, requests: list[Request]) -> list[RequestOutput]:
    """Submit every request to `engine` (in-process or Ray); invalid ones come back failed, named."""
    outs = []
    for req in requests:
        try:
            outs.append(engine.submit(req))
        except RequestError as e:
            outs.append(RequestOutput(req.request_id, list(req.prompt_ids), finish_reason="error", error=e))
    return outs


def count_positions(st: EngineStats, verified: np.ndarray, accepted: np.ndarray) -> None:
    """Per-position counts of one step's sequences (B,) each: position j + 1 was in play where the
    j before it were accepted (verified past j, accepted at least j: conditional counts), and
    accepted where a > j. One array pass a step instead of a few per sequence."""
    K = len(st.pos_verified)
    j = np.arange(K)  # (K,)
    st.pos_verified += (np.minimum(verified, accepted + 1)[:, None] > j).sum(0)  # (B, K) -> (K,)
    st.pos_accepted += (accepted[:, None] > j).sum(0)


def commit_step(req: Request, out: RequestOutput, emitted: list[int], verified: int, accepted: int,
                stats: list[EngineStats], eos_ids: set[int], now: float) -> str | None:
    """Count one sequence-step and stream its emitted tokens to the request (its positions are
    counted for the whole step, `count_positions`).

    Emitted tokens past max_new_tokens or past an EOS are dropped (unless ignore_eos). Returns the
    finish reason ("eos" or "length") or None.
    """
    out.steps += 1
    out.verified += verified
    out.accepted += accepted
    for st in stats:
        st.seq_steps += 1
    new = emitted[: req.max_new_tokens - len(out.output_ids)]
    reason = None
    if not req.ignore_eos:
        for i, t in enumerate(new):
            if t in eos_ids:
                new, reason = new[: i + 1], "eos"
                break
    if new and not out.output_ids:
        out.t_first = now
    out.output_ids.extend(new)
    for st in stats:
        st.emitted += len(new)
    if req.on_token is not None and new:
        req.on_token(req.request_id, new)
    if reason is None and len(out.output_ids) >= req.max_new_tokens:
        reason = "length"
    return reason


class Engine:
    def __init__(self, runner: Runner, depth: Controller | DepthFn, eos_ids: tuple[int, ...] = (),
                 max_batch: int | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        """
        Args:
            runner: runs the steps (`Runner`).
            depth: a Controller, or a plain depth function (tests).
            eos_ids: end-of-sequence ids: a request ends at the first one (unless ignore_eos).
            max_batch: sequences stepped together (default: the runner's slots).
            clock: the requests' timestamps (replay: its simulated clock).
        """
        self.runner = runner
        self.depth = depth
        drafter = getattr(runner, "drafter", None)
        if isinstance(depth, Controller) and getattr(drafter, "model_free", False):
            depth.draft_is_free()
        self.chooses = isinstance(depth, Controller) and getattr(drafter, "chooses", False)
        if self.chooses:
            depth.drafts_hybrid()
        self.eos_ids = set(eos_ids)
        self.clock = clock
        self.max_batch = min(max_batch or runner.n_slots, runner.n_slots)
        self.queue: deque[tuple[Request, RequestOutput, int]] = deque()
        self.running: dict[int, tuple[Request, RequestOutput]] = {}  # slot -> request
        self.step_no = 0
        self._overhead: tuple[float, int] | None = None  # the last step's time outside the passes; its draft passes
        self._prev_step_s = 0.0  # the last step's whole wall time, admission apart (`StepRecord.prev_step_s`)
        self.seq_no = 0
        self.stats = EngineStats.empty(runner.max_depth)
        self._ids: dict[int, int] = {}  # slot -> sequence id (stable per request)
        self.finished_ids: list[int] = []  # sequence ids that left in the last step
        self.last_record: StepRecord | None = None  # the last step the controller learned from
        self.closed = False  # every request has been submitted (`run`): once none waits, the run is closing

    # ---- admission ----------------------------------------------------------------------------
    def validate(self, req: Request) -> None:
        validate_request(req, self.runner.max_len, self.runner.vocab_size)

    def submit(self, req: Request, seq_id: int | None = None) -> RequestOutput:
        """Queue a request; `seq_id` names its sequence (default: the next number)."""
        out = RequestOutput(req.request_id, list(req.prompt_ids), t_submit=self.clock())
        self.validate(req)
        if seq_id is None:
            seq_id, self.seq_no = self.seq_no, self.seq_no + 1
        self.queue.append((req, out, seq_id))
        return out

    def cancel(self, seq_id: int) -> bool:
        """End a sequence now (finish reason "cancelled"); False if it is not here."""
        for i, (_, out, sid) in enumerate(self.queue):
            if sid == seq_id:
                del self.queue[i]
                out.finish_reason, out.t_done = "cancelled", self.clock()
                return True
        slot = next((s for s, sid in self._ids.items() if sid == seq_id), None)
        if slot is None:
            return False
        self._finish(slot, "cancelled")
        return True

    def _admit(self) -> None:
        """Waiting requests into free slots; a runner with `add_many` prefills them in one pass."""
        batch = []
        while self.queue and len(self.running) + len(batch) < self.max_batch:
            batch.append(self.queue.popleft())
        if not batch:
            return
        t = time.perf_counter()
        add_many = getattr(self.runner, "add_many", None)
        if add_many is not None and len(batch) > 1:
            slots = add_many([list(req.prompt_ids) for req, _, _ in batch], [req.sampling for req, _, _ in batch])
        else:
            slots = [self.runner.add(list(req.prompt_ids), req.key, req.sampling) for req, _, _ in batch]
        for slot, (req, out, seq_id) in zip(slots, batch):
            self.running[slot] = (req, out)
            self._ids[slot] = seq_id
        self.stats.prefill_s += time.perf_counter() - t

    def _finish(self, slot: int, reason: str, error: Exception | None = None) -> None:
        req, out = self.running.pop(slot)
        out.finish_reason, out.error, out.t_done = reason, error, self.clock()
        self.runner.remove(slot)
        self.finished_ids.append(self._ids.pop(slot))

    # ---- the loop -----------------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.queue or self.running)

    def step(self) -> list[int]:
        """Admit, then one speculative step over the running sequences. Returns the sequence ids
        that left (finished, failed or cancelled) since the last step."""
        self._admit()
        finished, self.finished_ids = self.finished_ids, []
        if not self.running:
            return finished
        self.finished_ids = finished  # cancellations between steps leave with this step
        t_step = time.perf_counter()  # the step's wall time, admission (prefill) apart
        slots = np.array(sorted(self.running), dtype=np.int64)
        seq_ids = np.array([self._ids[s] for s in slots], dtype=np.int64)
        ctx_lens = np.asarray(self.runner.context_lens(slots), np.int64)
        room = np.array([self.running[s][0].max_new_tokens - len(self.running[s][1].output_ids) for s in slots])
        room = np.minimum(room, self.runner.max_len - ctx_lens) - 1  # tokens a step may still accept
        t_plan = time.perf_counter()
        closing = room + 1 if self.closed and not self.queue else None  # (B,) tokens left (PlanContext.closing)
        budgets = self._budgets(slots, seq_ids, ctx_lens, closing)
        t_plan = time.perf_counter() - t_plan
        budgets = np.minimum(budgets, np.maximum(room, 0))  # never draft past what can be emitted
        live = np.array([s in self.running for s in slots])
        slots, seq_ids, ctx_lens, budgets = slots[live], seq_ids[live], ctx_lens[live], budgets[live]
        if not len(slots):
            return self._end_step()
        ctl = self.depth if isinstance(self.depth, Controller) else None
        # a model-free draft costs nothing to extend: drafted to its budgets, `verify` alone decides
        asks_keep = ctl is not None and not ctl.free_draft
        keep = ctl.keep_fn(self.step_no, seq_ids, budgets) if asks_keep else None
        verify = ctl.verify_fn(self.step_no, seq_ids, ctx_lens) if ctl else None
        if self.chooses:  # a hybrid drafter: the model-free draft (to the room left, for a policy
            # that chooses; else to the budgets), then the choice
            caps = np.clip(room[live], 0, self.runner.max_depth) if ctl.policy.overrides("choose_drafter") else None
            if caps is not None and not ctl.proposes_free(self.step_no):
                caps = np.zeros_like(caps)  # a plain step: the budgets (0 where the plan drafts nothing) alone
            res = self.runner.step(slots, budgets, keep, verify, ctl.choose_fn(self.step_no, seq_ids, ctx_lens, budgets),
                                   caps)
        else:
            res = self.runner.step(slots, budgets, keep, verify)
        t_commit = time.perf_counter()
        self._commit(res, ctx_lens)
        t_obs, tracked = time.perf_counter(), 0.0
        if ctl:
            tracked = ctl.track_s
            over_s, over_passes = self._overhead or (None, 0)
            self.last_record = StepRecord(self.step_no, seq_ids, ctx_lens, budgets, res,
                                          np.array(self.finished_ids, dtype=np.int64), over_s, over_passes,
                                          prev_step_s=self._prev_step_s)
            ctl.observe(self.last_record)
            tracked = ctl.track_s - tracked
        st = self.stats
        st.steps += 1
        st.draft_s += res.draft_s
        st.target_s += res.target_s
        st.sample_s += res.sample_s
        st.commit_s += res.commit_s + t_obs - t_commit
        st.control_s += t_plan + res.policy_s + time.perf_counter() - t_obs - tracked
        st.track_s += tracked
        # time outside the model passes (scheduling, sampling, bookkeeping, the controller), reported
        # to the cost model at the next step (this one's observe is part of it)
        self._overhead = (max(time.perf_counter() - t_step - res.draft_s - res.target_s - tracked, 0.0), res.draft_passes)
        st.step_log.append((res.step_tokens, res.context_tokens, res.draft_s, res.target_s, res.draft_passes,
                            len(res.slots), self._overhead[0]))
        self.step_no += 1
        self._prev_step_s = time.perf_counter() - t_step - tracked
        return self._end_step()

    def _end_step(self) -> list[int]:
        finished, self.finished_ids = self.finished_ids, []
        return finished

    def _budgets(self, slots: np.ndarray, seq_ids: np.ndarray, ctx_lens: np.ndarray,
                 closing: np.ndarray | None) -> np.ndarray:
        if isinstance(self.depth, Controller):
            return self.depth.plan(self.step_no, seq_ids, ctx_lens, closing)
        raw = np.asarray(self.depth(seq_ids, ctx_lens)).reshape(-1)
        K = self.runner.max_depth
        budgets = np.zeros(len(slots), np.int64)
        for r, s in enumerate(slots):
            v = raw[r] if r < len(raw) else np.nan
            if not (np.isfinite(v) and float(v).is_integer() and 0 <= v <= K):
                self._finish(int(s), "error", RequestError(self.running[s][0].request_id,
                                                           f"depth {v} outside [0, {K}]"))
            else:
                budgets[r] = int(v)
        return budgets

    def _commit(self, res: StepResult, ctx_lens: np.ndarray) -> None:
        now = self.clock()
        st = self.stats
        ok = np.ones(len(res.slots), bool)
        ok[list(res.failed)] = False
        count_positions(st, np.asarray(res.verified)[ok], np.asarray(res.accepted)[ok])
        for r, s in enumerate(res.slots):
            req, out = self.running[s]
            if r in res.failed:
                self._finish(int(s), "error", RequestError(req.request_id, str(res.failed[r])))
                continue
            reason = commit_step(req, out, res.emitted[r], int(res.verified[r]), int(res.accepted[r]), [st],
                                 self.eos_ids, now)
            if reason is None and ctx_lens[r] + len(res.emitted[r]) >= self.runner.max_len:
                reason = "context"
            if reason:
                self._finish(int(s), reason)

    def warm_up(self, prompt_ids: list[int], tokens: int = 8) -> None:
        """One throwaway request through this runner with a copy of this engine's controller: the
        compiled kernels load and the passes pay their first calls before anything is timed or
        served (~0.4 s on the bundled pair here), a runner with `warm_up` builds its kernels for
        every pass width, and the acceptance model's refit kernel (which the request may not reach)
        loads. This engine's state and statistics are untouched."""
        runner_warm_up = getattr(self.runner, "warm_up", None)
        if runner_warm_up is not None:
            runner_warm_up()
        acc_warm_up = getattr(getattr(self.depth, "acceptance", None), "warm_up", None)
        if acc_warm_up is not None:
            acc_warm_up()  # its refit's kernel, which the short request below may not reach
        try:
            depth = copy.deepcopy(self.depth) if isinstance(self.depth, Controller) else self.depth
        except Exception:  # a policy that cannot be copied (a user's, holding a resource): no warm-up
            return
        Engine(self.runner, depth, max_batch=1).run([Request("warm-up", list(prompt_ids), tokens, ignore_eos=True)])

    def run(self, requests: list[Request], progress: Callable[[int], None] | None = None) -> list[RequestOutput]:
        """Serve all requests to completion; invalid ones come back with their error set. No other
        request comes during the run, so it is closing once none waits (`PlanContext.closing`)."""
        outs = submit_all(self, requests)
        closed, self.closed = self.closed, True
        try:
            while self.has_work():
                before = self.stats.emitted
                self.step()
                if progress:
                    progress(self.stats.emitted - before)
        finally:
            self.closed = closed
        return outs
