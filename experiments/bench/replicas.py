"""Ray path vs in-process: tokens/s of one Ray replica against the in-process Engine, same pair,
same prompts, same policy (dspark) and cost model, at batch 1 and 16, in one run: `--rounds` timed
runs of each path in turn, judged by the median of the paired ratios (with their spread); then
where the Ray path's extra time per step goes. The replica runs the step loop itself, on a thread that
never waits for the cluster; the cluster exchanges work and committed tokens with it (at most
every `--stream-ms`, and at once for first tokens and finishes).

    python -m specdepth.experiments.bench.replicas [--threads 1] [--prompts 16] [--new-tokens 32] [--rounds 5]
        [--stream-ms 100] [--learn-cost on|off] [--out FILE]

Uses the bundled pair and its held-out prompts; if the bundled weights are missing, random models
of the same size and random prompts (said in the output; acceptance is then near 0, so this
measures overhead, not speculation). Both paths get `--threads` torch threads (the driver and the
replica each have a core on a 2-core machine).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import numpy as np
import torch

from specdepth.adaptive.replicas.cluster import ClusterConfig, ClusterController
from specdepth.adaptive.replicas.ray_local import init_ray
from specdepth.adaptive.controller import Controller
from specdepth.adaptive.engine import Engine, EngineStats, Request
from specdepth.adaptive.cost.profiler import profile
from specdepth.adaptive.replicas.replica import ReplicaConfig
from specdepth.experiments.results_io import default_out, stamp, table, write_result
from specdepth.policies.registry import make_policy
from specdepth.workers.pair_spec import PairSpec
from specdepth.workers.runner import PairRunner


def random_pair(seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Random-init models of the sizes experiments/training/train_pair.py trains (a PairSpec factory, so
    replicas build the same ones)."""
    from specdepth.experiments.training.train_pair import DRAFT_CFG, TARGET_CFG
    from specdepth.workers.model import Transformer
    target, draft = Transformer(TARGET_CFG), Transformer(DRAFT_CFG)
    target.init_weights(seed)
    draft.init_weights(seed + 1)
    return target.eval(), draft.eval()


def load(n_prompts: int) -> tuple[PairSpec, object, object, list[list[int]], str]:
    """(spec for replicas, target, draft, prompt ids, description)."""
    try:
        from specdepth.workers.bundled import heldout_prompts, load_pair
        pair = load_pair(device="cpu")
        prompts = [pair.tokenizer.encode(p) for p in heldout_prompts(n_prompts)]
        return PairSpec(), pair.target, pair.draft, prompts, "bundled pair, held-out prompts"
    except FileNotFoundError as e:
        target, draft = random_pair()
        rng = np.random.default_rng(0)
        prompts = [rng.integers(0, target.cfg.vocab_size, int(rng.integers(8, 48))).tolist() for _ in range(n_prompts)]
        return (PairSpec(factory="specdepth.experiments.bench.replicas:random_pair"), target, draft, prompts,
                f"RANDOM models of the bundled size ({e}); random prompts")


def requests(prompts: list[list[int]], new_tokens: int) -> list[Request]:
    return [Request(str(i), p, new_tokens, ignore_eos=True) for i, p in enumerate(prompts)]


def make_engine(target, draft, cost, batch: int, depth: int, learn_cost: bool) -> Engine:
    """One runner and controller for every round, as a replica keeps its own across requests."""
    runner = PairRunner(target, draft, n_slots=batch, max_depth=depth)
    ctl = Controller(make_policy("dspark"), depth, cost=copy.deepcopy(cost), learn_cost=learn_cost)
    return Engine(runner, ctl, max_batch=batch)


def make_cluster(spec: PairSpec, cost, batch: int, depth: int, threads: int, stream_s: float,
                 learn_cost: bool) -> ClusterController:
    rc = ReplicaConfig(pair=spec, n_slots=batch, max_depth=depth, threads=threads, device="cpu")
    return ClusterController(make_policy("dspark"), ClusterConfig(replicas=1, replica=rc, metrics=True,
                                                                  stream_s=stream_s), cost=copy.deepcopy(cost),
                             learn_cost=learn_cost)


def timed_engine(eng: Engine, reqs: list[Request], depth: int) -> float:
    eng.stats = EngineStats.empty(depth)
    t0 = time.perf_counter()
    eng.run(reqs)
    return time.perf_counter() - t0


