"""Live benchmark on the bundled pair: tokens/s of depth policies by batch size, in one run.

    python -m specdepth.experiments.bench.live [--batches 1,4,16,64] [--tokens 48] [--rounds 3] [--warm-steps 64]

Greedy, held-out prompts, --ignore-eos. Every policy starts from the same warmed-up acceptance
statistics and cost model, then serves `--warm-steps` untimed steps at each batch size, so that
each round measures a server's steady state at that load (`warm_at`). In a round every policy
serves a closed loop of `batch` requests on the same prompts, the engines taking steps in turn
(`run_round`), so a slow spell of a shared machine falls on all alike; a policy's figure is its
median over `--rounds` rounds. Prefill is not timed: it is the same work for every policy.
Also printed: calibration of predicted survival (ECE, its floor, Brier), the cost model's
prediction error, and the controller's time per step. Why it is built this way:
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

from specdepth.adaptive.acceptance.model import AcceptanceModel
from specdepth.adaptive.controller import Controller
from specdepth.adaptive.cost.model import CostModel
from specdepth.adaptive.engine import Engine, Request
from specdepth.experiments.cli.generate import build_cost
from specdepth.experiments.results_io import default_out, stamp, write_result
from specdepth.experiments.results_io import table as table_
from specdepth.policies.registry import make_policy
from specdepth.workers.bundled import heldout_prompts, load_pair
from specdepth.workers.drafters.names import DRAFTER_NAMES
from specdepth.workers.runner import PairRunner

POLICIES = ["off"] + [f"static:k={k}" for k in range(1, 9)] + ["hf-heuristic", "turbospec", "vllm-adaptive", "dspark"] \
    + [f"bare:k={k}" for k in range(3)]
K = 8
BARE = "bare:k="  # a static depth served with no controller (module doc)
PASSES: dict = {"compile": "off", "buckets": None, "drafter": "model"}  # every runner's passes and drafter (set in main)


def runner(pair, n_slots: int, max_len: int | None = None) -> PairRunner:
    """A PairRunner on the benchmark's passes (compiled ones shared by every runner)."""
    return PairRunner(pair.target, pair.draft, n_slots=n_slots, max_depth=K, max_len=max_len, **PASSES)


class Fixed:
    """Budgets for an engine with no controller: `k` for every sequence, every step."""

    def __init__(self, k: int) -> None:
        self.k = k

    def __call__(self, seq_ids: np.ndarray, context_lens: np.ndarray) -> np.ndarray:
        return np.full(len(seq_ids), self.k, np.int64)


def warm_up(pair, prompts: list[list[int]], cost: CostModel) -> tuple[AcceptanceModel, CostModel]:
    """Acceptance statistics from a static k = K run on warm-up prompts (every position observed),
    and the cost model as that run refined it (the machine's speed, the time outside the passes)."""
    ctl = Controller(make_policy(f"static:k={K}"), K, cost=copy.deepcopy(cost))
    eng = Engine(runner(pair, 32), ctl)
    eng.run([Request(f"w{i}", p, 48, ignore_eos=True) for i, p in enumerate(prompts)])
    ctl.acceptance.reset_metrics()
    return ctl.acceptance, ctl.cost


def make_engine(pair, spec: str, batch: int, cost: CostModel, acc: AcceptanceModel, max_len: int,
                start: Warm | None = None) -> tuple[Engine, Controller | None]:
    """A fresh engine for `spec` at `batch`, its controller from copies of `cost` and `acc`, or with
    `start`, of a warmed controller's policy, cost model and acceptance model (its step and
    sequence numbers continued, so the policy's state reads as one run). `bare:k=N`: no
    controller (None)."""
    if spec.startswith(BARE):
        eng = Engine(runner(pair, batch, max_len), Fixed(int(spec.removeprefix(BARE))))
        if start is not None:
            eng.step_no, eng.seq_no = start.step_no, start.seq_no
        return eng, None
    policy, cost, acc = (make_policy(spec), cost, acc) if start is None else \
        (start.ctl.policy, start.ctl.cost, start.ctl.acceptance)
    ctl = Controller(copy.deepcopy(policy), K, cost=copy.deepcopy(cost), acceptance=copy.deepcopy(acc))
    eng = Engine(runner(pair, batch, max_len), ctl)
    if start is not None:
        eng.step_no, eng.seq_no = start.step_no, start.seq_no
    return eng, ctl


@dataclass
class Warm:
    """A policy's controller after serving the warm-up at one batch size (`warm_at`)."""

    ctl: Controller | None  # None: a `bare` engine
    step_no: int  # the engine's next step number
    seq_no: int  # and its next sequence number


