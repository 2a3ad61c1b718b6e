"""specdepth against the real vLLM, on this machine, the same pair and prompts, offline.

    bash experiments/peers/vllm/setup.sh                       # once: the pinned vLLM venv
    python -m specdepth.experiments.peers.vllm.bench [--batches 1,4,16,64] [--tokens 64]
        [--configs none,draft:1,...] [--variants off,dspark@suffix,...] [--venv DIR]
        [--served-configs none,draft:2] [--served-variants off,dspark@suffix] [--concurrency 1,8,32]

The bundled pair is exported as HF folders (`specdepth export --hf`) and both engines take the same
held-out code prompts as token ids: greedy, ignore_eos, the same token counts. At batch B the
prompts run in waves of B (B in flight; 4 prompts one by one at batch 1). vLLM runs in its own venv
(`vllm_offline.py`), one `LLM` per configuration; specdepth runs here, one engine per variant.
Both are started and warmed before timing, and both are timed over whole generate calls (prefill
included). vLLM's configurations: no speculation, the draft model at k = 1..4, its n-gram and
suffix proposers, a per-batch-size k schedule (`num_speculative_tokens_per_batch_size`), and the
dynamic options it may refuse (a refusal is reported in one line). Cross-engine check: every greedy
output equals specdepth's `off` on the same prompt, or its first difference is shown with the
target's two top logits there.

Served (`--served-configs ''` and `--served-variants ''` skip it): `vllm serve` and `specdepth
serve` under bench_serve's streaming client loop (C clients, each sending its next request when
the last ends) at each concurrency, and each engine's own closed loop of C requests in flight
without HTTP (vLLM: its engine's step loop; specdepth: the Engine's): goodput, TTFT and TPOT
p50/p99, served / offline goodput and the TTFT each server adds over its own engine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


from specdepth.experiments.cli.argtypes import positive_int
from specdepth.experiments.cli.serve import STREAM_MS
from specdepth.experiments.results_io import default_out, stamp, table, write_result

HERE = Path(__file__).resolve().parent
DEFAULT_VENV = Path(os.environ.get("SPECDEPTH_VLLM_VENV", Path.home() / ".cache/specdepth/vllm-venv"))
SCHEDULE = [[1, 1, 4], [2, 8, 3], [9, 32, 2], [33, 1024, 1]]  # (first batch, last batch, k)
CONFIGS = ("none", "draft:1", "draft:2", "draft:3", "draft:4", "ngram:4", "suffix", "draft-schedule",
           "draft-adaptive", "draft-disable-by-batch")
VARIANTS = ("off", "static:k=1", "static:k=2", "static:k=3", "dspark", "dspark@suffix")


def vllm_config(name: str, draft: str) -> dict | None:
    """vLLM's `speculative_config` for one of CONFIGS (None: no speculation)."""
    kind, _, k = name.partition(":")
    if kind == "none":
        return None
    if kind == "draft":
        return {"method": "draft_model", "model": draft, "num_speculative_tokens": int(k)}
    if kind == "ngram":
        return {"method": "ngram", "num_speculative_tokens": int(k), "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    if kind == "suffix":
        return {"method": "suffix", "num_speculative_tokens": 8}
    if kind == "draft-schedule":
        return {"method": "draft_model", "model": draft, "num_speculative_tokens": 4,
                "num_speculative_tokens_per_batch_size": SCHEDULE}
    if kind == "draft-adaptive":
        return {"method": "draft_model", "model": draft, "num_speculative_tokens": 4,
                "enable_adaptive_verification": True}
    if kind == "draft-disable-by-batch":
        return {"method": "draft_model", "model": draft, "num_speculative_tokens": 2, "disable_by_batch_size": 16}
    raise ValueError(f"unknown vLLM configuration {name!r}; expected one of {', '.join(CONFIGS)}")


def prompt_sets(tok, batches: list[int], at_one: int) -> dict[int, list[list[int]]]:
    """Token ids per batch size: `at_one` prompts at batch 1, B at batch B (held-out code)."""
    from specdepth.workers.bundled import heldout_prompts
    pool = heldout_prompts()
    return {b: [tok.encode(p) for p in pool[:(at_one if b == 1 else b)]] for b in batches}


def _wait_gone(venv: Path, timeout: float = 60.0) -> None:
    """Wait until no process of the venv is left (vLLM's engine core may outlive its parent for a
    moment): the next timing must have the machine to itself."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = False
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                cmd = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            alive = str(venv).encode() in cmd or cmd.startswith(b"VLLM::")  # vLLM renames its engine processes
            if alive:
                break
        if not alive:
            return
        time.sleep(0.5)
    print(f"warning: processes of {venv} still running after {timeout:.0f} s", file=sys.stderr)


def run_vllm(venv: Path, job: dict, work: Path, timeout: float) -> list[dict]:
    """Every vLLM configuration in the venv; rows as `vllm_offline.py` writes them."""
    py = venv / "bin" / "python"
    if not py.exists():
        raise SystemExit(f"error: no vLLM venv at {venv}; build it with: bash {HERE / 'setup.sh'}")
    (work / "job.json").write_text(json.dumps(job))
    out = work / "vllm.jsonl"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
           "PYTHONPATH": "", "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")}
    with open(work / "vllm.log", "w") as log:
        proc = subprocess.run([str(py), str(HERE / "vllm_offline.py"), "--job", str(work / "job.json"),
                               "--out", str(out)], env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    _wait_gone(venv)
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if proc.returncode != 0:
        tail = (work / "vllm.log").read_text().strip().splitlines()[-3:]
        print(f"warning: vLLM exited with {proc.returncode}: {tail}", file=sys.stderr)
    return rows


class VllmServer:
    """`vllm serve` from the venv on a free loopback port, the exported pair, one configuration."""

    def __init__(self, venv: Path, target: Path, spec: dict | None, max_seqs: int, work: Path) -> None:
        from specdepth.experiments.bench.serve import free_port
        self.port = free_port()
        # `vllm serve` itself, minus its CLI wrapper (which looks up a "vllm" distribution; this one is "vllm-cpu")
        cmd = [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model", str(target),
               "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32", "--max-model-len", "1024",
               "--max-num-seqs", str(max_seqs), "--seed", "0", "--served-model-name", "specdepth-bundled"]
        if spec is not None:
            cmd += ["--speculative-config", json.dumps(spec)]
        self.log = open(work / f"vllm-serve-{self.port}.log", "w")
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"), "PYTHONPATH": ""}
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 600
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"vllm serve did not start: {Path(self.log.name).read_text()[-1500:]}")
            time.sleep(1.0)

    def _healthy(self) -> bool:
        import http.client
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
            conn.request("GET", "/health")
            ok = conn.getresponse().status == 200
            conn.close()
            return ok
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def run_served(args, pair, venv: Path, target: Path, draft: Path, work: Path, theirs_closed: list[dict]) -> list[dict]:
    """Both servers under the streaming client loop, and specdepth's own closed loop; vLLM's own
    closed loop comes from `theirs_closed` (its offline job)."""
    import torch

    from specdepth.experiments.bench.serve import Server, in_process, latency_summary, served
    from specdepth.experiments.cli.generate import build_cost
    from specdepth.workers.runner import PairRunner
    prompts = served_prompts(pair.tokenizer)
    conc = [int(c) for c in args.concurrency.split(",")]
    rows = []

    def add(engine: str, config: str, path: str, C: int, r: dict) -> None:
        rows.append({"engine": engine, "config": config, "path": path, "concurrency": C,
                     **{k: r[k] for k in ("goodput", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99")}})

    for r in theirs_closed:
        add("vllm", r["config"], "offline", r["concurrency"],
            latency_summary(r["wall_s"], r["tokens"], r["ttft"], r["tpot"]))
    cost_path = work / "cost.json"
    cost = build_cost("auto", pair, "cpu", PairRunner(pair.target, pair.draft, n_slots=1, max_depth=8))
    cost_path.write_text(cost.to_json())
    for v in [v for v in args.served_variants.split(",") if v]:
        policy, _, drafter = v.partition("@")
        print(f"  specdepth {v} ...", file=sys.stderr)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # as the server's replica runs (a 1-CPU Ray actor, one thread), like bench_serve
        try:
            for C in conc:
                add("specdepth", v, "offline", C, in_process(policy, cost, prompts, C, max(16, 4 * C),
                                                             args.served_tokens, drafter or "model"))
        finally:
            torch.set_num_threads(threads)
        srv = Server(policy, str(cost_path), max(conc), STREAM_MS, drafter or "model")
        try:
            served(srv.port, prompts[:2], 1, 2, 4)
            for C in conc:
                add("specdepth", v, "served", C, served(srv.port, prompts, C, max(16, 4 * C), args.served_tokens))
        finally:
            srv.stop()
    for c in [c for c in args.served_configs.split(",") if c]:
        print(f"  vllm serve {c} ...", file=sys.stderr)
        srv = VllmServer(venv, target, vllm_config(c, str(draft)), max(conc), work)
        try:
            served(srv.port, prompts[:2], 1, 2, 4)  # warm-up
            for C in conc:
                add("vllm", c, "served", C, served(srv.port, prompts, C, max(16, 4 * C), args.served_tokens))
        finally:
            srv.stop()
            _wait_gone(venv)
    return rows


def served_ratios(serving: list[dict]) -> list[list]:
    """Per (engine, configuration, C) with both paths: served / offline goodput and TTFT added."""
    by = {(r["engine"], r["config"], r["path"], r["concurrency"]): r for r in serving}
    out = []
    for (e, c, p, C), r in by.items():
        off = by.get((e, c, "offline", C))
        if p == "served" and off is not None:
            out.append([e, c, C, r["goodput"] / off["goodput"], 1e3 * (r["ttft_p50"] - off["ttft_p50"])])
    return out


def served_prompts(tok) -> list[list[int]]:
    from specdepth.workers.bundled import heldout_prompts
    return [tok.encode(p) for p in heldout_prompts()[:64]]


def run_specdepth(pair, variants: list[str], prompts: dict[int, list[list[int]]], tokens: int) -> list[dict]:
    """Every variant (POLICY[@DRAFTER]) on the Engine, started and warmed before timing (a short
    untimed wave at each batch size: the kernels each path uses compile on first use)."""
    from specdepth.adaptive.controller import Controller
    from specdepth.adaptive.engine import Engine, Request
    from specdepth.experiments.cli.generate import build_cost
    from specdepth.policies.registry import make_policy
    from specdepth.workers.runner import PairRunner
    rows = []
    top = max(prompts)
    for v in variants:
        policy, _, drafter = v.partition("@")
        runner = PairRunner(pair.target, pair.draft, n_slots=top, max_depth=8, drafter=drafter or "model")
        ctl = Controller(make_policy(policy), 8, cost=build_cost("auto", pair, "cpu", runner))
        eng = Engine(runner, ctl, eos_ids=pair.tokenizer.eos_ids)
        for B, ps in prompts.items():  # untimed, as vLLM's engine start-up: numba compiles each path's kernels
            eng.max_batch = B
            eng.run([Request(f"warm-{B}-{j}", p[-32:], 8, ignore_eos=True) for j, p in enumerate(ps[:B])])
        for B, ps in prompts.items():
            eng.max_batch = B
            before, seconds, ids = (eng.stats.emitted, eng.stats.seq_steps), 0.0, []
            for i in range(0, len(ps), B):
                wave = [Request(f"{v}-{B}-{i + j}", p, tokens, ignore_eos=True) for j, p in enumerate(ps[i:i + B])]
                t = time.perf_counter()
                outs = eng.run(wave)
                seconds += time.perf_counter() - t
                ids += [list(o.output_ids) for o in outs]
            steps = eng.stats.seq_steps - before[1]  # a sequence's steps, summed: tokens a step is the acceptance length
            rows.append({"config": v, "batch": B, "seconds": seconds, "tokens": sum(len(x) for x in ids),
                         "outputs": ids, "acc_len": (eng.stats.emitted - before[0]) / steps if steps else None})
        print(f"  specdepth {v}: " + ", ".join(f"B={r['batch']} {r['tokens'] / r['seconds']:.0f} tok/s"
                                               for r in rows if r["config"] == v), file=sys.stderr)
    return rows


def first_difference(pair, prompt: list[int], ref: list[int], got: list[int]) -> dict | None:
    """Where `got` leaves the reference: position, both tokens, and the target's two top logits
    there (a near-tie in fp32 explains it)."""
    import torch
    n = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)
    if n is None:
        return None if len(ref) == len(got) else {"position": min(len(ref), len(got)), "length": [len(ref), len(got)]}
    with torch.no_grad():
        logits = pair.target.forward_train(torch.tensor([prompt + ref[:n]]))[0, -1]
    top = torch.topk(logits, 2)
    return {"position": n, "ours": ref[n], "theirs": got[n], "top2": top.indices.tolist(),
            "gap": float(top.values[0] - top.values[1])}


def check_outputs(pair, prompts: dict[int, list[list[int]]], rows: list[dict]) -> list[dict]:
    """Every greedy output against specdepth's reference for its prompt (`off`, smallest batch first)."""
    ref: dict[tuple[int, ...], list[int]] = {}
    for row in sorted((r for r in rows if r["engine"] == "specdepth" and r["config"] == "off"), key=lambda r: r["batch"]):
        for p, out in zip(prompts[row["batch"]], row["outputs"]):
            ref.setdefault(tuple(p), out)
    checks = []
    for row in rows:
        for p, got in zip(prompts.get(row.get("batch"), []), row.get("outputs", [])):
            diff = first_difference(pair, p, ref[tuple(p)], got)
            checks.append({"engine": row["engine"], "config": row["config"], "batch": row["batch"], "equal": diff is None,
                           **({"diff": diff} if diff else {})})
    return checks


def results(args, batches: list[int], theirs: list[dict], ours: list[dict], checks: list[dict], serving: list[dict],
            closed: list[dict], error: str | None) -> dict:
    """The result file's data: the offline, ratio, refusal, served and cross-engine tables."""
    rows, refused = [], []
    for r in theirs + ours:
        if "error" in r:
            refused.append([r["config"], r["error"]])
            continue
        rows.append([r["engine"], r["config"], r["batch"], r["tokens"] / r["seconds"], r.get("acc_len"),
                     1e3 * r["seconds"] * r["batch"] / r["tokens"]])
    ratios = []
    for B in batches:
        best = max((x for x in rows if x[0] == "vllm" and x[2] == B), key=lambda x: x[3], default=None)
        for x in rows:
            if x[0] == "specdepth" and x[2] == B and best is not None:
                ratios.append([B, x[1], x[3], best[1], best[3], x[3] / best[3]])
    n_eq = sum(c["equal"] for c in checks)
    diffs = [[c["engine"], c["config"], c["batch"], c["diff"].get("position"), c["diff"].get("gap")]
             for c in checks if not c["equal"]]
    notes = [f"{args.tokens} tokens per request, greedy, ignore_eos; {args.prompts_at_1} prompts at batch 1, "
             f"B at batch B, in waves of B; held-out code prompts as token ids; fp32 on both sides",
             "ms/token: seconds x B / tokens (a sequence's time per output token, prefill included)",
             f"served: {args.served_tokens} tokens per request, max(16, 4 C) requests per concurrency; specdepth "
             f"serve with one replica (--threads 1) and its in-process loop on one thread, as bench_serve"]
    if error:
        notes.append(error)
    return {"tables": [
        table("Offline: tokens/s (prefill included), acceptance length, ms per token per sequence",
              ["engine", "configuration", "batch", "tok/s", "acc len", "ms/token"], rows,
              ["", "", "d", ".1f", ".2f", ".2f"]),
        table("specdepth / vLLM's best configuration at each batch size",
              ["batch", "specdepth", "tok/s", "vLLM best", "tok/s", "ratio"], ratios,
              ["d", "", ".1f", "", ".1f", ".3f"]),
        table("Configurations vLLM refused", ["configuration", "error"], refused),
        table("Served and offline closed loops: goodput (tok/s), TTFT and TPOT (ms)",
              ["engine", "configuration", "path", "C", "goodput", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99"],
              [[r["engine"], r["config"], r["path"], r["concurrency"], r["goodput"], 1e3 * r["ttft_p50"],
                1e3 * r["ttft_p99"], 1e3 * r["tpot_p50"], 1e3 * r["tpot_p99"]] for r in serving],
              ["", "", "", "d", ".1f", ".1f", ".1f", ".2f", ".2f"]),
        table("Each server against its own engine: served / offline goodput, TTFT added (ms, p50)",
              ["engine", "configuration", "C", "served / offline", "TTFT added"], served_ratios(serving),
              ["", "", "d", ".3f", ".1f"]),
        table(f"Greedy outputs equal to specdepth's `off` on the same prompt: {n_eq} of {len(checks)}; differences",
              ["engine", "configuration", "batch", "first position", "top-2 logit gap there"], diffs,
              ["", "", "d", "d", ".4f"])],
        "notes": notes, "runs": theirs + ours, "served": serving, "closed": closed, "checks": checks}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--tokens", type=positive_int, default=64)
    ap.add_argument("--prompts-at-1", type=positive_int, default=4)
    ap.add_argument("--configs", default=",".join(CONFIGS), help="vLLM configurations, comma-separated")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="specdepth POLICY[@DRAFTER], comma-separated")
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds for all of vLLM's runs")
    ap.add_argument("--served-configs", default="none,draft:2", help="vLLM configurations served ('' skips)")
    ap.add_argument("--served-variants", default="off,dspark@suffix", help="specdepth variants served ('' skips)")
    ap.add_argument("--concurrency", default="1,8,32", help="served: client counts")
    ap.add_argument("--served-tokens", type=positive_int, default=32, help="served: tokens per request")
    ap.add_argument("--out", type=Path, default=default_out("bench_vllm"))
    args = ap.parse_args(argv)
    try:
        batches = sorted({positive_int(b) for b in args.batches.split(",")})
        configs = [c for c in args.configs.split(",") if c]
        served_cfgs = [c for c in args.served_configs.split(",") if c]
        for c in configs + served_cfgs:
            vllm_config(c, "")
        conc = [positive_int(c) for c in args.concurrency.split(",")]
    except (ValueError, argparse.ArgumentTypeError) as e:
        ap.error(str(e))
    if not (args.venv / "bin" / "python").exists():
        ap.error(f"no vLLM venv at {args.venv}; build it with: bash {HERE / 'setup.sh'}")
    from specdepth.workers.bundled import load_pair
    from specdepth.workers.hf_export import export_hf
    meta = stamp()
    pair = load_pair(device="cpu")
    prompts = prompt_sets(pair.tokenizer, batches, args.prompts_at_1)
    variants = list(dict.fromkeys(["off", *[v for v in args.variants.split(",") if v]]))
    with tempfile.TemporaryDirectory(prefix="specdepth-vllm-") as tmp:
        work = Path(tmp)
        target = export_hf(pair.target, work / "target", pair.tokenizer)
        draft = export_hf(pair.draft, work / "draft", pair.tokenizer)
        job = {"target": str(target), "draft": str(draft), "tokens": args.tokens, "max_model_len": 1024,
               "max_num_seqs": max(batches), "prompts": {str(b): p for b, p in prompts.items()},
               "configs": [{"name": c, "speculative_config": vllm_config(c, str(draft)), "waves": c in configs}
                           for c in dict.fromkeys(configs + served_cfgs)]}
        if served_cfgs:
            job["closed"] = {"configs": served_cfgs, "concurrency": conc, "tokens": args.served_tokens,
                             "prompts": served_prompts(pair.tokenizer)}
        print(f"specdepth: {len(variants)} variants ...", file=sys.stderr)
        ours = run_specdepth(pair, variants, prompts, args.tokens)  # first: nothing of vLLM's can linger into it
        print(f"vLLM: {len(job['configs'])} configurations (each starts its engine, ~60 s) ...", file=sys.stderr)
        t0 = time.perf_counter()
        theirs = run_vllm(args.venv, job, work, args.timeout)
        print(f"vLLM done in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        closed = [r for r in theirs if r.get("mode") == "closed"]
        theirs = [r for r in theirs if r.get("mode") != "closed"]
        for r in theirs:
            r["engine"] = "vllm"
        for r in ours:
            r["engine"] = "specdepth"
        checks = check_outputs(pair, prompts, theirs + ours)
        data = results(args, batches, theirs, ours, checks, [], closed, None)
        write_result(args.out, "bench_vllm", data, meta)  # the offline tables, whatever the served part does
        serving, error = [], None
        if served_cfgs or args.served_variants:
            try:
                serving = run_served(args, pair, args.venv, target, draft, work, closed)
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                error = f"served part failed: {str(e).strip().splitlines()[0][:300]}"
                print(f"warning: {error}", file=sys.stderr)
            data = results(args, batches, theirs, ours, checks, serving, closed, error)
            write_result(args.out, "bench_vllm", data, meta)
    for t in data["tables"]:
        print(f"\n{t['title']}")
        for row in t["rows"]:
            print(" | ".join(f"{c:.3f}" if isinstance(c, float) else str(c) for c in row))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
