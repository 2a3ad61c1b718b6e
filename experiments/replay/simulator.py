"""The replay simulator: any depth policy, on recorded traces, at any load, on any cost model.

A replay is the live step loop (`adaptive.engine.Engine`, with the real Controller: validation,
clamping, fallbacks, causal verify) over a `TraceRunner`, whose steps come from the recorded
traces and whose times come from the cost model (experiments/replay/trace_runner.py). The controller does
not refine the cost model here (`learn_cost=False`), so a greedy replay is exact and repeatable.

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
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specdepth.adaptive.acceptance.model import AcceptanceModel
from specdepth.adaptive.controller import Controller
from specdepth.adaptive.cost.free_draft import FreeDraftCost
from specdepth.adaptive.cost.model import CostModel, parse_cost
from specdepth.workers.drafters.names import MODEL_FREE
from specdepth.adaptive.engine import Engine, Request, RequestOutput
from specdepth.experiments.replay.trace_runner import TraceRunner
from specdepth.experiments.replay.traces import TraceSet
from specdepth.policies.base import DepthPolicy
from specdepth.policies.registry import make_policy

# the Azure traces: SPECDEPTH_DATA, else ../shared/data/azure-llm-2023 beside the checkout
SHARED_DATA = Path(os.environ.get("SPECDEPTH_DATA") or
                   Path(__file__).resolve().parents[3] / "shared" / "data" / "azure-llm-2023")
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
    raise FileNotFoundError(f"no arrival trace {str(path)!r} (nor in {SHARED_DATA}; "
                            "SPECDEPTH_DATA names the folder of the Azure CSVs)")


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

    def __init__(self, inner: DepthPolicy, runner: TraceRunner) -> None:
        if any(type(inner).overrides(h) for h in ("keep_drafting", "verify")):
            raise ValueError(f"{inner.name}: a policy fed oracle_match may only override plan and observe")
        self.inner, self.name, self.runner = inner, inner.name, runner

    def plan(self, ctx):
        return self.inner.plan(dataclasses.replace(ctx, oracle_match=self.runner.oracle_match()))

    def observe(self, out) -> None:
        self.inner.observe(out)

    def describe(self) -> str:
        return self.inner.describe()


class _Sim:
    """One replay: the step loop (`Engine`) over a `TraceRunner`, and the requests it serves."""

    def __init__(self, traces: TraceSet, policy: DepthPolicy, cost: CostModel, max_batch: int,
                 k_max: int, seed: int, acceptance: AcceptanceModel | None, free_traces: TraceSet | None) -> None:
        free = traces.header.meta.get("drafter", "model") in MODEL_FREE  # drafted without a model: priced free
        if free:
            cost = FreeDraftCost(cost)
        self.runner = TraceRunner(traces, cost, max_batch, k_max, seed, free=free_traces)
        self.approximate = traces.accept_prob is not None
        if getattr(policy, "needs_oracle_match", False):
            policy = _OracleFeed(policy, self.runner)
        self.ctl = Controller(policy, k_max, cost=cost, acceptance=acceptance, learn_cost=False)
        if free:
            self.ctl.draft_is_free()
        self.engine = Engine(self.runner, self.ctl, max_batch=max_batch, clock=self.runner.clock)
        self.outs: list[RequestOutput] = []

    def setup(self, trace_index: np.ndarray, out_len: np.ndarray, context: np.ndarray) -> None:
        self.runner.requests(trace_index, out_len, context)
        self.r_len = out_len

    def submit(self, i: int, arrive: float | None = None) -> None:
        """Request i (in order: its sequence id is i) arrives, at `arrive` or now."""
        out = self.engine.submit(Request(str(i), [0], int(self.r_len[i]), key=i))
        if arrive is not None:
            out.t_submit = arrive
        self.outs.append(out)

def replay(traces: TraceSet, policy: str | DepthPolicy, cost: str | CostModel, *,
           concurrency: int | None = None, arrivals: Arrivals | None = None, rate_scale: float = 1.0,
           max_batch: int = 256, requests: int | None = None, drain: bool = False,
           max_output: int = 2048, k_max: int | None = None, seed: int = 0,
           acceptance: AcceptanceModel | None = None, free_traces: TraceSet | None = None) -> ReplayResult:
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
        free_traces: a model-free drafter's trace of the same requests: replay the hybrid drafter,
            each sequence's chain chosen each step by the policy (`trace_runner.check_hybrid`).
    Returns:
        ReplayResult; metrics as in `METRICS`, plus the policy, the load and `approximate`.
    Raises:
        ValueError: neither or both loads, bad sizes, or free traces not of these requests.
    """
    if (concurrency is None) == (arrivals is None):
        raise ValueError("give exactly one of concurrency (closed loop) or arrivals")
    if max_batch < 1 or (concurrency is not None and concurrency < 1) or not rate_scale > 0:
        raise ValueError("need max_batch >= 1, concurrency >= 1, rate_scale > 0")
    pol = make_policy(policy) if isinstance(policy, str) else policy
    cm = parse_cost(cost) if isinstance(cost, str) else cost
    K = min(k_max or traces.k_max, traces.k_max)
    sim = _Sim(traces, pol, cm, max_batch, K, seed, acceptance, free_traces)
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
    per = np.zeros((4, n), np.int64)  # steps, accepted, emitted, finished; 0 for requests never issued
    for i, o in enumerate(sim.outs):
        per[:, i] = o.steps, o.accepted, len(o.output_ids), o.finish_reason is not None
    return ReplayResult(_metrics(sim, label, load), idx, per[0], per[1], per[2], per[3].astype(bool))


