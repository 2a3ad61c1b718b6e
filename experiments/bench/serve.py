"""Served vs in-process: a closed loop of streaming HTTP clients against `specdepth serve`, and the
same closed loop on the in-process Engine, at each concurrency, per policy.

    python -m specdepth.experiments.bench.serve [--concurrency 1 8 32] [--policies off static:k=2 dspark]
        [--requests 64] [--new-tokens 32] [--out FILE]

Bundled pair, greedy, its held-out prompts (both paths emit the same tokens). One cost table,
profiled here once (quick grid), serves both paths. Each of C clients sends its next streaming
request as soon as the last one ends (no think time). Reports goodput (completion tokens per
second of wall time), TTFT (send -> first non-empty chunk) and TPOT ((last - first chunk) /
(tokens - 1)) at p50/p99, and served / in-process goodput. The server runs one replica with
`--max-batch` = the largest concurrency; the client threads share the machine's cores with it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from specdepth.experiments.cli.serve import STREAM_MS
from specdepth.experiments.results_io import default_out, stamp, table, write_result
from specdepth.workers.drafters.names import DRAFTER_NAMES

MODEL = "specdepth-bundled"


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def free_port() -> int:
    """A free TCP port on loopback (for a server subprocess to bind)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def latency_summary(wall: float, tokens: int, ttft: list[float], tpot: list[float]) -> dict:
    """Goodput, and TTFT and TPOT at p50 / p99, of a closed loop's requests."""
    return {"goodput": tokens / wall, "ttft_p50": _pct(ttft, 50), "ttft_p99": _pct(ttft, 99),
            "tpot_p50": _pct(tpot, 50), "tpot_p99": _pct(tpot, 99), "tokens": tokens, "wall_s": wall}


def in_process(policy: str, cost, prompts: list[list[int]], conc: int, n_req: int, new_tokens: int,
               drafter: str = "model") -> dict:
    """The closed loop on the Engine: C requests in flight, each finished one replaced at once."""
    from specdepth.adaptive.controller import Controller
    from specdepth.adaptive.engine import Engine, Request
    from specdepth.policies.registry import make_policy
    from specdepth.workers.bundled import load_pair
    from specdepth.workers.runner import PairRunner
    pair = load_pair(device="cpu")
    runner = PairRunner(pair.target, pair.draft, n_slots=conc, max_depth=8, drafter=drafter)
    eng = Engine(runner, Controller(make_policy(policy), 8, cost=cost), eos_ids=pair.tokenizer.eos_ids)
    first: dict[str, float] = {}

    def on_token(rid: str, toks: list[int]) -> None:
        first.setdefault(rid, time.perf_counter())

    eng.run([Request("warm-up", prompts[0], new_tokens)])  # as the server's warm-up round
    outs, sent = [], 0

    def send() -> None:
        nonlocal sent
        outs.append(eng.submit(Request(str(sent), prompts[sent % len(prompts)], new_tokens, on_token=on_token)))
        sent += 1

    t0 = time.perf_counter()
    for _ in range(min(conc, n_req)):
        send()
    while eng.has_work():
        left = eng.step()
        for _ in left:
            if sent < n_req:
                send()
    wall = time.perf_counter() - t0
    ttft = [first[o.request_id] - o.t_submit for o in outs if o.request_id in first]
    tpot = [(o.t_done - first[o.request_id]) / (len(o.output_ids) - 1) for o in outs if len(o.output_ids) > 1]
    return latency_summary(wall, sum(len(o.output_ids) for o in outs), ttft, tpot)


def _stream(port: int, prompt: list[int], new_tokens: int) -> tuple[float, float, float, int]:
    """One streamed completion over raw HTTP: (t_send, t_first, t_last, completion tokens)."""
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": new_tokens, "stream": True,
                       "stream_options": {"include_usage": True}})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    t_send = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    t_first = t_last = 0.0
    tokens = 0
    for line in resp:
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        obj = json.loads(line[6:])
        if obj.get("usage"):
            tokens = obj["usage"]["completion_tokens"]
        elif obj["choices"] and obj["choices"][0]["text"]:
            t_last = time.perf_counter()
            t_first = t_first or t_last
    conn.close()
    return t_send, t_first, t_last, tokens


def transport_ms(port: int, n: int = 50) -> float:
    """The HTTP path with no model in it, p50 ms: `GET /health`, client -> Serve's proxy -> the
    ingress and back (a floor under what the server adds to every request)."""
    def get() -> float:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        t0 = time.perf_counter()
        conn.request("GET", "/health")
        conn.getresponse().read()
        conn.close()
        return time.perf_counter() - t0
    return _pct([get() for _ in range(n)], 50) * 1e3


def served(port: int, prompts: list[list[int]], conc: int, n_req: int, new_tokens: int) -> dict:
    """The closed loop through HTTP: C client threads, each sending its next request at once."""
    results: list[tuple[float, float, float, int]] = []
    lock, counter = threading.Lock(), iter(range(n_req))

    def client() -> None:
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            r = _stream(port, prompts[i % len(prompts)], new_tokens)
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttft = [f - s for s, f, _, _ in results if f]
    tpot = [(last - f) / (n - 1) for _, f, last, n in results if n > 1 and f]
    return latency_summary(wall, sum(r[3] for r in results), ttft, tpot)


