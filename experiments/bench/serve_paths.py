"""`specdepth serve`'s request paths, in paired rounds: its own front and Ray Serve's switches.

    python -m specdepth.experiments.bench.serve_paths [--paths direct,baseline] [--rounds 3]
        [--concurrency 1 8] [--policy off] [--new-tokens 32]

Each round runs the in-process closed loop at each concurrency (the reference), then every path
in a fresh shuffled order: a `specdepth serve` started with that path's environment, warmed, and
the same streaming client loop as bench_serve. A path's figure is its served / in-process goodput
and its TTFT p50 added over in-process, each the median over rounds with the lowest and highest.
`direct` is `--front direct` (HTTP served by the `specdepth serve` process, the default); the others
are `--front serve` (Ray Serve's proxy and ingress replica) under Ray 2.60's switches. Listeners a
path opens beyond loopback are counted (our rule: loopback unless --host says
otherwise); Ray 2.60's direct ingress and HAProxy bind every interface, so they are measured only
with --paths naming them.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from specdepth.experiments.bench.serve import Server, in_process, served
from specdepth.experiments.cli.argtypes import positive_int
from specdepth.experiments.cli.serve import STREAM_MS
from specdepth.experiments.results_io import default_out, stamp, table, write_result

PATHS: dict[str, dict[str, str]] = {  # the environment each path's server runs in
    "direct": {},
    "baseline": {},
    # the router and user code on the main loop, gRPC between replicas; direct ingress off (it binds 0.0.0.0)
    "throughput": {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0"},
    "direct-ingress": {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"},
    "haproxy": {"RAY_SERVE_ENABLE_HA_PROXY": "1"},
}
FRONT = {"direct": "direct"}  # `--front` of each path (others: serve)


def open_listeners() -> set[tuple[str, int]]:
    """(address, port) of every TCP socket listening beyond loopback on this machine."""
    out = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, port = local.split(":")
            loopback = addr in ("0100007F", "00000000000000000000000001000000") or addr.endswith("0100007F")
            if state == "0A" and not loopback:  # LISTEN
                out.add((addr, int(port, 16)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--paths", default="direct,baseline", help=f"comma-separated, of {', '.join(PATHS)}")
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--concurrency", type=positive_int, nargs="+", default=[1, 8])
    ap.add_argument("--policy", default="off")
    ap.add_argument("--drafter", default="suffix")
    ap.add_argument("--new-tokens", type=positive_int, default=32)
    ap.add_argument("--stream-ms", type=float, default=STREAM_MS, help="the servers' --stream-ms")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=default_out("bench_serve_paths"))
    args = ap.parse_args(argv)
    paths = [p for p in args.paths.split(",") if p]
    if bad := [p for p in paths if p not in PATHS]:
        ap.error(f"--paths: unknown path {bad[0]!r}; expected one of {', '.join(PATHS)}")
    meta, rng = stamp(), random.Random(args.seed)
    torch.set_num_threads(1)  # as the replica runs (bench_serve)
    from specdepth.adaptive.cost.profiler import profile
    from specdepth.workers.bundled import heldout_prompts, load_pair
    pair = load_pair(device="cpu")
    prompts = [pair.tokenizer.encode(p) for p in heldout_prompts()]
    cost = profile(pair.target, pair.draft, quick=True)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(cost.to_json())
    runs, listeners = [], {}
    for rnd in range(args.rounds):
        sets = prompts[rnd * 64:(rnd + 1) * 64] or prompts
        base = {c: in_process(args.policy, cost, sets, c, max(16, 4 * c), args.new_tokens, args.drafter)
                for c in args.concurrency}
        for path in rng.sample(paths, len(paths)):
            before = open_listeners()
            srv = Server(args.policy, f.name, max(args.concurrency), args.stream_ms, args.drafter, env=PATHS[path],
                         front=FRONT.get(path, "serve"))
            try:
                listeners[path] = sorted(open_listeners() - before)
                for c in args.concurrency:
                    served(srv.port, sets, c, c, args.new_tokens)  # warm-up
                    got = served(srv.port, sets, c, max(16, 4 * c), args.new_tokens)
                    runs.append({"round": rnd, "path": path, "concurrency": c, "served": got, "in_process": base[c],
                                 "ratio": got["goodput"] / base[c]["goodput"],
                                 "ttft_added_ms": 1e3 * (got["ttft_p50"] - base[c]["ttft_p50"])})
                    print(f"round {rnd} {path:15s} C={c:2d} served/in-process {runs[-1]['ratio']:.3f} "
                          f"TTFT added {runs[-1]['ttft_added_ms']:.1f} ms", file=sys.stderr, flush=True)
            finally:
                srv.stop()
        rows = []
        for path in paths:
            for c in args.concurrency:
                mine = [r for r in runs if r["path"] == path and r["concurrency"] == c]
                if mine:
                    rs, ts = [r["ratio"] for r in mine], [r["ttft_added_ms"] for r in mine]
                    rows.append([path, c, float(np.median(rs)), f"[{min(rs):.2f}, {max(rs):.2f}]",
                                 float(np.median(ts)), f"[{min(ts):.1f}, {max(ts):.1f}]", len(listeners.get(path, [])),
                                 len(mine)])
        write_result(args.out, "bench_serve_paths", {
            "tables": [table("Serve's request paths: served / in-process goodput and TTFT added (median over rounds)",
                             ["path", "C", "served / in-process", "[min, max]", "TTFT added ms", "[min, max]",
                              "non-loopback listeners", "rounds"], rows,
                             ["", "d", ".3f", "", ".1f", "", "d", "d"])],
            "notes": [f"policy {args.policy}@{args.drafter}, greedy, {args.new_tokens} tokens per request, "
                      f"max(16, 4 C) requests; one replica, --threads 1, --stream-ms {args.stream_ms:g}",
                      "paths: " + "; ".join(f"{p}: --front {FRONT.get(p, 'serve')}, {PATHS[p] or 'Ray defaults'}"
                                            for p in paths)],
            "runs": runs, "listeners": {p: [list(x) for x in v] for p, v in listeners.items()}}, meta)
    Path(f.name).unlink()
    for row in rows:
        print(" | ".join(f"{c:.3f}" if isinstance(c, float) else str(c) for c in row))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
