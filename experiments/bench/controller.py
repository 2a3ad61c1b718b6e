"""How long dspark's decisions take per step: plan + keep_drafting + the causal verify calls.

    python -m specdepth.experiments.bench.controller [--batch 1 16 256] [--depth 8] [--steps 300]

Each step draws fresh per-sequence acceptance rates and context lengths, runs `plan`, then drafts
as the engine would: after each pass j, `keep_drafting` sees the confidences of positions 1..j
and says who drafts j + 1 (within the budgets); then `verify` is called once per position
j = 1..J with the context the controller builds (columns 1..j masked past each drafted length,
drafted capped at j). Only the policy calls are timed (contexts are built outside the timer). Cost models: the H200 roofline preset with
a 27B dense target and 1B draft (past its knee well before B = 256), the same with 10x the
FLOP/s (a high knee, as an MoE target has: speculation still pays at 256), and a fixed step time
(every slot pays: the worst case, every position drafted and admitted).

The policy's loops are compiled (policies/kernels.py); a warm-up run compiles or loads them first.
Each configuration runs in `--rounds` rounds, interleaved with the others: the table gives the
median over every step of every round, and the median of the quietest round (a shared machine has
slow spells that move a whole round by tens of percent). Numbers also scale with the machine's
per-call overhead of numpy, printed first.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from specdepth.adaptive.cost.model import FixedCost, RooflineCost
from specdepth.experiments.results_io import default_out, stamp, table, write_result
from specdepth.policies.base import DraftContext, PlanContext, StepCost, VerifyContext
from specdepth.policies.dspark import DSpark

COSTS: dict[str, StepCost] = {
    "dense": RooflineCost(gpu="h200", target_b=27.0, draft_b=1.0),
    "high-knee": RooflineCost(gpu="h200", target_b=27.0, draft_b=1.0, peak_tflops=7900.0),
    "flat": FixedCost(target_ms=20.0, draft_ms=0.01),
}


def causal_contexts(step: int, context_lens: np.ndarray, drafted: np.ndarray, conf: np.ndarray,
                    cost: StepCost) -> list[VerifyContext]:
    """The controller's verify contexts for positions 1..max(drafted) (adaptive.controller)."""
    b = len(drafted)
    out = []
    for j in range(1, int(drafted.max(initial=0)) + 1):
        cj = conf[:, :j] * (np.arange(j) < drafted[:, None])  # (B, j)
        out.append(VerifyContext(step, np.arange(b), context_lens, np.minimum(drafted, j), cj, cj, cost))
    return out


