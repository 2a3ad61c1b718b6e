"""Ray path vs in-process: tokens/s of one Ray replica against the in-process Engine, same pair,
same prompts, same policy (dspark) and cost model, at batch 1 and 16, in one run; then where the
Ray path's extra time per step goes. The replica runs the step loop itself and talks to the
cluster once a round (`--round-steps` steps).

    python -m specdepth.experiments.bench_ray [--threads 1] [--prompts 16] [--new-tokens 32] [--out FILE]

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

from specdepth.adaptive.cluster import ClusterConfig, ClusterController
from specdepth.adaptive.ray_local import init_ray
from specdepth.adaptive.controller import Controller
from specdepth.adaptive.engine import Engine, EngineStats, Request
from specdepth.adaptive.profiler import profile
from specdepth.adaptive.replica import ReplicaConfig
from specdepth.experiments.results_io import default_out, stamp, table, write_result
from specdepth.policies.registry import make_policy
from specdepth.workers.pair_spec import PairSpec
from specdepth.workers.runner import PairRunner


def random_pair(seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Random-init models of the sizes experiments/train_pair.py trains (a PairSpec factory, so
    replicas build the same ones)."""
    from specdepth.experiments.train_pair import DRAFT_CFG, TARGET_CFG
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
        return (PairSpec(factory="specdepth.experiments.bench_ray:random_pair"), target, draft, prompts,
                f"RANDOM models of the bundled size ({e}); random prompts")


def requests(prompts: list[list[int]], new_tokens: int) -> list[Request]:
    return [Request(str(i), p, new_tokens, ignore_eos=True) for i, p in enumerate(prompts)]


def fresh_stats(depth: int) -> EngineStats:
    return EngineStats(pos_verified=np.zeros(depth, np.int64), pos_accepted=np.zeros(depth, np.int64))


def run_engine(target, draft, cost, reqs: list[Request], batch: int, depth: int) -> tuple[float, Engine]:
    runner = PairRunner(target, draft, n_slots=batch, max_depth=depth)
    eng = Engine(runner, Controller(make_policy("dspark"), depth, cost=copy.deepcopy(cost)), max_batch=batch)
    t0 = time.perf_counter()
    eng.run(reqs)
    return time.perf_counter() - t0, eng


def run_cluster(spec: PairSpec, cost, reqs: list[Request], batch: int, depth: int,
                threads: int, round_steps: int) -> tuple[float, ClusterController, float]:
    rc = ReplicaConfig(pair=spec, n_slots=batch, max_depth=depth, threads=threads, device="cpu")
    cc = ClusterController(make_policy("dspark"), ClusterConfig(replicas=1, replica=rc, metrics=True,
                                                                round_steps=round_steps), cost=copy.deepcopy(cost))
    cc.run(requests([r.prompt_ids for r in reqs[:2]], 4))  # warm-up: first-call costs out of the timing
    cc.stats = fresh_stats(depth)
    for rep in cc.replicas:
        rep.rtt_s = rep.handler_s = rep.controller_s = 0.0
        rep.stats = fresh_stats(depth)
    t0 = time.perf_counter()
    cc.run(reqs)
    wall = time.perf_counter() - t0
    ping = cc.ping_s()
    cc.shutdown()
    return wall, cc, ping


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1, help="torch threads, in-process and in the replica")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--max-depth", type=int, default=8)
    ap.add_argument("--round-steps", type=int, default=16, help="steps a replica runs per round trip, at most")
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
          f"policy dspark, K={depth}\n")
    print("batch  path             tok/s   steps  ms/step  accept-len")
    notes, rows = [], []
    for batch in (1, 16):
        reqs = requests(prompts, args.new_tokens)
        run_engine(target, draft, cost, reqs[:2], batch, depth)  # warm-up
        e_wall, eng = run_engine(target, draft, cost, reqs, batch, depth)
        c_wall, cc, ping = run_cluster(spec, cost, requests(prompts, args.new_tokens), batch, depth, args.threads,
                                       args.round_steps)
        n_tok = len(prompts) * args.new_tokens
        es, cs = eng.stats, cc.stats
        print(f"{batch:5d}  in-process    {n_tok / e_wall:8.1f}  {es.steps:6d}  {e_wall / es.steps * 1e3:7.2f}  "
              f"{es.acceptance_length:9.2f}")
        print(f"{batch:5d}  ray, 1 replica{n_tok / c_wall:8.1f}  {cs.steps:6d}  {c_wall / cs.steps * 1e3:7.2f}  "
              f"{cs.acceptance_length:9.2f}   ratio ray / in-process {e_wall / c_wall:.2f}")
        rows += [[batch, "in-process", n_tok / e_wall, es.steps, e_wall / es.steps * 1e3, es.acceptance_length, 1.0],
                 [batch, "ray, 1 replica", n_tok / c_wall, cs.steps, c_wall / cs.steps * 1e3, cs.acceptance_length,
                  e_wall / c_wall]]
        rep, n = cc.replicas[0], cs.steps
        e_other = (e_wall - es.draft_s - es.target_s) / es.steps
        notes.append(
            f"batch {batch}, per step: in-process {e_wall / es.steps * 1e3:.2f} ms (draft+target "
            f"{(es.draft_s + es.target_s) / es.steps * 1e3:.2f}, controller/engine {e_other * 1e3:.2f}); "
            f"ray {c_wall / n * 1e3:.2f} ms = in the replica {rep.handler_s / n * 1e3:.2f} (its loop: draft+target "
            f"{(cs.draft_s + cs.target_s) / n * 1e3:.2f}) + round trips beyond the replica "
            f"{(rep.rtt_s - rep.handler_s) / n * 1e3:.2f} (bare actor ping {ping * 1e3:.2f} a round) + cluster "
            f"{rep.controller_s / n * 1e3:.2f} (rounds, pooling, streaming)")
    print("\nwhere the Ray path's time goes:")
    print("\n".join("  " + n for n in notes))
    write_result(args.out, "bench_ray", {
        "tables": [table("Ray (1 replica) vs in-process, dspark", ["batch", "path", "tok/s", "steps", "ms/step",
                                                                    "acceptance length", "ray / in-process"],
                         rows, ["d", "s", ".1f", "d", ".2f", ".2f", ".2f"])],
        "notes": [what] + notes}, meta)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