def _run_closed(sim: _Sim, clients: int, drain: bool) -> None:
    n = len(sim.r_len)
    for i in range(min(clients, n)):
        sim.submit(i)
    while sim.engine.has_work():
        sim.engine.closed = len(sim.outs) == n  # as `Engine.run`: every request issued, the run closes
        fin = sim.engine.step()
        if len(fin) and len(sim.outs) == n and not drain:
            return  # a finish that cannot be replaced: the load would drop below C from here
        for i in range(len(sim.outs), min(len(sim.outs) + len(fin), n)):
            sim.submit(i)


def _run_arrivals(sim: _Sim, times: np.ndarray) -> None:
    n, nxt = len(times), 0
    runner = sim.runner
    while True:
        while nxt < n and times[nxt] <= runner.now:
            sim.submit(nxt, float(times[nxt]))
            nxt += 1
        if not sim.engine.has_work():
            if nxt >= n:
                return
            runner.now = float(times[nxt])  # idle until the next arrival
            continue
        sim.engine.step()


def _metrics(sim: _Sim, policy: str, load: dict[str, Any]) -> dict[str, Any]:
    outs, runner, st = sim.outs, sim.runner, sim.engine.stats
    n = len(sim.r_len)
    r_arrive, r_first, r_done = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    for i, o in enumerate(outs):
        r_arrive[i] = o.t_submit
        r_first[i] = o.t_first if o.output_ids else np.nan
        r_done[i] = o.t_done if o.finish_reason is not None else np.nan
    done = ~np.isnan(r_done)
    ttft = (r_first - r_arrive)[done]
    multi = done & (sim.r_len > 1)
    tpot = ((r_done - r_first) / np.maximum(sim.r_len - 1, 1))[multi]
    q = (lambda x, p: float(np.percentile(x, p)) if len(x) else float("nan"))
    span = runner.now - float(np.nanmin(r_arrive))
    em = max(st.emitted, 1)
    acc = sim.ctl.acceptance
    return {
        "policy": policy, **load,
        "goodput_tok_s": st.emitted / span if span > 0 else float("nan"),
        "acceptance_length": st.emitted / max(st.seq_steps, 1),
        "mean_step_s": runner.busy / max(st.steps, 1),
        "tpot_p50_s": q(tpot, 50), "tpot_p99_s": q(tpot, 99), "ttft_p50_s": q(ttft, 50),
        "wasted_verify_frac": runner.wasted / max(runner.step_tokens, 1),
        "flops_per_token_vs_off": runner.step_tokens / em,  # `off` runs exactly 1 step token per emitted
        "steps": st.steps, "seq_steps": st.seq_steps, "emitted": st.emitted,
        "requests_done": int(done.sum()), "sim_time_s": span,
        "fallbacks": int(sum(sim.ctl.fallbacks.values())), "fallback_kinds": dict(sim.ctl.fallbacks),
        "ece": acc.ece(), "ece_raw": acc.ece(raw=True),
        "approximate": sim.approximate,
    }