def bench(batch: int, depth: int, cost: StepCost, steps: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Per-step times (us) of plan, keep_drafting, verify and their total, and the positions drafted."""
    rng = np.random.default_rng(seed)
    policy = DSpark()
    plan_us, keep_us, verify_us, total_us, calls = [], [], [], [], []
    ids = np.arange(batch)
    for step in range(steps):
        context_lens = rng.integers(200, 2000, batch)
        prior = rng.uniform(0.5, 0.95, (batch, 1)) * np.ones((1, depth))  # (B, K) per-sequence rate
        pctx = PlanContext(step, ids, context_lens, depth, prior, cost)
        t0 = time.perf_counter()
        budgets = policy.plan(pctx)
        t_plan = time.perf_counter() - t0
        conf = np.clip(prior + rng.normal(0, 0.1, prior.shape), 0.0, 1.0)  # (B, K) this step's draft
        drafted = np.minimum(budgets, 1)
        active = budgets > 1
        t_keep = 0.0
        for j in range(1, depth):  # the engine's draft loop: ask after each pass
            if not active.any():
                break
            cj = conf[:, :j] * (np.arange(j) < drafted[:, None])  # (B, j)
            dctx = DraftContext(step, ids, budgets, drafted.copy(), cj, cj, np.ones_like(cj))
            t0 = time.perf_counter()
            keep = policy.keep_drafting(dctx)
            t_keep += time.perf_counter() - t0
            active &= np.asarray(keep, bool)
            drafted = drafted + active
            active &= drafted < budgets
        vctxs = causal_contexts(step, context_lens, drafted, conf, cost)
        alive = drafted > 0
        t_verify = 0.0
        for j, vctx in enumerate(vctxs, start=1):
            t0 = time.perf_counter()
            ans = policy.verify(vctx)
            t_verify += time.perf_counter() - t0
            alive &= (ans >= j) & (drafted >= j)  # as the controller keeps them
            if not alive.any():
                break  # nobody is kept at this position: the controller stops asking
        plan_us.append(t_plan * 1e6)
        keep_us.append(t_keep * 1e6)
        verify_us.append(t_verify * 1e6)
        total_us.append((t_plan + t_keep + t_verify) * 1e6)
        calls.append(len(vctxs))
    return {"plan": np.array(plan_us), "keep": np.array(keep_us), "verify": np.array(verify_us),
            "total": np.array(total_us), "drafted": np.array(calls, np.float64)}


def numpy_call_us() -> float:
    """Median time of a trivial numpy call here: the machine's per-call overhead (load shows in it)."""
    x = np.arange(8.0)
    runs = []
    for _ in range(200):
        t0 = time.perf_counter()
        for _ in range(100):
            x * 2.0
        runs.append((time.perf_counter() - t0) * 1e4)
    return float(np.median(runs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 256])
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(default_out("bench_controller")), help="stamped JSON result (results_io)")
    args = ap.parse_args()
    meta = stamp()
    bench(4, args.depth, COSTS["dense"], 5)  # compile (or load) the kernels
    call_us = numpy_call_us()
    print(f"numpy per-call overhead here: {call_us:.2f} us (a quiet modern core: ~0.3)")
    configs = [(name, b) for name in COSTS for b in args.batch]
    runs: dict[tuple[str, int], list[dict[str, float]]] = {c: [] for c in configs}
    for r in range(args.rounds):
        for name, b in configs:
            runs[name, b].append(bench(b, args.depth, COSTS[name], args.steps, seed=r))
    print(f"{'cost':>9} {'B':>4} {'plan us':>8} {'keep us':>8} {'verify us':>10} {'total us':>9} {'quiet us':>9} "
          f"{'p90 us':>7} {'depth':>5}")
    rows = []
    for name, b in configs:
        rs = runs[name, b]
        pooled = {k: float(np.median(np.concatenate([x[k] for x in rs]))) for k in ("plan", "keep", "verify", "total")}
        quiet = min(float(np.median(x["total"])) for x in rs)
        p90 = float(np.percentile(np.concatenate([x["total"] for x in rs]), 90))
        depth = float(np.median(np.concatenate([x["drafted"] for x in rs])))
        print(f"{name:>9} {b:>4} {pooled['plan']:>8.1f} {pooled['keep']:>8.1f} {pooled['verify']:>10.1f} "
              f"{pooled['total']:>9.1f} {quiet:>9.1f} {p90:>7.1f} {depth:>5.0f}")
        rows.append([name, b, pooled["plan"], pooled["keep"], pooled["verify"], pooled["total"], quiet, p90, depth])
    tail = f"(median over {args.rounds} rounds x {args.steps} steps; 'quiet': the median of the quietest round)"
    print(tail)
    cols = ["cost", "B", "plan us", "keep us", "verify us", "total us", "quiet us", "p90 us", "depth"]
    data = {"tables": [table(f"dspark's time per step, K = {args.depth}", cols, rows,
                             ["s", "d"] + [".1f"] * 6 + [".0f"])],
            "notes": [f"numpy per-call overhead on this machine: {call_us:.2f} us (a quiet modern core: ~0.3)", tail],
            "numpy_call_us": call_us}
    print(f"wrote {write_result(args.out, 'bench_controller', data, meta)}", file=sys.stderr)


if __name__ == "__main__":
    main()