def timed_cluster(cc: ClusterController, reqs: list[Request], depth: int) -> float:
    cc.stats = EngineStats.empty(depth)
    for rep in cc.replicas:
        rep.busy_s = rep.controller_s = 0.0
        rep.exchanges = 0
        rep.stats = EngineStats.empty(depth)
    t0 = time.perf_counter()
    cc.run(reqs)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1, help="torch threads, in-process and in the replica")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--max-depth", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5, help="timed runs of each path, in turn")
    ap.add_argument("--stream-ms", type=float, default=ClusterConfig.stream_s * 1000,
                    help="the cluster's stream_s, in ms (default: as `generate --ray`)")
    ap.add_argument("--learn-cost", choices=["on", "off"], default="on",
                    help="refine the cost model from measured step times, on both paths (off: the profiled "
                         "table decides, so both paths weigh drafting alike)")
    ap.add_argument("--out", default=str(default_out("bench_ray")), help="result JSON (RESULTS.md reads it)")
    args = ap.parse_args()
    meta = stamp(sys.argv)
    torch.set_num_threads(args.threads)
    spec, target, draft, prompts, what = load(args.prompts)
    init_ray()
    cost = profile(target, draft, quick=True)  # one cost table for both paths (a quick grid)
    depth = args.max_depth
    print(f"{what}: target {target.num_params() / 1e6:.1f}M, draft {draft.num_params() / 1e6:.2f}M params, cpu, "
          f"{args.threads} thread(s) per process; {len(prompts)} prompts x {args.new_tokens} new tokens; "
          f"policy dspark, K={depth}, cost model learning {args.learn_cost}\n")
    print(f"{args.rounds} rounds, each path in turn; tok/s and ms/step are medians over rounds, accept-len the mean\n")
    print("batch  path             tok/s   steps  ms/step  accept-len   ray / in-process: median [min, max]")
    notes, rows = [], []
    for batch in (1, 16):
        eng = make_engine(target, draft, cost, batch, depth, args.learn_cost == "on")
        eng.run(requests(prompts[:2], 4))  # warm-up: first-call costs out of the timing, on both paths
        cc = make_cluster(spec, cost, batch, depth, args.threads, args.stream_ms / 1000, args.learn_cost == "on")
        cc.run(requests(prompts[:2], 4))
        e_walls, c_walls, e_stats, c_stats = [], [], [], []
        busy = ctl = 0.0
        exchanges = 0
        for _ in range(args.rounds):
            e_walls.append(timed_engine(eng, requests(prompts, args.new_tokens), depth))
            e_stats.append(eng.stats)
            c_walls.append(timed_cluster(cc, requests(prompts, args.new_tokens), depth))
            c_stats.append(cc.stats)
            rep = cc.replicas[0]
            busy, ctl, exchanges = busy + rep.busy_s, ctl + rep.controller_s, exchanges + rep.exchanges
        ping = cc.ping_s()
        cc.shutdown()
        n_tok = len(prompts) * args.new_tokens
        ratios = np.array(e_walls) / np.array(c_walls)
        ratio = float(np.median(ratios))
        for path, walls, sts in (("in-process", e_walls, e_stats), ("ray, 1 replica", c_walls, c_stats)):
            steps = int(np.median([st.steps for st in sts]))
            ms = float(np.median([w / st.steps for w, st in zip(walls, sts)])) * 1e3
            acc = float(np.mean([st.acceptance_length for st in sts]))
            tps = float(np.median([n_tok / w for w in walls]))
            tail = f"   {ratio:.2f} [{ratios.min():.2f}, {ratios.max():.2f}]" if path != "in-process" else ""
            print(f"{batch:5d}  {path:15s}{tps:8.1f}  {steps:6d}  {ms:7.2f}  {acc:9.2f}{tail}")
            rows.append([batch, path, tps, steps, ms, acc, ratio if path != "in-process" else 1.0,
                         float(ratios.min()) if path != "in-process" else 1.0,
                         float(ratios.max()) if path != "in-process" else 1.0])
        e_steps, c_steps = sum(st.steps for st in e_stats), sum(st.steps for st in c_stats)
        e_pass = sum(st.draft_s + st.target_s for st in e_stats)
        c_pass = sum(st.draft_s + st.target_s for st in c_stats)
        c_wall = sum(c_walls)
        def passes(sts: list[EngineStats]) -> str:
            log = [row for st in sts for row in st.step_log]
            n_draft = sum(row[4] for row in log)
            return (f"{n_draft / len(log):.2f} draft passes a step at {sum(row[2] for row in log) / n_draft * 1e3:.2f} "
                    f"ms, target pass {sum(row[3] for row in log) / len(log) * 1e3:.2f} ms")
        notes.append(f"batch {batch}, passes: in-process {passes(e_stats)}; ray {passes(c_stats)}")
        notes.append(
            f"batch {batch}, per step: in-process {sum(e_walls) / e_steps * 1e3:.2f} ms (draft+target "
            f"{e_pass / e_steps * 1e3:.2f}, controller/engine {(sum(e_walls) - e_pass) / e_steps * 1e3:.2f}); "
            f"ray {c_wall / c_steps * 1e3:.2f} ms = the replica's loop stepping {busy / c_steps * 1e3:.2f} "
            f"(draft+target {c_pass / c_steps * 1e3:.2f}) + the loop idle {(c_wall - busy) / c_steps * 1e3:.2f} "
            f"(waiting for requests after a finish); {exchanges / c_steps:.2f} exchanges a step (bare actor ping "
            f"{ping * 1e3:.2f} ms), the cluster's side {ctl / c_steps * 1e3:.2f} ms a step, beside the loop")
    print("\nwhere the Ray path's time goes:")
    print("\n".join("  " + n for n in notes))
    write_result(args.out, "bench_ray", {
        "tables": [table("Ray (1 replica) vs in-process, dspark", ["batch", "path", "tok/s", "steps", "ms/step",
                                                                    "acceptance length", "ray / in-process",
                                                                    "min", "max"],
                         rows, ["d", "s", ".1f", "d", ".2f", ".2f", ".2f", ".2f", ".2f"])],
        "notes": [what] + notes}, meta)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
