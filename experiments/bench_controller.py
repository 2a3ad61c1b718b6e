"""How long dspark's decisions take per step: plan + keep_drafting + the causal verify calls.

    python -m experiments.bench_controller [--batch 1 16 256] [--depth 8] [--steps 300]

Each step draws fresh per-sequence acceptance rates and context lengths, runs `plan`, then drafts
as the engine would: after each pass j, `keep_drafting` sees the confidences of positions 1..j
and says who drafts j + 1 (within the budgets); then `verify` is called once per position
j = 1..J with the context the controller builds (columns 1..j masked past each drafted length,
drafted capped at j). Only the policy calls are timed (contexts are built outside the timer). Cost models: the H200 roofline preset with
a 27B dense target and 1B draft (past its knee well before B = 256), the same with 10x the
FLOP/s (a high knee, as an MoE target has: speculation still pays at 256), and a fixed step time
(every slot pays: the worst case, every position drafted and admitted).

Numbers scale with the machine's per-call overhead of numpy, printed first: on a shared or busy
machine everything is slower by about the same factor.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from adaptive.cost_model import FixedCost, RooflineCost
from policies.base import DraftContext, PlanContext, StepCost, VerifyContext
from policies.dspark import DSpark

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


def bench(batch: int, depth: int, cost: StepCost, steps: int, seed: int = 0) -> dict[str, float]:
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
    return {
        "plan_us": float(np.median(plan_us)),
        "keep_us": float(np.median(keep_us)),
        "verify_us": float(np.median(verify_us)),
        "total_us": float(np.median(total_us)),
        "total_p90_us": float(np.percentile(total_us, 90)),
        "drafted": float(np.median(calls)),
    }


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
    args = ap.parse_args()
    print(f"numpy per-call overhead here: {numpy_call_us():.2f} us (a quiet modern core: ~0.3)")
    print(f"{'cost':>9} {'B':>4} {'plan us':>8} {'keep us':>8} {'verify us':>10} {'total us':>9} {'p90 us':>7} "
          f"{'depth':>5}")
    for name, cost in COSTS.items():
        for b in args.batch:
            r = bench(b, args.depth, cost, args.steps)
            print(
                f"{name:>9} {b:>4} {r['plan_us']:>8.1f} {r['keep_us']:>8.1f} {r['verify_us']:>10.1f} "
                f"{r['total_us']:>9.1f} {r['total_p90_us']:>7.1f} {r['drafted']:>5.0f}"
            )


if __name__ == "__main__":
    main()