def warm_at(pair, specs: list[str], prompts: list[list[int]], batch: int, steps: int, tokens: int,
            cost: CostModel, acc: AcceptanceModel, rng: random.Random) -> dict[str, Warm]:
    """Every policy serves `steps` untimed steps at `batch` on the warm-up prompts (a round, see
    `run_round`), and its controller as they left it starts each measured round: what it learned
    online at this load (its policy's state, the cost model's corrections, acceptance) is kept,
    as a server keeps it. Calibration tallies are reset: the figures count the measured rounds'
    prompts only."""
    out = {}
    for spec, (_, eng, ctl) in run_round(pair, specs, prompts, batch, steps, tokens, cost, acc, rng).items():
        if ctl is not None:
            ctl.acceptance.reset_metrics()
            ctl.cost_track = None
        out[spec] = Warm(ctl, eng.step_no, eng.seq_no)
    return out


def run_round(pair, specs: list[str], prompts: list[list[int]], batch: int, steps: int, tokens: int,
              cost: CostModel, acc: AcceptanceModel, rng: random.Random,
              start: dict[str, Warm] | None = None, first: int = 0) -> dict[str, tuple[float, Engine, Controller]]:
    """A closed loop: every policy's engine keeps `batch` requests in flight (new ones taken from
    `prompts`, in the same order for all), and the engines take `steps` steps each, in turn (a
    fresh shuffled order each cycle), each timed over its own steps only. A slow spell of a shared
    machine then falls on every policy alike, step by step, and no engine runs a tail alone with
    the caches to itself. Each engine starts from copies of `cost` and `acc`, or of its policy's warmed
    controller in `start` (`warm_at`). Requests take the prompts in order from `first`.

    Returns:
        spec -> (tokens emitted / wall time of its own steps, engine, controller).
    """
    max_len = max(len(p) for p in prompts) + tokens + 1
    engines = {s: make_engine(pair, s, batch, cost, acc, max_len, start and start[s]) for s in specs}
    for _, ctl in engines.values():
        if ctl is not None:
            ctl.cost_track = []
    outs: dict[str, list] = {s: [] for s in specs}
    wall = dict.fromkeys(specs, 0.0)
    order = list(specs)
    for _ in range(steps):
        rng.shuffle(order)
        for s in order:
            eng = engines[s][0]
            while len(eng.queue) + len(eng.running) < batch:  # keep the batch full
                i = len(outs[s])
                outs[s].append(eng.submit(Request(f"{i}", prompts[(first + i) % len(prompts)], tokens, ignore_eos=True)))
            eng._admit()  # prefill the newcomers untimed: the same work for every policy (see module doc)
            t0, tracked = time.perf_counter(), eng.stats.track_s
            eng.step()
            wall[s] += time.perf_counter() - t0 - (eng.stats.track_s - tracked)  # its bookkeeping apart
    return {s: (sum(len(o.output_ids) for o in outs[s]) / wall[s], *engines[s]) for s in specs}


def solo_runs(pair, prompts: list[list[int]], batch: int, steps: int, tokens: int, cost: CostModel,
              acc: AcceptanceModel, runs: int, rng: random.Random,
              start: Warm | None = None) -> tuple[float, float, float]:
    """The cost model's error (`cost_error`) with dspark serving alone, as one engine does when
    deployed: the same closed loop as a round, with no other engine between its steps. In a round
    each step follows other engines' steps, over their own KV caches and policies' state, so its
    time carries their cache misses; that spread is in every policy's measured tokens/s alike but
    not in anything a cost model of this engine can know. Median over `runs`."""
    warm = {"dspark": start} if start else None
    errs = [cost_error(*run_round(pair, ["dspark"], prompts, batch, steps, tokens, cost, acc, rng, warm)["dspark"][1:])
            for _ in range(runs)]
    return tuple(float(x) for x in np.median(np.array(errs), axis=0))


def cost_error(eng: Engine, ctl: Controller) -> tuple[float, float, float]:
    """Median |predicted - measured| / measured of the target pass, and of the whole step (the
    passes and the time outside them), each prediction made before its step was learned from;
    and the median signed error of the whole step (> 0: the model overprices steps).
    (A step's own time outside the passes is only known once it ends: the engine reports it
    with the next step, so the first step has no row and row k is step k + 1 of the log.)"""
    tgt, step = [], []
    for (p_t, p_d, p_o, t_s, d_s, _), log in zip(ctl.cost_track, eng.stats.step_log[1:]):
        o_s = log[6]
        tgt.append(abs(p_t - t_s) / t_s)
        step.append((p_t + p_d + p_o - t_s - d_s - o_s) / (t_s + d_s + o_s))
    return float(np.median(tgt)), float(np.median(np.abs(step))), float(np.median(step))


