"""The vLLM side of the vLLM peer benchmark: runs inside the vLLM venv (setup.sh), never imports
specdepth, and answers in JSON lines.

    VENV/bin/python vllm_offline.py --job JOB.json --out OUT.jsonl

JOB: {"target": DIR, "draft": DIR, "prompts": {"B": [[token ids], ...], ...}, "tokens": N,
      "configs": [{"name": ..., "speculative_config": {...} | null}, ...], "max_num_seqs": M,
      "closed": {"configs": [name, ...], "concurrency": [C, ...], "tokens": T, "prompts": [[ids], ...]}}
(a config with "waves": false runs only its closed loops)
For each config: one `vllm.LLM` (started before timing, then one untimed warm-up call), then per
batch size B its prompts in waves of B (B in flight), greedy with ignore_eos. A row per (config,
B): the whole generate calls' seconds (prefill included), tokens, the output token ids, and the
spec-decode counters' deltas. With "closed": per C, a closed loop of C requests in flight on the
engine's own step loop (each finished one replaced at once), as a server's clients would keep it:
goodput, and each request's first-token and per-token times. A config vLLM refuses gives a row
with its one-line error.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time


def counters(llm) -> dict[str, float]:
    """vLLM's spec-decode counters (summed over engines), 0 where absent."""
    want = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
            "vllm:spec_decode_num_accepted_tokens": "accepted"}
    out = dict.fromkeys(want.values(), 0.0)
    try:
        for m in llm.get_metrics():
            if m.name in want and hasattr(m, "value"):
                out[want[m.name]] += float(m.value)
    except Exception:  # metrics off or renamed: acceptance unknown, timing still valid
        pass
    return out


def run_config(job: dict, cfg: dict, out) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    try:
        llm = LLM(model=job["target"], tokenizer=job["target"], dtype="float32", max_model_len=job["max_model_len"],
                  max_num_seqs=job["max_num_seqs"], seed=0, speculative_config=cfg.get("speculative_config"),
                  disable_log_stats=False)
    except Exception as e:  # noqa: BLE001 (the refusal is the result)
        lines = [x.strip() for x in str(e).strip().splitlines() if x.strip() and "further information" not in x]
        msg = " ".join(lines[:3])[:300] or type(e).__name__
        out.write(json.dumps({"config": cfg["name"], "error": f"{type(e).__name__}: {msg}"}) + "\n")
        out.flush()
        return
    start_s = time.perf_counter() - t0
    sp = SamplingParams(temperature=0.0, max_tokens=job["tokens"], ignore_eos=True)
    first = next(iter(job["prompts"].values()))
    llm.generate([TokensPrompt(prompt_token_ids=first[0])], SamplingParams(temperature=0.0, max_tokens=8,
                                                                          ignore_eos=True), use_tqdm=False)
    for b, prompts in (job["prompts"].items() if cfg.get("waves", True) else ()):
        B = int(b)
        before = counters(llm)
        ids, seconds = [], 0.0
        for i in range(0, len(prompts), B):
            wave = [TokensPrompt(prompt_token_ids=p) for p in prompts[i:i + B]]
            t = time.perf_counter()
            res = llm.generate(wave, sp, use_tqdm=False)
            seconds += time.perf_counter() - t
            ids += [list(r.outputs[0].token_ids) for r in res]
        after = counters(llm)
        d = {k: after[k] - before[k] for k in after}
        out.write(json.dumps({"config": cfg["name"], "batch": B, "seconds": seconds, "start_s": start_s,
                              "tokens": sum(len(x) for x in ids), "outputs": ids,
                              "acc_len": 1.0 + d["accepted"] / d["drafts"] if d["drafts"] > 0 else None,
                              "drafted": d["draft_tokens"], "accepted": d["accepted"]}) + "\n")
        out.flush()
    if job.get("closed") and cfg["name"] in job["closed"]["configs"]:
        for row in closed_loops(llm, job["closed"]):
            out.write(json.dumps({"config": cfg["name"], **row}) + "\n")
            out.flush()
    del llm
    gc.collect()


def closed_loops(llm, spec: dict) -> list[dict]:
    """Per concurrency C: R requests, C in flight, on `llm.llm_engine` (add_request / step)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    eng, prompts, rows = llm.llm_engine, spec["prompts"], []
    sp = SamplingParams(temperature=0.0, max_tokens=spec["tokens"], ignore_eos=True)
    for C in spec["concurrency"]:
        n_req = max(16, 4 * C)  # as bench_serve's clients send
        sent, t_sub, t_first, t_done, n_tok = 0, {}, {}, {}, {}

        def send() -> None:
            nonlocal sent
            rid = f"c{C}-{sent}"
            t_sub[rid] = time.perf_counter()
            eng.add_request(rid, TokensPrompt(prompt_token_ids=prompts[sent % len(prompts)]), sp)
            sent += 1

        t0 = time.perf_counter()
        for _ in range(min(C, n_req)):
            send()
        while eng.has_unfinished_requests():
            for o in eng.step():
                now = time.perf_counter()
                k = len(o.outputs[0].token_ids) if o.outputs else 0
                if k and o.request_id not in t_first:
                    t_first[o.request_id] = now
                if o.finished:
                    t_done[o.request_id], n_tok[o.request_id] = now, k
                    if sent < n_req:
                        send()
        wall = time.perf_counter() - t0
        ttft = [t_first[r] - t_sub[r] for r in t_first]
        tpot = [(t_done[r] - t_first[r]) / (n_tok[r] - 1) for r in t_done if n_tok[r] > 1 and r in t_first]
        rows.append({"mode": "closed", "concurrency": C, "goodput": sum(n_tok.values()) / wall,
                     "ttft": ttft, "tpot": tpot, "tokens": sum(n_tok.values()), "wall_s": wall})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    job = json.load(open(args.job))
    with open(args.out, "a") as out:
        for cfg in job["configs"]:
            run_config(job, cfg, out)
    return 0


if __name__ == "__main__":  # vLLM's engine core starts in a spawned process: the guard is required
    sys.exit(main())
