"""The replay simulator: any depth policy, on recorded traces, at any load, on any cost model.

What happens is the live engine's step, with the models replaced by the trace (DESIGN.md
"Traces and exact replay"). Per step, over the running sequences (ordered by slot, as live):

1. `Controller.plan` -> budgets L_r (the real controller: validation, clamping, fallbacks),
   capped by the tokens each request may still emit (room = remaining - 1), as the engine does;
2. drafting: the recorded chain at each sequence's position t provides top1/entropy; `keep_fn` is
   asked after every pass exactly as the runner asks it;
3. the controller's causal `verify_fn` -> d_r;
4. outcome: a_r = min(d_r, match), match = the recorded match[t] for greedy traces (exact); for
   sampling traces each chain position is kept with its recorded probability 1 - TV(p, q) until the
   first rejection, drawn before the step (seeded; approximate). The oracle is told this match.
5. time from the cost model, never the wall clock: max drafted length x draft_time(B, ctx) +
   target_time(N, ctx), ctx = the batch's context tokens; `Controller.observe` (learn_cost=False)
   teaches the acceptance model from the recorded features and the outcome.

Load: a closed loop of C clients (a finished request is replaced at once, requests cycle through
the trace set in order; measured until the first finish that can no longer be replaced, so the
batch holds C throughout, or drained with `drain=True`), or an arrival trace (Azure format:
arrivals, context and output lengths from the CSV; acceptance from the traces, round-robin; output
positions past a trace's end wrap around to its start). Continuous batching up to `max_batch`.
Prefill is not modelled: TTFT is queueing plus the first decode step. A request ends with its
recorded output (EOS included); live, a step may also accept draft tokens past an EOS and drop
them, so for requests that end at EOS the last step's accepted count can differ from live.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specdepth.adaptive.acceptance import AcceptanceModel
from specdepth.adaptive.controller import Controller
from specdepth.adaptive.cost_model import CostModel, parse_cost
from specdepth.experiments.traces import TraceSet
from specdepth.policies.base import DepthPolicy
from specdepth.policies.registry import make_policy
from specdepth.workers.padding import free_verify

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "azure-llm-2023"
AZURE_NAMES = {"code": "AzureLLMInferenceTrace_code.csv", "conv": "AzureLLMInferenceTrace_conv.csv"}


# ---- arrival traces ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Arrivals:
    times: np.ndarray  # (n,) float64 seconds since the first arrival
    context: np.ndarray  # (n,) int64 context (prompt) tokens
    generated: np.ndarray  # (n,) int64 output tokens
    source: str


def resolve_arrivals(path: str | Path) -> Path:
    """A CSV path as given, or `code` / `conv` / a file name in ../shared/data/azure-llm-2023/."""
    p = Path(path)
    if p.exists():
        return p
    shared = SHARED_DATA / AZURE_NAMES.get(str(path), p.name)
    if shared.exists():
        return shared
    raise FileNotFoundError(f"no arrival trace {str(path)!r} (nor in {SHARED_DATA})")


def _seconds(stamp: str) -> float:
    """'YYYY-MM-DD HH:MM:SS.fffffff' (any number of fractional digits) -> POSIX seconds."""
    day, _, clock = stamp.strip().partition(" ")
    whole, _, frac = clock.partition(".")
    t = datetime.datetime.fromisoformat(f"{day} {whole}").replace(tzinfo=datetime.timezone.utc)
    return t.timestamp() + (float(f"0.{frac}") if frac else 0.0)


def load_arrivals(path: str | Path, max_requests: int | None = None) -> Arrivals:
    """Read an Azure LLM inference trace (`TIMESTAMP,ContextTokens,GeneratedTokens`).

    Args:
        path: the CSV, or a name `resolve_arrivals` knows.
        max_requests: keep the first N rows (by time).
    Raises:
        ValueError: naming file and line, for a bad header or row; FileNotFoundError.
    """
    p = resolve_arrivals(path)
    rows: list[tuple[float, int, int]] = []
    with open(p, encoding="utf-8") as f:
        head = f.readline().strip().split(",")
        if head != ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]:
            raise ValueError(f"{p}:1: expected header TIMESTAMP,ContextTokens,GeneratedTokens, got {head}")
        for n, line in enumerate(f, 2):
            if not line.strip():
                continue
            try:
                ts, ctx, gen = line.strip().split(",")
                rows.append((_seconds(ts), int(ctx), int(gen)))
            except ValueError as e:
                raise ValueError(f"{p}:{n}: bad row {line.strip()!r} ({e})") from None
            if max_requests and len(rows) >= max_requests:
                break
    if not rows:
        raise ValueError(f"{p}: no requests")
    arr = np.array(rows, dtype=np.float64)
    arr = arr[np.argsort(arr[:, 0], kind="stable")]
    return Arrivals(arr[:, 0] - arr[0, 0], arr[:, 1].astype(np.int64), arr[:, 2].astype(np.int64), p.name)


# ---- results ------------------------------------------------------------------------------------
@dataclass
class ReplayResult:
    metrics: dict[str, Any]  # the reported figures (see `METRICS`)
    trace_index: np.ndarray  # (n,) int64: trace request of each simulated request (admission order)
    steps: np.ndarray  # (n,) int64: sequence-steps each request took part in
    accepted: np.ndarray  # (n,) int64: draft tokens accepted per request
    emitted: np.ndarray  # (n,) int64: tokens emitted per request (within the measured window)
    finished: np.ndarray  # (n,) bool: the request completed


METRICS = ("goodput_tok_s", "acceptance_length", "mean_step_s", "tpot_p50_s", "tpot_p99_s", "ttft_p50_s",
           "wasted_verify_frac", "flops_per_token_vs_off", "steps", "seq_steps", "fallbacks")


class _OracleFeed(DepthPolicy):
    """Hands the replay's true match lengths to a policy that asks for them (`needs_oracle_match`)
    in `PlanContext.oracle_match`; everything else goes through the Controller untouched."""

    def __init__(self, inner: DepthPolicy) -> None:
        if any(type(inner).overrides(h) for h in ("keep_drafting", "verify")):
            raise ValueError(f"{inner.name}: a policy fed oracle_match may only override plan and observe")
        self.inner, self.name, self.match = inner, inner.name, None

    def plan(self, ctx):
        return self.inner.plan(dataclasses.replace(ctx, oracle_match=self.match))

    def observe(self, out) -> None:
        self.inner.observe(out)

    def describe(self) -> str:
        return self.inner.describe()


# ---- the simulator -------------------------------------------------------------------------------
class _Sim:
    """State of one replay: per-slot arrays (size max_batch) and per-request arrays (size n)."""

    def __init__(self, traces: TraceSet, policy: DepthPolicy, cost: CostModel, max_batch: int,
                 k_max: int, seed: int, acceptance: AcceptanceModel | None) -> None:
        self.tr = traces
        self.K = k_max
        self.feed = _OracleFeed(policy) if getattr(policy, "needs_oracle_match", False) else None
        self.ctl = Controller(self.feed or policy, k_max, cost=cost, acceptance=acceptance, learn_cost=False)
        self.cost = cost
        self.rng = np.random.default_rng(seed)
        self.match, self.top1, self.ent = traces.match, traces.top1[:, :k_max], traces.entropy[:, :k_max]
        self.accept_prob = None if traces.accept_prob is None else traces.accept_prob[:, :k_max]
        M = max_batch
        self.active = np.zeros(M, bool)
        self.req = np.zeros(M, np.int64)  # request index in each slot
        self.pos = np.zeros(M, np.int64)  # output position t
        self.clock = self.busy = 0.0
        self.steps = self.seq_steps = self.emitted_total = self.step_tokens = self.wasted = 0

    def setup(self, trace_index: np.ndarray, out_len: np.ndarray, context: np.ndarray) -> None:
        n = len(trace_index)
        self.r_trace, self.r_len, self.r_ctx = trace_index, out_len, context  # (n,) each
        self.r_off, self.r_tlen = self.tr.offsets[trace_index], self.tr.lengths[trace_index]
        self.r_arrive = np.full(n, np.nan)
        self.r_first, self.r_done = np.full(n, np.nan), np.full(n, np.nan)
        self.r_steps, self.r_acc, self.r_emit = (np.zeros(n, np.int64) for _ in range(3))

    def admit(self, queue: deque[int]) -> None:
        free = np.flatnonzero(~self.active)[: len(queue)]  # lowest free slots
        if len(free):
            new = np.array([queue.popleft() for _ in free], np.int64)
            self.active[free], self.req[free], self.pos[free] = True, new, 0

    def step(self) -> np.ndarray:
        """One speculative step over the running sequences; returns the requests that finished."""
        rows = np.flatnonzero(self.active)  # (B,) slots, in order
        B, req, t = len(rows), self.req[rows], self.pos[rows]
        ptr = self.r_off[req] + t % self.r_tlen[req]  # (B,) flat trace position (wraps)
        ctx = self.r_ctx[req] + t  # (B,) context tokens
        room = self.r_len[req] - t - 1  # (B,) tokens that may still be accepted
        match = np.minimum(self._match(ptr), room)  # (B,) leading draft tokens the target would keep
        if self.feed is not None:
            self.feed.match = match
        step, ids = self.steps, req
        budgets = np.minimum(self.ctl.plan(step, ids, ctx), room)
        J = int(budgets.max(initial=0))
        top1, ent = self.top1[ptr, :J], self.ent[ptr, :J]  # (B, J) copies
        drafted, passes = self._draft(budgets, top1, ent, self.ctl.keep_fn(step, ids, budgets))
        past = np.arange(J)[None, :] >= drafted[:, None]  # (B, J) never drafted
        top1[past], ent[past] = 0.0, 0.0
        verify = self.ctl.verify_fn(step, ids, ctx)(top1, ent, drafted)
        verify = free_verify(verify, drafted)  # clamped and extended as the engine does
        accepted = np.minimum(verify, match)
        context = int(ctx.sum())
        N = B + int(verify.sum())
        rows_per_pass = (drafted[None, :] > np.arange(passes)[:, None]).sum(1)  # (passes,) a pass drafts these
        draft_s = sum(float(self.cost.draft_time(int(b), context)) for b in rows_per_pass)
        target_s = float(self.cost.target_time(N, context, B))
        self.clock += draft_s + target_s
        self.busy += draft_s + target_s
        emitted = accepted + 1
        self.pos[rows] = t + emitted
        self.r_first[req[t == 0]] = self.clock
        self.r_steps[req] += 1
        self.r_acc[req] += accepted
        self.r_emit[req] += emitted
        done = self.pos[rows] >= self.r_len[req]
        fin = req[done]
        self.r_done[fin] = self.clock
        self.active[rows[done]] = False
        first_s = float(self.cost.draft_time(int(rows_per_pass[0]), context)) if passes else 0.0
        self.ctl.observe(step, ids, ctx, budgets, drafted, verify, accepted, top1, ent, draft_s, target_s,
                         passes, fin, first_pass_s=first_s)
        self.steps += 1
        self.seq_steps += B
        self.emitted_total += int(emitted.sum())
        self.step_tokens += N
        self.wasted += int((verify - accepted).sum())
        return fin

    def _draft(self, budgets: np.ndarray, top1: np.ndarray, ent: np.ndarray, keep) -> tuple[np.ndarray, int]:
        """(drafted (B,), draft passes), as `PairRunner._draft` decides them."""
        J = top1.shape[1]
        if keep is None:
            return budgets.copy(), J
        drafted = np.zeros(len(budgets), np.int64)
        active = budgets > 0
        j = 0
        while j < J and active.any():
            drafted[active] += 1
            j += 1
            active &= drafted < budgets
            if active.any() and j < J:
                shown = np.arange(j)[None, :] < drafted[:, None]  # (B, j)
                active &= np.asarray(keep(j, top1[:, :j] * shown, ent[:, :j] * shown, drafted), bool)
        return drafted, j

    def _match(self, ptr: np.ndarray) -> np.ndarray:
        """(B,) how many leading chain tokens the target keeps at these positions: recorded
        (greedy, exact), or drawn once per step for the whole chain from accept_prob (sampling):
        verifying d then keeps min(d, that), as rejection sampling position by position would."""
        if self.accept_prob is None:
            return self.match[ptr]
        ok = self.rng.random((len(ptr), self.K)) < self.accept_prob[ptr]  # (B, K)
        return np.cumprod(ok, axis=1).sum(1).astype(np.int64)


def replay(traces: TraceSet, policy: str | DepthPolicy, cost: str | CostModel, *,
           concurrency: int | None = None, arrivals: Arrivals | None = None, rate_scale: float = 1.0,
           max_batch: int = 256, requests: int | None = None, drain: bool = False,
           max_output: int = 2048, k_max: int | None = None, seed: int = 0,
           acceptance: AcceptanceModel | None = None) -> ReplayResult:
    """Simulate one policy at one load.

    Args:
        traces: the recorded (or synthetic) traces.
        policy: a spec for `make_policy` (a fresh instance per replay) or an instance.
        cost: a spec for `parse_cost` or a cost model (not refined: times are the model's).
        concurrency: closed loop of C clients; or
        arrivals: an arrival trace, its clock divided by `rate_scale` (2: twice the request rate).
        max_batch: most sequences in a step; the rest wait.
        requests: closed loop: requests issued in all (default max(len(traces), 4 C));
            arrivals: the first N arrivals (default all given).
        drain: closed loop: run every issued request to the end instead of stopping at the first
            finish that cannot be replaced.
        max_output: arrivals: output lengths capped here.
        k_max: largest draft budget (default the traces' K).
        seed: for sampling traces (acceptance draws).
        acceptance: the controller's acceptance model (default a fresh one; pass a trained one to
            replay with warm calibration). It learns during the replay.
    Returns:
        ReplayResult; metrics as in `METRICS`, plus the policy, the load and `approximate`.
    Raises:
        ValueError: neither or both loads, or bad sizes.
    """
    if (concurrency is None) == (arrivals is None):
        raise ValueError("give exactly one of concurrency (closed loop) or arrivals")
    if max_batch < 1 or (concurrency is not None and concurrency < 1) or not rate_scale > 0:
        raise ValueError("need max_batch >= 1, concurrency >= 1, rate_scale > 0")
    pol = make_policy(policy) if isinstance(policy, str) else policy
    cm = parse_cost(cost) if isinstance(cost, str) else cost
    K = min(k_max or traces.k_max, traces.k_max)
    sim = _Sim(traces, pol, cm, max_batch, K, seed, acceptance)
    R = len(traces)
    if arrivals is not None:
        n = min(requests or len(arrivals.times), len(arrivals.times))
        idx = np.arange(n) % R
        sim.setup(idx, np.clip(arrivals.generated[:n], 1, max_output), arrivals.context[:n])
        _run_arrivals(sim, arrivals.times[:n] / rate_scale)
        load = {"rate_scale": rate_scale, "arrivals": arrivals.source}
    else:
        n = requests or max(R, 4 * concurrency)
        idx = np.arange(n) % R
        sim.setup(idx, traces.lengths[idx], traces.prompt_lens[idx])
        _run_closed(sim, concurrency, drain)
        load = {"concurrency": concurrency}
    label = policy if isinstance(policy, str) else pol.describe()
    return ReplayResult(_metrics(sim, label, load), idx, sim.r_steps, sim.r_acc, sim.r_emit, ~np.isnan(sim.r_done))


def _run_closed(sim: _Sim, clients: int, drain: bool) -> None:
    n = len(sim.r_trace)
    issued = min(clients, n)
    queue = deque(range(issued))
    sim.r_arrive[:issued] = 0.0
    while True:
        sim.admit(queue)
        if not sim.active.any():
            return
        fin = sim.step()
        if len(fin) and issued == n and not drain:
            return  # a finish that cannot be replaced: the load would drop below C from here
        new = range(issued, min(issued + len(fin), n))
        sim.r_arrive[list(new)] = sim.clock
        queue.extend(new)
        issued += len(new)


def _run_arrivals(sim: _Sim, times: np.ndarray) -> None:
    n, nxt = len(times), 0
    queue: deque[int] = deque()
    sim.r_arrive[:] = times
    while True:
        while nxt < n and times[nxt] <= sim.clock:
            queue.append(nxt)
            nxt += 1
        sim.admit(queue)
        if not sim.active.any():
            if nxt >= n:
                return
            sim.clock = float(times[nxt])  # idle until the next arrival
            continue
        sim.step()


def _metrics(sim: _Sim, policy: str, load: dict[str, Any]) -> dict[str, Any]:
    done = ~np.isnan(sim.r_done)
    ttft = (sim.r_first - sim.r_arrive)[done]
    multi = done & (sim.r_len > 1)
    tpot = ((sim.r_done - sim.r_first) / np.maximum(sim.r_len - 1, 1))[multi]
    q = (lambda x, p: float(np.percentile(x, p)) if len(x) else float("nan"))
    span = sim.clock - float(np.nanmin(sim.r_arrive))
    em = max(sim.emitted_total, 1)
    acc = sim.ctl.acceptance
    return {
        "policy": policy, **load,
        "goodput_tok_s": sim.emitted_total / span if span > 0 else float("nan"),
        "acceptance_length": sim.emitted_total / max(sim.seq_steps, 1),
        "mean_step_s": sim.busy / max(sim.steps, 1),
        "tpot_p50_s": q(tpot, 50), "tpot_p99_s": q(tpot, 99), "ttft_p50_s": q(ttft, 50),
        "wasted_verify_frac": sim.wasted / max(sim.step_tokens, 1),
        "flops_per_token_vs_off": sim.step_tokens / em,  # `off` runs exactly 1 step token per emitted
        "steps": sim.steps, "seq_steps": sim.seq_steps, "emitted": sim.emitted_total,
        "requests_done": int(done.sum()), "sim_time_s": span,
        "fallbacks": int(sum(sim.ctl.fallbacks.values())), "fallback_kinds": dict(sim.ctl.fallbacks),
        "ece": acc.ece(), "ece_raw": acc.ece(raw=True),
        "approximate": bool(sim.accept_prob is not None),
    }
