"""How fast the replay simulator runs: simulated sequence-steps per minute of wall time.

    python -m specdepth.experiments.bench.replay [--concurrency 64 128 256] [--policies off static:k=3 ...]

Replays a synthetic trace (alpha 0.8, K = 8) through each policy at each concurrency on the H200
roofline, one thread, and prints the figure per run and overall (the target: >= 1M per minute at
concurrency 64-256 on a 2-core CPU). Wall time covers the whole replay: the Controller, the
acceptance model's learning and the policy's own decisions, not only the simulator's bookkeeping.
"""

from __future__ import annotations

import argparse
import sys
import time

from specdepth.experiments.cli.synth import synth_traces
from specdepth.experiments.replay.simulator import replay
from specdepth.experiments.results_io import default_out, stamp, table, write_result

POLICIES = ("off", "static:k=3", "vllm-disable:k=3,threshold=32", "hf-confidence", "specdec++", "turbospec",
            "vllm-adaptive", "dspark", "oracle")


def main(argv: list[str] | None = None) -> int:
    import torch

    torch.set_num_threads(1)  # the models are not used; keep torch (imported by others) quiet
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--policies", nargs="+", default=list(POLICIES))
    ap.add_argument("--cost", default="h200")
    ap.add_argument("--requests", type=int, default=0, help="requests per run (0: 2 x concurrency)")
    ap.add_argument("--tokens", type=int, default=256, help="output tokens per synthetic request")
    ap.add_argument("--out", default=str(default_out("bench_replay")), help="stamped JSON result (results_io)")
    args = ap.parse_args(argv)
    meta = stamp(None if argv is None else ["python", "-m", "specdepth.experiments.bench.replay", *argv])
    traces = synth_traces(requests=128, tokens=args.tokens, seed=0, alpha=0.8, k_max=8)
    total_steps, total_s, rows = 0, 0.0, []
    print(f"{'policy':32s} {'C':>5s} {'seq-steps':>10s} {'wall s':>7s} {'M/min':>7s}")
    for c in args.concurrency:
        for spec in args.policies:
            t0 = time.perf_counter()
            res = replay(traces, spec, args.cost, concurrency=c, requests=args.requests or 2 * c)
            dt = time.perf_counter() - t0
            n = res.metrics["seq_steps"]
            total_steps, total_s = total_steps + n, total_s + dt
            print(f"{spec:32s} {c:5d} {n:10d} {dt:7.2f} {n / dt * 60 / 1e6:7.2f}")
            rows.append([spec, c, n, dt, n / dt * 60 / 1e6])
    overall = (f"overall: {total_steps} simulated sequence-steps in {total_s:.1f} s = "
               f"{total_steps / total_s * 60 / 1e6:.2f}M sequence-steps per minute")
    print(overall)
    data = {"tables": [table(f"replay speed, cost {args.cost}, {args.tokens} tokens per request",
                             ["policy", "C", "seq-steps", "wall s", "M/min"], rows, ["s", "d", "d", ".2f", ".2f"])],
            "notes": [overall]}
    print(f"wrote {write_result(args.out, 'bench_replay', data, meta)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