def timing_noise(eng: Engine, width: int = 9) -> float:
    """Median |t - m| / m of the target pass time t of each step against the median m of the
    `width` steps around it, for an engine whose steps all have one shape (`off`: one token per
    sequence, a full batch; contexts drift slowly): what jitter alone costs a cost model that
    predicted every step perfectly from its shape, the floor under `cost_error` (a little under the
    jitter: a step is in its own window). NaN on too few steps."""
    t = np.array([log[3] for log in eng.stats.step_log])  # (steps,) target pass seconds
    if len(t) < width:
        return float("nan")
    m = np.median(np.lib.stride_tricks.sliding_window_view(t, width), axis=1)  # (steps - width + 1,)
    h = width // 2
    return float(np.median(np.abs(t[h:len(t) - h] - m) / m))


def pooled_calibration(models: list[AcceptanceModel], raw: bool = False) -> tuple[float, float, int, float]:
    """ECE and Brier of predicted survival over several runs' calibration tallies, the count, and
    the ECE a perfectly calibrated model would show on as many predictions (`ece_floor`).
    `raw`: of the uncalibrated survival (running product of the draft's top-1), the baseline."""
    m = sum(a.metrics[int(raw)] for a in models)  # (bins, 3): n, sum predicted, sum realised
    n = m[:, 0].sum()
    if n == 0:
        return float("nan"), float("nan"), 0, float("nan")
    brier = sum(a.brier_sum[int(raw)] for a in models)
    return float(np.abs(m[:, 1] - m[:, 2]).sum() / n), float(brier / n), int(n), ece_floor(m)


