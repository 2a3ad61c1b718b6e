"""Engine benchmark: tokens/s and mean step time by batch size and fixed depth, the target's
forward time vs step tokens, and step time vs generated length. All in one run, on this CPU.

    python -m specdepth.experiments.bench.engine [--random] [--threads 2]

Uses the bundled pair (held-out prompts, --ignore-eos); --random uses random models of the same
size (acceptance then near 0, so depth > 0 only shows the cost of speculating).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

from specdepth.adaptive.engine import Engine, Request
from specdepth.experiments.results_io import default_out, stamp, table, write_result
from specdepth.workers.bundled import heldout_prompts, load_pair
from specdepth.workers.kv_cache import KVCache
from specdepth.workers.compiled import buckets
from specdepth.workers.runner import PairRunner

K = 8  # the deepest fixed depth timed
PASSES: dict = {"compile": "off", "buckets": None}  # the passes' path for every runner (`--compile`, set in main)


def run_fixed(pair, prompts_ids, batch: int, depth: int, new_tokens: int) -> tuple[float, float, float]:
    runner = PairRunner(pair.target, pair.draft, n_slots=batch, max_depth=max(depth, 1), **PASSES)
    eng = Engine(runner, lambda ids, lens: np.full(len(ids), depth), eos_ids=())
    reqs = [Request(str(i), prompts_ids[i % len(prompts_ids)], new_tokens, ignore_eos=True) for i in range(batch)]
    for r in reqs:
        eng.submit(r)
    eng._admit()  # prefill outside the timed decode
    t0 = time.perf_counter()
    while eng.has_work():
        eng.step()
    wall = time.perf_counter() - t0
    return batch * new_tokens / wall, wall / max(eng.stats.steps, 1), eng.stats.acceptance_length


@torch.inference_mode()
def forward_curve(model, grid, ctx: int = 128, repeats: int = 5) -> list[float]:
    """Median target forward time at N step tokens (N/4 sequences of 4 new tokens, ctx each)."""
    out = []
    for n in grid:
        b = max(1, n // 4)
        t = n // b
        cache = KVCache(model.cfg.n_layers, b, model.cfg.n_kv_heads, model.cfg.hd, ctx + t + 1,
                        model.embed.weight.dtype, model.device)
        slots = torch.tensor([cache.allocate() for _ in range(b)])
        model(cache, slots, torch.randint(0, model.cfg.vocab_size, (b, ctx)), torch.full((b,), ctx), logits=False)
        times = []
        for _ in range(repeats):
            x = torch.randint(0, model.cfg.vocab_size, (b, t))
            t0 = time.perf_counter()
            model(cache, slots, x, torch.full((b,), t))
            times.append(time.perf_counter() - t0)
            for s in slots.tolist():
                cache.truncate(s, ctx)
        out.append(float(np.median(times)))
    return out


@torch.inference_mode()
def ragged_pass(model, n_new: list[int], ctx: int = 200, repeats: int = 15) -> float:
    """Median seconds of one target pass where sequence b brings n_new[b] new tokens (ctx each)."""
    B, T = len(n_new), max(n_new)
    cache = KVCache(model.cfg.n_layers, B, model.cfg.n_kv_heads, model.cfg.hd, ctx + T,
                    model.embed.weight.dtype, model.device)
    slots = [cache.allocate() for _ in range(B)]
    cache.advance(torch.tensor(slots), torch.full((B,), ctx))
    x, n = torch.randint(0, model.cfg.vocab_size, (B, T)), torch.tensor(n_new)
    times = []
    for _ in range(repeats + 2):
        t0 = time.perf_counter()
        model(cache, torch.tensor(slots), x, n)
        times.append(time.perf_counter() - t0)
        for s in slots:
            cache.truncate(s, ctx)
    return float(np.median(times[2:]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--random", action="store_true", help="random models of the bundled pair's size")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--out", default=str(default_out("bench_engine")), help="stamped JSON result (results_io)")
    ap.add_argument("--compile", choices=("auto", "on", "off"), default="off",
                    help="compiled passes (auto: where a start-up timing finds them faster)")
    args = ap.parse_args()
    meta = stamp()
    tables, notes = [], []
    torch.set_num_threads(args.threads)
    pair = load_pair(device="cpu")
    if args.random:
        for m in (pair.target, pair.draft):
            m.init_weights(0)
    PASSES["buckets"] = (buckets(64), (1, 2, 4, K + 1))  # one set for every runner, compiled once
    probe = PairRunner(pair.target, pair.draft, n_slots=64, max_depth=K, compile=args.compile,
                       buckets=PASSES["buckets"], progress=True)
    PASSES["compile"] = "off" if probe.target_pass is pair.target else "on"
    print(probe.compile_summary)
    notes.append(probe.compile_summary)
    tok = pair.tokenizer
    prompts = [tok.encode(p) for p in heldout_prompts(64)]
    setup = (f"target {pair.target.num_params() / 1e6:.1f}M params, draft {pair.draft.num_params() / 1e6:.2f}M; "
             f"{'random' if args.random else 'bundled'} weights; {args.threads} threads; "
             f"{args.new_tokens} new tokens per request")
    print(setup + "\n")
    notes.append(setup)
    print("batch  depth   tok/s   step ms  accept-len")
    rows = []
    for batch in (1, 4, 16, 64):
        for depth in (0, 1, 2, 4, 8):
            tps, step_s, al = run_fixed(pair, prompts, batch, depth, args.new_tokens)
            print(f"{batch:5d}  {depth:5d}  {tps:7.1f}  {step_s * 1e3:8.2f}  {al:9.2f}", flush=True)
            rows.append([batch, depth, tps, step_s * 1e3, al])
    tables.append(table("fixed depths, no controller", ["batch", "depth", "tok/s", "step ms", "accept-len"], rows,
                        ["d", "d", ".1f", ".2f", ".2f"]))

    grid = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    curve = forward_curve(probe.target_pass, grid)
    print("\ntarget forward time vs step tokens N (context 128 per sequence)")
    print("    N   ms/pass   us/token")
    for n, t in zip(grid, curve):
        print(f"{n:5d}  {t * 1e3:8.2f}  {t / n * 1e6:9.1f}")
    tables.append(table("target forward time vs step tokens N (context 128 per sequence)", ["N", "ms/pass", "us/token"],
                        [[n, t * 1e3, t / n * 1e6] for n, t in zip(grid, curve)], ["d", ".2f", ".1f"]))

    print("\nragged verify passes (context 200 per sequence): per-token layers run on the valid tokens only,"
          "\nattention padded to batch x longest row, or in two parts (every first token; the longer rows"
          "\npadded) where that pads less than 1/1.5 as much; a pass costs about its tokens, not batch x longest row")
    print("  batch  rows                   tokens  B x T    ms/pass  vs all-1")
    ragged = []
    for b in (16, 64):
        base = ragged_pass(probe.target_pass, [1] * b)
        for name, rows in (("all 1", [1] * b), ("one 9, rest 1", [9] + [1] * (b - 1)), ("all 2", [2] * b),
                           ("half 5, half 1", [5] * (b // 2) + [1] * (b // 2))):
            t = base if name == "all 1" else ragged_pass(probe.target_pass, rows)
            print(f"  {b:5d}  {name:20s}  {sum(rows):6d}  {b * max(rows):5d}  {t * 1e3:8.2f}  {t / base:7.2f}x",
                  flush=True)
            ragged.append([b, name, sum(rows), b * max(rows), t * 1e3, t / base])
    tables.append(table("ragged verify passes (context 200 per sequence)",
                        ["batch", "rows", "tokens", "B x T", "ms/pass", "vs all-1"], ragged,
                        ["d", "s", "d", "d", ".2f", ".2f"]))

    print("\nstep time vs generated length (batch 16): the batch is decoded to the length, then 16 steps "
          "are timed there; tokens/s from the median step (robust to this shared machine's spikes)")
    short = [p[:16] for p in prompts[:16]]
    lengths = []
    for depth in (0, 2):
        res = {}
        for gen_len in (64, 512):
            runner = PairRunner(pair.target, pair.draft, n_slots=16, max_depth=2, max_len=1024, **PASSES)
            slots = np.array(runner.add_many(short))
            while min(len(runner.seqs[s]) - 16 for s in slots) < gen_len:
                runner.step(slots, np.zeros(16, np.int64))  # plain decoding up to the length (untimed)
            tokens, times = 0, []
            for _ in range(16):
                t0 = time.perf_counter()
                step = runner.step(slots, np.full(16, depth))
                times.append(time.perf_counter() - t0)
                tokens += sum(len(e) for e in step.emitted)
            per_step = tokens / 16
            res[gen_len] = per_step / float(np.median(times))
            print(f"  depth {depth}, generated length {gen_len:4d}: {res[gen_len]:7.1f} tok/s, median step "
                  f"{np.median(times) * 1e3:.1f} ms, {per_step / 16:.2f} tokens per sequence-step")
            lengths.append([depth, gen_len, res[gen_len], float(np.median(times)) * 1e3, per_step / 16, None])
        print(f"  depth {depth}: ratio 512 / 64 = {res[512] / res[64]:.2f} (goal >= 0.80)")
        lengths[-1][-1] = res[512] / res[64]
    tables.append(table("step time vs generated length (batch 16; tokens/s from the median of 16 steps there)",
                        ["depth", "generated length", "tok/s", "median step ms", "tokens per sequence-step",
                         "ratio 512 / 64"], lengths, ["d", "d", ".1f", ".1f", ".2f", ".2f"]))
    print(f"wrote {write_result(args.out, 'bench_engine', {'tables': tables, 'notes': notes}, meta)}", file=sys.stderr)


if __name__ == "__main__":
    main()
