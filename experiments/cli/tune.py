"""`specdepth tune`: the best static k per batch-size band, for vLLM's per-batch-size table.

    specdepth tune --trace traces.jsonl.gz --cost h200 [--concurrency 1,2,4,...,256]

Replays `static:k` for every k in 0..K at every concurrency (closed loop, so the batch holds C
sequences), keeps the k with the highest goodput, and turns the winners into ranges: concurrency
c_i covers batch sizes up to the geometric midpoint sqrt(c_i c_{i+1}); the first range starts at 1,
the last ends at --max-batch, and neighbours with the same k merge. Prints the table as JSON,
`[[bs_lo, bs_hi, k], ...]`, ready for vLLM's `num_speculative_tokens_per_batch_size` or
`--policy vllm-table:table=lo-hi:k/...`; the per-concurrency winners go to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from specdepth.experiments.cli.main import report
from specdepth.experiments.cli.replay import _ints, add_load_args
from specdepth.experiments.replay.traces import TraceError, TraceSet, load_trace_files

DEFAULT_CONCURRENCY = "1,2,4,8,16,32,64,128,256"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("tune", help="best static k per batch-size band (vLLM per-batch-size table)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_load_args(p)
    p.add_argument("--concurrency", type=_ints, default=_ints(DEFAULT_CONCURRENCY),
                   help=f"closed-loop loads to tune at (default {DEFAULT_CONCURRENCY})")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def best_static(traces: TraceSet, cost: str, concurrency: int, k_max: int, max_batch: int = 256,
                requests: int | None = None) -> tuple[int, list[float]]:
    """(best k, goodput of k = 0..k_max) at one closed-loop concurrency; ties: the smaller k."""
    from specdepth.experiments.replay.simulator import replay  # the simulator loads torch: not for --help
    good = [replay(traces, f"static:k={k}", cost, concurrency=concurrency, max_batch=max_batch,
                   requests=requests).metrics["goodput_tok_s"] for k in range(k_max + 1)]
    return max(range(len(good)), key=lambda k: (good[k], -k)), good


def bands(best: dict[int, int], max_batch: int) -> list[list[int]]:
    """[[bs_lo, bs_hi, k], ...] from the best k per concurrency (see the module docstring)."""
    cs = sorted(best)
    rows: list[list[int]] = []
    lo = 1
    for i, c in enumerate(cs):
        hi = max(int(math.floor(math.sqrt(c * cs[i + 1]))), lo) if i + 1 < len(cs) else max(c, max_batch, lo)
        if rows and rows[-1][2] == best[c]:
            rows[-1][1] = hi
        else:
            rows.append([lo, hi, best[c]])
        lo = hi + 1
    return rows


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    try:
        traces = load_trace_files(args.trace)
    except (TraceError, ValueError) as e:
        return report("tune", e)
    K = min(args.k_max or traces.k_max, traces.k_max)
    best: dict[int, int] = {}
    for c in tqdm(sorted(set(args.concurrency)), desc="tune", unit="load", disable=args.no_progress,
                  file=sys.stderr):
        try:
            best[c], good = best_static(traces, args.cost, c, K, args.max_batch, args.requests or None)
        except ValueError as e:
            return report("tune", e)
        print(f"C={c}: best k={best[c]} ({good[best[c]]:.1f} tok/s; k=0: {good[0]:.1f})", file=sys.stderr)
    print(json.dumps(bands(best, args.max_batch)))
    return 0