def ece_floor(m: np.ndarray, draws: int = 4000) -> float:
    """Mean ECE of outcomes drawn from the predictions themselves (a perfectly calibrated model):
    with n_b predictions averaging p_b in bin b, realised counts ~ Binomial(n_b, p_b). Finite
    samples alone give ECE ~ 0.8 sqrt(p (1 - p) / n_b) per bin: ~0.03 for 2000 predictions in
    15 bins. (Spread of predictions within a bin makes the true floor a little lower.)"""
    nb = m[:, 0].astype(np.int64)
    p = np.where(nb > 0, m[:, 1] / np.maximum(m[:, 0], 1), 0.0)
    real = np.random.default_rng(0).binomial(nb, p, size=(draws, len(nb)))  # (draws, bins)
    return float(np.abs(real - m[:, 1]).sum(1).mean() / max(nb.sum(), 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--tokens", type=int, default=48, help="new tokens per request")
    ap.add_argument("--steps", type=int, default=0, help="steps per policy per round (default: max(96, 384 / batch))")
    ap.add_argument("--rounds", type=int, default=3, help="runs of every policy per batch size (median)")
    ap.add_argument("--warmup", type=int, default=160, help="warm-up prompts (static k=8, batch 32)")
    ap.add_argument("--warm-steps", type=int, default=64,
                    help="untimed steps every policy serves at each batch size before its rounds (0: none; see `warm_at`)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="where the pair runs: cpu (the README's figures), cuda, ...")
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated; spaces not allowed")
    ap.add_argument("--solo", type=int, default=1,
                    help="solo runs of dspark per batch size, each alone on the machine (0: none; see `solo_runs`)")
    ap.add_argument("--out", default=str(default_out("bench_live")), help="stamped JSON result (results_io)")
    ap.add_argument("--drafter", choices=DRAFTER_NAMES, default="model", help="what drafts, for every policy")
    ap.add_argument("--compile", choices=("auto", "on", "off"), default="off",
                    help="compiled passes for every policy (auto: where a start-up timing finds them faster)")
    args = ap.parse_args()
    meta = stamp()
    PASSES["drafter"] = args.drafter
    torch.set_num_threads(args.threads)
    pair = load_pair(device=args.device)
    tok = pair.tokenizer
    allp = [tok.encode(p) for p in heldout_prompts()]
    warm, prompts = allp[-args.warmup:], allp[:-args.warmup]
    batches = [int(b) for b in args.batches.split(",")]
    # one set of buckets for every runner (up to the largest measured batch; the warm-up's larger
    # passes run eagerly), compiled once; the profile is taken on the passes that serve (cached per path)
    from specdepth.workers.compiled import buckets
    PASSES["buckets"] = (buckets(max(batches)), tuple(sorted({1, 2, 4, K + 1})))
    probe = PairRunner(pair.target, pair.draft, n_slots=max(batches), max_depth=K, compile=args.compile,
                       buckets=PASSES["buckets"], progress=True)
    PASSES["compile"] = "off" if probe.target_pass is pair.target else "on"
    print(probe.compile_summary, flush=True)
    meta["compile"] = {"asked": args.compile, "summary": probe.compile_summary}
    cost = build_cost("auto", pair, args.device, probe)
    del probe
    t0 = time.perf_counter()
    acc, cost = warm_up(pair, warm, cost)
    print(f"warm-up: {len(warm)} prompts, {time.perf_counter() - t0:.0f} s", flush=True)
    policies = args.policies.split(",")
    # a few steps of every policy first: compiled kernels (policies/kernels.py) load or compile on first use
    run_round(pair, policies, warm[:2], 2, 4, 4, cost, acc, random.Random(1))
    runs: dict[tuple[str, int], list[float]] = {}
    ctl_ms: dict[tuple[str, int], list[float]] = {}
    errs, cal, all_models, full_models, solo = [], [], [], [], []
    order = random.Random(0)
    for b in batches:
        steps = args.steps or max(96, 384 // b)
        models, err, noise, off_err = [], [], [], []
        start = warm_at(pair, policies, warm, b, args.warm_steps, args.tokens, cost, acc, order) \
            if args.warm_steps else None
        for rnd in range(args.rounds):
            # each round its own prompts (all policies the same ones): at batch 1 a round serves ~4
            # requests, and rounds that replayed the same few greedily measured calibration on them alone
            results = run_round(pair, policies, prompts, b, steps, args.tokens, cost, acc, order, start,
                                first=rnd * len(prompts) // args.rounds)
            for spec in policies:
                tps, eng, ctl = results[spec]
                runs.setdefault((spec, b), []).append(tps)
                ctl_ms.setdefault((spec, b), []).append(eng.stats.control_s / max(eng.stats.steps, 1) * 1e3)
                if spec == "off":
                    noise.append(timing_noise(eng))
                    off_err.append(cost_error(eng, ctl)[1])
                extra = ""
                if spec == "dspark":
                    err.append(cost_error(eng, ctl))
                    models.append(ctl.acceptance)
                    extra = f"  cost error (whole step) {err[-1][1]:.1%}"
                if spec == f"static:k={K}":
                    full_models.append(ctl.acceptance)  # every drafted position verified: no selection
                print(f"  batch {b:3d} round {rnd + 1} {spec:14s} {tps:8.1f} tok/s  accept-len "
                      f"{eng.stats.acceptance_length:.2f}  controller {ctl_ms[spec, b][-1]:.2f} ms/step"
                      f"  fallbacks {sum(ctl.fallbacks.values()) if ctl else 0}{extra}", flush=True)
            del results
        if "dspark" in policies and args.solo:
            solo.append(solo_runs(pair, prompts, b, steps, args.tokens, cost, acc, args.solo, order,
                                  start and start["dspark"]))
            print(f"  batch {b:3d} solo dspark: cost error (whole step) {solo[-1][1]:.1%}, target pass "
                  f"{solo[-1][0]:.1%}, bias {solo[-1][2]:+.1%}", flush=True)
        if models:
            cal.append(pooled_calibration(models))
            all_models += models
            errs.append((*np.median(np.array(err), axis=0), float(np.median(noise)) if noise else float("nan"),
                         float(np.median(off_err)) if off_err else float("nan")))
    table = {k: float(np.median(v)) for k, v in runs.items()}
    title = f"tokens/s (greedy, bundled pair, held-out prompts; median of {args.rounds} rounds)"
    print(f"\n{title}\n")
    print("| policy | " + " | ".join(f"batch {b}" for b in batches) + " |")
    print("|---|" + "---:|" * len(batches))
    for spec in policies:
        print(f"| {spec} | " + " | ".join(f"{table[spec, b]:.1f}" for b in batches) + " |")
    cols = ["policy"] + [f"batch {b}" for b in batches]
    tables = [table_(title, cols, [[s] + [table[s, b] for b in batches] for s in policies], ["s"] + [".1f"] * len(batches))]
    ctl_title = "controller time per step, ms (plan + keep_drafting + verify + observe; median of rounds)"
    print(f"\n{ctl_title}")
    for spec in policies:
        print(f"  {spec:14s} " + "  ".join(f"b{b} {np.median(ctl_ms[spec, b]):.2f}" for b in batches))
    tables.append(table_(ctl_title, cols, [[s] + [float(np.median(ctl_ms[s, b])) for b in batches] for s in policies],
                         ["s"] + [".2f"] * len(batches)))
    notes: list[str] = []
    if "dspark" in policies:
        notes = summary_lines(args, policies, batches, runs, table, cal, all_models, full_models, errs, solo)
        print("\nratios (dspark vs ...)")
        for line in notes:
            print(("  " if line.startswith("batch") else "") + line)
    data = {"tables": tables, "notes": notes, "tok_s_rounds": {f"{s} @ {b}": v for (s, b), v in runs.items()},
            "controller_ms_rounds": {f"{s} @ {b}": v for (s, b), v in ctl_ms.items()}}
    print(f"wrote {write_result(args.out, 'bench_live', data, meta)}", file=sys.stderr)


def summary_lines(args, policies: list[str], batches: list[int], runs: dict, table: dict, cal: list,
                  all_models: list, full_models: list, errs: list, solo: list) -> list[str]:
    """The printed ratios, calibration and cost-model lines (dspark against the others), one per item."""
    out = []
    for b in batches:
        statics = [(table[s, b], s) for s in policies if s == "off" or s.startswith("static")]
        bare = [(table[s, b], s) for s in policies if s.startswith(BARE)]
        line = [f"batch {b:3d}:"]
        if "off" in policies:
            line[0] += f" vs off {table['dspark', b] / table['off', b]:.2f}x"
        if statics:
            best_static = max(statics)
            paired = np.median(np.array(runs["dspark", b]) / np.array(runs[best_static[1], b]))
            line.append(f"vs best of off/static ({best_static[1]}) {table['dspark', b] / best_static[0]:.3f}x "
                        f"(paired: median of the rounds' own ratios {paired:.3f}x)")
        if "vllm-adaptive" in policies:
            line.append(f"vs vllm-adaptive {table['dspark', b] / table['vllm-adaptive', b]:.2f}x")
        if bare:
            best_bare = max(bare)
            paired_bare = np.median(np.array(runs["dspark", b]) / np.array(runs[best_bare[1], b]))
            line.append(f"vs the best static with no controller ({best_bare[1]}) "
                        f"{table['dspark', b] / best_bare[0]:.3f}x (paired {paired_bare:.3f}x)")
        out.append(", ".join(line).replace(":,", ":"))
    out.append("\ncalibration after warm-up (dspark runs, pooled over rounds; 'floor': the ECE a perfectly "
               "calibrated model shows on as many predictions): " + ", ".join(
                   f"batch {b}: ECE {e:.4f} (floor {f:.4f}) Brier {br:.4f} ({n} verified positions)" if n
                   else f"batch {b}: no verified positions (dspark drafted nothing)"
                   for b, (e, br, n, f) in zip(batches, cal)))
    e, br, n, f = pooled_calibration(all_models)
    out.append(f"calibration pooled over every batch size: ECE {e:.4f} (floor {f:.4f}) Brier {br:.4f} "
               f"({n} verified positions); uncalibrated (running product of the draft's top-1): ECE "
               f"{pooled_calibration(all_models, raw=True)[0]:.4f}")
    if full_models:
        e, br, n, f = pooled_calibration(full_models)
        out.append(f"the same model on static:k={K}'s steps (every drafted position verified, none chosen by the "
                   f"policy), pooled: ECE {e:.4f} (floor {f:.4f}) Brier {br:.4f} ({n} verified positions)")
    out.append("cost model vs measured (dspark runs, median abs error of each step's prediction; 'bias': "
               "median signed error, > 0 overpriced; 'jitter': the same-shape steps of off against their "
               "neighbours, the floor a perfect model would show; 'on off': the same kind of model's whole-step "
               "error on off's steps, whose shape never changes): " + ", ".join(
                   f"batch {b}: target pass {t:.1%}, whole step {s:.1%} (bias {bi:+.1%}, jitter {j:.1%}, on off {o:.1%})"
                   for b, (t, s, bi, j, o) in zip(batches, errs)))
    if solo:
        out.append("the same, dspark serving alone (one engine, as deployed; in the rounds above each step follows "
                   "the other policies' engines' steps): " + ", ".join(
                       f"batch {b}: target pass {t:.1%}, whole step {s:.1%} (bias {bi:+.1%})"
                       for b, (t, s, bi) in zip(batches, solo)))
    return out

if __name__ == "__main__":
    main()
