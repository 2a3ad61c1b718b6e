"""The hybrid drafter against Arctic Inference's rule, replayed on this machine's cost profile.

    python -m specdepth.experiments.bench.hybrid [--prompts 64] [--tokens 96] [--concurrency 1,16,64]

Records two greedy traces of the bundled pair on the same held-out code prompts, K = 8: the
draft model's chains and suffix decoding's. Then replays, with this machine's cost profile (the
one `generate --cost auto` takes and caches), `dspark` and `arctic-hybrid:k=1..4` with the hybrid
drafter (`replay --hybrid-trace`), and for reference `off`, `dspark` and `static:k=8` on the
suffix trace alone and `dspark` on the model trace alone. Greedy replay is exact and
deterministic, so one run per cell; ratios are goodput over `off`'s at the same concurrency.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from specdepth.experiments.cli.argtypes import positive_int
from specdepth.experiments.results_io import default_out, stamp, table, write_result

ARCTIC_KS = (1, 2, 3, 4)


def variants() -> list[tuple[str, str]]:
    """(policy, which traces) per replayed variant: hybrid, suffix or model."""
    return ([("off", "model"), ("dspark", "model"), ("static:k=8", "suffix"), ("dspark", "suffix")]
            + [(f"arctic-hybrid:k={k}", "hybrid") for k in ARCTIC_KS] + [("dspark", "hybrid")])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=positive_int, default=64, help="held-out code prompts")
    ap.add_argument("--tokens", type=positive_int, default=96, help="output tokens per request")
    ap.add_argument("--concurrency", default="1,16,64", help="closed-loop clients, comma-separated")
    ap.add_argument("--out", type=Path, default=default_out("bench_hybrid"))
    args = ap.parse_args(argv)
    try:
        loads = [int(c) for c in args.concurrency.split(",")]
        if min(loads) < 1:
            raise ValueError
    except ValueError:
        ap.error(f"--concurrency: expected positive integers, e.g. 1,16,64; got {args.concurrency!r}")
    from specdepth.experiments.cli.generate import build_cost
    from specdepth.experiments.replay.simulator import replay
    from specdepth.experiments.replay.traces import record_traces
    from specdepth.workers.bundled import heldout_prompts, load_pair

    meta = stamp()
    pair = load_pair(device="cpu")
    cost = build_cost("auto", pair, "cpu")  # this machine's profile (taken once, cached)
    prompts = heldout_prompts()[: args.prompts]
    print(f"recording {len(prompts)} prompts x {args.tokens} tokens, model and suffix chains ...", file=sys.stderr)
    traces = {d: record_traces(pair, prompts, k_max=8, max_new_tokens=args.tokens, batch=16, progress=False,
                               drafter=d) for d in ("model", "suffix")}
    runs = [(p, which, c) for c in loads for p, which in variants()]
    results: dict[tuple[str, str, int], dict] = {}
    for policy, which, c in tqdm(runs, desc="bench_hybrid", unit="run", file=sys.stderr):
        main_tr = traces["suffix" if which == "suffix" else "model"]
        free = traces["suffix"] if which == "hybrid" else None
        m = replay(main_tr, policy, cost, concurrency=c, requests=len(prompts), drain=True, free_traces=free).metrics
        results[policy, which, c] = m
    rows = []
    for c in loads:
        off = results["off", "model", c]["goodput_tok_s"]
        for policy, which in variants():
            m = results[policy, which, c]
            rows.append([c, f"{policy}@{which}", m["goodput_tok_s"], m["goodput_tok_s"] / off,
                         m["acceptance_length"], m["mean_step_s"] * 1e3])
    best_arctic = {c: max(results[f"arctic-hybrid:k={k}", "hybrid", c]["goodput_tok_s"] for k in ARCTIC_KS)
                   for c in loads}
    notes = [f"C={c}: dspark@hybrid / best arctic-hybrid k = "
             f"{results['dspark', 'hybrid', c]['goodput_tok_s'] / best_arctic[c]:.3f}" for c in loads]
    for n in notes:
        print(n, file=sys.stderr)
    write_result(args.out, "bench_hybrid", {
        "tables": [table(f"Replay on this machine's cost profile: {len(prompts)} held-out code prompts x "
                         f"{args.tokens} tokens, K = 8, closed loop of C clients",
                         ["C", "policy@traces", "goodput tok/s", "vs off", "acceptance length", "mean step ms"],
                         rows, ["d", "", ".0f", ".3f", ".2f", ".2f"])],
        "notes": notes}, meta)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