class Server:
    """A `specdepth serve` subprocess on a free loopback port; stopped with SIGTERM."""

    def __init__(self, policy: str, cost_path: str, max_batch: int, stream_ms: float, drafter: str = "model",
                 env: dict[str, str] | None = None, front: str = "direct") -> None:
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        self.proc = subprocess.Popen([sys.executable, "-m", "specdepth.experiments.cli.main", "serve", "--policy", policy,
                                      "--cost", cost_path, "--max-batch", str(max_batch), "--port", str(self.port),
                                      "--threads", "1", "--stream-ms", str(stream_ms), "--drafter", drafter,
                                      "--front", front],
                                     stdout=subprocess.DEVNULL, stderr=self.log, env={**os.environ, **(env or {})})
        deadline = time.monotonic() + 180
        while "Ctrl-C or SIGTERM" not in Path(self.log.name).read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("specdepth serve did not start:\n" + Path(self.log.name).read_text()[-2000:])
            time.sleep(0.25)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(120)
        os.unlink(self.log.name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--policies", nargs="+", default=["off", "static:k=2", "dspark"])
    ap.add_argument("--requests", type=int, default=None, help="requests per run (default max(16, 4 x C))")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--stream-ms", type=float, default=STREAM_MS, help="the server's --stream-ms")
    ap.add_argument("--drafter", choices=DRAFTER_NAMES, default="model", help="what drafts, both paths")
    ap.add_argument("--out", default=str(default_out("bench_serve")), help="result JSON (RESULTS.md reads it)")
    args = ap.parse_args()
    meta = stamp(sys.argv)
    torch.set_num_threads(1)  # as each replica runs (Ray gives a 1-CPU actor one thread)
    from specdepth.adaptive.cost.profiler import profile
    from specdepth.workers.bundled import heldout_prompts, load_pair
    pair = load_pair(device="cpu")
    prompts = [pair.tokenizer.encode(p) for p in heldout_prompts()]
    cost = profile(pair.target, pair.draft, quick=True)
    cost_file = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    cost_file.write(cost.to_json())
    cost_file.close()
    print(f"bundled pair, greedy, {len(prompts)} held-out prompts x up to {args.new_tokens} tokens; "
          f"{os.cpu_count()} cores\n")
    print(f"{'policy':12s} {'C':>3s} {'path':10s} {'tok/s':>8s} {'TTFT p50':>9s} {'p99':>7s} "
          f"{'TPOT p50':>9s} {'p99':>7s}  served/in-process")
    rows, floors = [], []
    try:
        for policy in args.policies:
            base = {c: in_process(policy, cost, prompts, c, args.requests or max(16, 4 * c), args.new_tokens,
                                  args.drafter) for c in args.concurrency}
            srv = Server(policy, cost_file.name, max(args.concurrency), args.stream_ms, args.drafter)
            try:
                floors.append(transport_ms(srv.port))
                for c in args.concurrency:
                    n = args.requests or max(16, 4 * c)
                    served(srv.port, prompts, c, min(n, c), args.new_tokens)  # warm-up
                    got = served(srv.port, prompts, c, n, args.new_tokens)
                    ratio = got["goodput"] / base[c]["goodput"]
                    for path, r in (("in-process", base[c]), ("served", got)):
                        print(f"{policy:12s} {c:3d} {path:10s} {r['goodput']:8.1f} {r['ttft_p50'] * 1e3:7.1f}ms "
                              f"{r['ttft_p99'] * 1e3:5.0f}ms {r['tpot_p50'] * 1e3:7.1f}ms {r['tpot_p99'] * 1e3:5.0f}ms"
                              + (f"  {ratio:.2f}" if path == "served" else ""), flush=True)
                        rows.append([policy, c, path, r["goodput"], r["ttft_p50"] * 1e3, r["ttft_p99"] * 1e3,
                                     r["tpot_p50"] * 1e3, r["tpot_p99"] * 1e3, ratio if path == "served" else 1.0])
            finally:
                srv.stop()
    finally:
        os.unlink(cost_file.name)
    write_result(args.out, "bench_serve", {
        "tables": [table("specdepth serve (HTTP, streaming, 1 replica) vs the in-process engine, closed loop",
                         ["policy", "concurrency", "path", "tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms",
                          "TPOT p99 ms", "served / in-process"], rows,
                         ["s", "d", "s", ".1f", ".1f", ".1f", ".2f", ".2f", ".2f"])],
        "notes": ["bundled pair, greedy, held-out prompts; one quick-profiled cost table for both paths; "
                  "TTFT from send to the first non-empty chunk",
                  f"Serve's HTTP path alone (GET /health through the proxy to the ingress and back, no model), "
                  f"p50 per server: {', '.join(f'{f:.1f}' for f in floors)} ms"]}, meta)
    print(f"Serve's HTTP path alone (GET /health round trip, p50): {', '.join(f'{f:.1f}' for f in floors)} ms")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
