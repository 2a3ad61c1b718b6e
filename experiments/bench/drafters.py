"""Model-free drafters on the target's own greedy outputs: acceptance length and time per step.

    python -m specdepth.experiments.bench.drafters [--prompts 32] [--tokens 96] [--depths 2,4,8]

The bundled target generates greedily without speculation (`off`) on held-out prompts; then each
drafter is replayed over those outputs as a speculating engine would see them: at each step it
drafts up to k tokens from the committed prefix, the draft is checked against the known output,
and the step commits the accepted tokens plus one. Requests run one after another, so a
drafter's global state (suffix: earlier outputs) fills as a batch-1 server's would. Exact: no
model pass is timed, only each drafter's own propose call. Also timed: one step of every drafter
at batch 64 with 1k-token contexts, against the target's pass at that shape.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from specdepth.experiments.cli.argtypes import positive_int
from specdepth.experiments.results_io import default_out, stamp, table, write_result

DRAFTERS = ("ngram", "suffix")


def off_outputs(prompts: list[list[int]], tokens: int) -> list[list[int]]:
    """The target's greedy continuations, batched, no speculation."""
    from specdepth.adaptive.engine import Engine, Request
    from specdepth.workers.bundled import load_pair
    from specdepth.workers.runner import PairRunner
    pair = load_pair(device="cpu")
    runner = PairRunner(pair.target, pair.draft, n_slots=16, max_depth=1)
    outs = Engine(runner, lambda ids, lens: np.zeros(len(ids), np.int64)).run(
        [Request(str(i), p, tokens, ignore_eos=True) for i, p in enumerate(prompts)])
    return [o.output_ids for o in outs]


def replay(name: str, prompts: list[list[int]], outputs: list[list[int]], k: int) -> tuple[float, float]:
    """(acceptance length, mean seconds of the drafter's propose per step) of drafter `name` at
    static depth k over the recorded outputs, requests one after another in slot 0."""
    from specdepth.workers.drafters.registry import make_drafter
    d = make_drafter(name, None)
    steps, emitted, spent = 0, 0, 0.0
    for prompt, out in zip(prompts, outputs):
        seq = list(prompt)
        d.add([0], [list(prompt)])
        pos = 0
        while pos < len(out):
            budget = np.array([min(k, len(out) - pos - 1)], np.int64)
            t = time.perf_counter()
            prop = d.propose({0: seq}, np.array([0]), budget, None)
            spent += time.perf_counter() - t
            n = int(prop.drafted.drafted[0])
            draft = prop.tokens[0, :n].tolist()
            a = 0
            while a < n and draft[a] == out[pos + a]:
                a += 1
            seq.extend(out[pos: pos + a + 1])
            d.commit(0, len(seq))
            pos += a + 1
            steps += 1
            emitted += a + 1
        d.remove(0)
    return emitted / steps, spent / steps


def time_at_scale(batch: int, context: int, k: int, reps: int = 20) -> dict[str, float]:
    """Seconds of one propose at `batch` sequences of `context` tokens (repetitive, code-like), and
    of the bundled target's pass over batch x (k + 1) tokens at that context, for scale."""
    import torch

    from specdepth.workers.bundled import load_pair
    from specdepth.workers.drafters.registry import make_drafter
    from specdepth.workers.kv_cache import KVCache
    rng = np.random.default_rng(0)
    base = rng.integers(0, 4000, 300).tolist()
    seqs = {s: (base[s % 7:] + rng.integers(0, 4000, 50).tolist() + base) [:context] for s in range(batch)}
    seqs = {s: (t * (context // len(t) + 1))[:context] for s, t in seqs.items()}
    out = {}
    slots, budgets = np.arange(batch), np.full(batch, k, np.int64)
    for name in DRAFTERS:
        d = make_drafter(name, None)
        d.add(list(range(batch)), [list(seqs[s]) for s in range(batch)])
        times = []
        for i in range(reps):
            for s in range(batch):  # one new token each, as after a step
                seqs[s].append(seqs[s][-300])
            t = time.perf_counter()
            d.propose(seqs, slots, budgets, None)
            times.append(time.perf_counter() - t)
        out[name] = float(np.median(times))
    pair = load_pair(device="cpu")
    cfg = pair.target.cfg
    cache = KVCache(cfg.n_layers, batch, cfg.n_kv_heads, cfg.hd, context + k + 2, pair.target.embed.weight.dtype, "cpu")
    sl = torch.tensor([cache.allocate() for _ in range(batch)])
    with torch.inference_mode():
        pair.target(cache, sl, torch.zeros((batch, context - 1), dtype=torch.long),
                    torch.full((batch,), context - 1), logits=False)
        times = []
        for _ in range(5):
            t = time.perf_counter()
            pair.target(cache, sl, torch.zeros((batch, k + 1), dtype=torch.long), torch.full((batch,), k + 1))
            times.append(time.perf_counter() - t)
            for s in sl.tolist():
                cache.truncate(s, context - 1)
    out["target_pass"] = float(np.median(times))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=positive_int, default=32, help="held-out code prompts")
    ap.add_argument("--tokens", type=positive_int, default=96)
    ap.add_argument("--depths", default="2,4,8", help="static depths k, comma-separated")
    ap.add_argument("--out", default=default_out("bench_drafters"))
    args = ap.parse_args(argv)
    from specdepth.workers.bundled import heldout_prompts, load_tokenizer
    meta, tok = stamp(), load_tokenizer(None)
    prompts = [tok.encode(p) for p in heldout_prompts()[: args.prompts]]
    print(f"off's greedy outputs: {len(prompts)} prompts x {args.tokens} tokens ...", file=sys.stderr)
    outputs = off_outputs(prompts, args.tokens)
    rows = []
    for k in (int(x) for x in args.depths.split(",")):
        for name in DRAFTERS:
            acc, per_step = replay(name, prompts, outputs, k)
            rows.append([name, k, acc, per_step * 1e6])
            print(f"{name:8s} k={k}: acceptance length {acc:.2f}, {per_step * 1e6:.0f} us per step", file=sys.stderr)
    scale = time_at_scale(64, 1024, 4)
    notes = [f"At batch 64, 1k-token contexts, k = 4: target pass {scale['target_pass'] * 1e3:.1f} ms; "
             + ", ".join(f"{n} propose {scale[n] * 1e3:.2f} ms ({scale[n] / scale['target_pass']:.1%} of the pass)"
                         for n in DRAFTERS)]
    print(notes[0], file=sys.stderr)
    write_result(args.out, "bench_drafters", {
        "tables": [table(f"Drafters replayed on off's greedy outputs ({len(prompts)} held-out code prompts x "
                         f"{args.tokens} tokens), static depth k", ["drafter", "k", "acceptance length",
                                                                   "us per step (batch 1)"], rows,
                         ["", "d", ".2f", ".0f"])],
        "notes": notes, "scale": scale}, meta)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
