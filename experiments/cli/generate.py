"""`specdepth generate`: speculative generation with an adaptive depth policy.

    specdepth generate --prompt 'def parse_args(argv):'
    specdepth generate --prompts prompts.txt --policy dspark --max-new-tokens 128 --json
    specdepth generate --prompts prompts.jsonl --output results.jsonl

--prompts takes plain text (one prompt per line, exactly as written) or JSON lines
({"prompt": "..."} per line; a .jsonl suffix or a first line that is a JSON object).
Prints each generated continuation (not the prompt) on stdout, so it pipes cleanly, and a run
summary on stderr. With --json, one JSON object per request instead; --output writes those
objects to a file. Outputs follow the input order one for one: a prompt that cannot be served
(empty, longer than the context) gets an empty line, or an object with its error, in its place.
Runs in-process by default; --ray (or RAY_ADDRESS set, as under `ray job submit`) runs the
replicas as Ray actors.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import numpy as np

from specdepth.experiments.cli.argtypes import existing_file, float_range, int_range, output_file, positive_int
from specdepth.experiments.cli import spec_types
from specdepth.experiments.cli.prompts import read_records, sampling_settings
from specdepth.workers.drafters.names import DEFAULT_DRAFTER, DRAFTER_NAMES

MAX_DEPTH_LIMIT = 64  # --max-depth's upper bound: far past any useful draft, small enough to allocate
FINISH_REASONS = ("length", "eos", "context", "error")  # as RequestOutput.finish_reason spells them


def add_model_args(p: argparse.ArgumentParser) -> None:
    """Flags shared by every command that runs models."""
    p.add_argument("--target", type=spec_types.model_path, default=None,
                   help="target: specdepth .safetensors or HF folder (default: bundled; with --draft)")
    p.add_argument("--draft", type=spec_types.model_path, default=None,
                   help="draft: specdepth .safetensors or HF folder (default: bundled; with --target)")
    p.add_argument("--device", type=spec_types.device_spec, default=None,
                   help="cpu, cuda, cuda:N (default: cuda when available)")
    p.add_argument("--threads", type=spec_types.threads, default=0, help="torch CPU threads (0: torch's default)")


def add_drafter_args(p: argparse.ArgumentParser, default: str = DEFAULT_DRAFTER) -> None:
    """--drafter and its options, for every command that drafts (workers/drafters/)."""
    p.add_argument("--drafter", choices=DRAFTER_NAMES, default=default,
                   help="what proposes draft tokens: the draft model, n-gram lookup, or suffix decoding over the "
                   "sequence's prompt and output and earlier outputs (both with no model pass) "
                   f"(default: {default})")
    p.add_argument("--ngram-min", type=int_range(1, 64), default=1, help="ngram: shortest suffix matched (default 1)")
    p.add_argument("--ngram-max", type=int_range(1, 64), default=4, help="ngram: longest suffix matched (default 4)")


def add_compile_arg(p: argparse.ArgumentParser) -> None:
    """--compile: the passes' path (workers/compiled.py), for every command that runs the pair."""
    p.add_argument("--compile", choices=("auto", "on", "off"), default="off",
                   help="compiled passes (torch.compile; CUDA graphs on GPU): auto uses them where a "
                   "start-up timing finds them faster; the first compile is cached on disk (default: off)")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("generate", help="generate text with adaptive speculative decoding",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="one prompt")
    src.add_argument("--prompts", type=existing_file,
                     help="a file of prompts, batched: one per line, or JSON lines {\"prompt\": ...}")
    p.add_argument("--max-new-tokens", type=positive_int, default=64)
    p.add_argument("--temperature", type=float_range(0.0), default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float_range(0.0, 1.0, lo_open=True), default=1.0, help="in (0, 1]")
    p.add_argument("--seed", type=int_range(0, 2**64 - 1), default=0)
    p.add_argument("--policy", default="dspark", help="depth policy spec (see `specdepth policies`)")
    p.add_argument("--max-depth", type=int_range(0, MAX_DEPTH_LIMIT), default=8,
                   help=f"K: largest draft budget, 0 to {MAX_DEPTH_LIMIT}")
    p.add_argument("--max-batch", type=positive_int, default=64, help="sequences running at once")
    p.add_argument("--cost", default="auto", help="cost model: auto (profile this machine at start-up, "
                   "cached), a profile JSON, h200, fixed:target_ms=..,draft_ms=..")
    p.add_argument("--ignore-eos", action="store_true", help="generate exactly --max-new-tokens")
    p.add_argument("--json", action="store_true", help="one JSON object per request on stdout")
    p.add_argument("--output", type=output_file, default=None,
                   help="also write the --json objects, one per line in input order, to this file")
    p.add_argument("--ray", action="store_true", help="run replicas as Ray actors (also when RAY_ADDRESS is set)")
    p.add_argument("--ray-host", default=None, metavar="ADDRESS",
                   help="with --ray: the address the embedded Ray listens on (default 127.0.0.1, or "
                   "SPECDEPTH_RAY_HOST); give the machine's address only to let other machines join")
    p.add_argument("--replicas", type=positive_int, default=1, help="Ray replicas (with --ray)")
    add_model_args(p)
    add_drafter_args(p)
    add_compile_arg(p)
    p.set_defaults(func=run)


def check_args(args: argparse.Namespace) -> None:
    """What argparse's per-flag types cannot see: flags that go together, and the cost spec
    (parsed here so a typo fails before the models load).

    Raises:
        ValueError: naming the flags.
    """
    if (args.target is None) != (args.draft is None):
        raise ValueError("--target and --draft go together: give both, or neither (the bundled pair)")
    if args.ngram_min > args.ngram_max:
        raise ValueError(f"--ngram-min {args.ngram_min} is above --ngram-max {args.ngram_max}")
    if args.cost != "auto":
        from specdepth.adaptive.cost.model import parse_cost
        parse_cost(args.cost)


def read_prompts(args: argparse.Namespace, default) -> tuple[list[str], list]:
    """--prompt as given, or --prompts read by `experiments.cli.prompts.read_records`; and per
    prompt its own `SamplingParams` where its JSON lines record sets temperature, top_p or seed
    (`default`, the flags', fills in the rest), else None: the run's flags."""
    from specdepth.workers.sampler import SamplingParams
    if args.prompt is not None:
        return [args.prompt], [None]
    records = read_records(args.prompts)
    own = [sampling_settings(args.prompts, n, o) for n, _, o in records]
    return [p for _, p, _ in records], [
        SamplingParams(o.get("temperature", default.temperature), o.get("top_p", default.top_p), o.get("seed"))
        if o else None for o in own]


def build_cost(spec: str, pair, device: str, runner=None):
    """The cost model: a spec, or `auto` = this machine's profile of this pair (cached), taken on
    the runner's passes (compiled or eager: the path is part of the cache key)."""
    from specdepth.adaptive.cost.model import parse_cost
    if spec != "auto":
        return parse_cost(spec)
    from specdepth.adaptive.cost.model import load_cost
    from specdepth.adaptive.cost.profiler import profile
    from specdepth.workers.cache import cache_dir
    cache = cache_dir()
    # v4: with the decode shape; v5: cheap points timed more often (adaptive/cost/profiler.py);
    # v6: few-token passes on CPU through oneDNN (workers/linear.py); v7: the passes' path in the
    # key, and this machine's few-row linear answers (workers/linear_choice.py); v8: the near shape
    # (the jump to a ragged pass, adaptive/cost/profiler.py)
    from specdepth.workers.linear import signature
    target, draft = (pair.target, pair.draft) if runner is None else (runner.target_pass, runner.draft_pass)
    path_name = "eager" if target is pair.target else "compiled"
    key = (f"profile-v8-{pair.name.replace('/', '_').replace('|', '__')}-{device}-{path_name}"
           f"-linear-{signature(pair.target, pair.draft)}.json")
    path = cache / key
    if path.exists():
        return load_cost(path)
    print(f"profiling the pair on {device} (once; cached at {path}) ...", file=sys.stderr)
    cost = profile(target, draft, device, quick=False, repeats=5, progress=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(cost.to_json())
    return cost


def run(args: argparse.Namespace) -> int:
    check_args(args)
    import torch

    from specdepth.adaptive.controller import Controller, check_depths
    from specdepth.adaptive.cost.error import error_line
    from specdepth.adaptive.engine import Engine, Request
    from specdepth.policies.registry import make_policy
    from specdepth.workers.bundled import load_pair
    from specdepth.workers.drafters.registry import drafter_options
    from specdepth.workers.runner import PairRunner
    from specdepth.workers.sampler import SamplingParams

    if args.threads:
        torch.set_num_threads(args.threads)
    sampling = SamplingParams(args.temperature, args.top_p)
    prompts, own = read_prompts(args, sampling)  # each prompt's own settings, checked before any model loads
    policy = make_policy(args.policy)
    if getattr(policy, "replay_only", False):
        raise ValueError(f"policy {policy.name!r} needs the future (true match lengths): replay only, "
                         "see `specdepth replay`")
    check_depths(policy, args.max_depth)  # before any model loads
    if args.ray or os.environ.get("RAY_ADDRESS"):
        return _run_ray(args, prompts, sampling, own)
    pair = load_pair(args.target, args.draft, args.device)
    device = str(pair.target.device)
    tok = pair.tokenizer
    runner = PairRunner(pair.target, pair.draft, n_slots=min(args.max_batch, max(1, len(prompts))),
                        max_depth=args.max_depth, sampling=sampling, seed=args.seed, compile=args.compile,
                        progress=True, drafter=args.drafter,
                        drafter_options=drafter_options(args.drafter, (args.ngram_min, args.ngram_max)))
    print(runner.compile_summary, file=sys.stderr)
    cost = build_cost(args.cost, pair, device, runner)
    engine = Engine(runner, Controller(policy, args.max_depth, cost=cost), eos_ids=tok.eos_ids)
    reqs = [Request(f"{i}", tok.encode(p), args.max_new_tokens, args.ignore_eos, sampling=own[i])
            for i, p in enumerate(prompts)]
    warm = next((r.prompt_ids[-32:] for r in reqs if 0 < len(r.prompt_ids) < runner.max_len - 8), None)
    if warm is not None:
        engine.warm_up(warm)  # first calls paid before the clock starts, as a server pays them at start-up
    engine.depth.cost_track = []  # the cost model's whole-step error, for the summary (timed apart)
    t0 = time.perf_counter()
    outs = engine.run(reqs)
    wall = time.perf_counter() - t0
    emit_outputs(args, prompts, outs, tok)
    print_summary(engine.stats, outs, wall, f"{policy.describe()}, drafter {args.drafter}", engine.depth.fallbacks,
                  error_line(engine.depth.cost_track))
    return 1 if any(o.error for o in outs) else 0


def result_object(prompt: str, o, tok) -> dict:
    """One request's result as --json prints it and --output writes it (`o`: a RequestOutput)."""
    return {"id": o.request_id, "prompt": prompt, "text": tok.decode(o.output_ids),
            "token_ids": o.output_ids, "finish_reason": o.finish_reason,
            "error": None if o.error is None else str(o.error), "steps": o.steps,
            "verified": o.verified, "accepted": o.accepted,
            "acceptance_length": round(o.acceptance_length, 4),
            "ttft_s": round(o.t_first - o.t_submit, 6) if o.t_first else None,
            "latency_s": round(o.t_done - o.t_submit, 6) if o.t_done else None}


def emit_outputs(args, prompts: list[str], outs, tok, stream=None) -> None:
    """Every result in input order: text or --json on stdout, errors on stderr, --output's file.

    A failed request keeps its place: an empty line in text mode, an object with its error in
    --json and --output, so output i always answers prompt i.
    """
    stream = stream or sys.stdout
    objs = [result_object(p, o, tok) for p, o in zip(prompts, outs)]
    for o, obj in zip(outs, objs):
        if o.error is not None:
            print(f"specdepth generate: error: {o.error}", file=sys.stderr)
        if args.json:
            print(json.dumps(obj), file=stream, flush=True)
        else:
            text = "" if o.error is not None else obj["text"]  # a failed request: an empty line
            stream.write(text + ("\n" if len(outs) > 1 else ""))
            stream.flush()
    if not args.json and len(outs) == 1:
        stream.write("\n")
    if getattr(args, "output", None) is not None:
        with open(args.output, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(obj) + "\n" for obj in objs)
        print(f"wrote {len(objs)} results to {args.output}", file=sys.stderr)


def finish_counts(outs) -> dict[str, int]:
    """How many requests ended for each reason: length, eos, context (the model's context limit
    reached), error (refused or failed); any other reason after these."""
    counts = dict.fromkeys(FINISH_REASONS, 0)
    for o in outs:
        reason = o.finish_reason or "unfinished"
        counts[reason] = counts.get(reason, 0) + 1
    return counts


def print_summary(stats, outs, wall: float, policy: str, fallbacks, cost_error: str | None = None) -> None:
    emitted = sum(len(o.output_ids) for o in outs)
    pos = np.round(stats.pos_accepted / np.maximum(stats.pos_verified, 1), 2)
    last = int(np.flatnonzero(stats.pos_verified).max(initial=-1)) + 1
    counts = finish_counts(outs)
    passes, host = stats.prefill_s + stats.draft_s + stats.target_s, stats.sample_s + stats.commit_s + stats.control_s
    finished = ", ".join(f"{n} {reason}" for reason, n in counts.items() if n or reason != "error")
    if counts["context"]:
        finished += " (context: stopped at the model's context limit)"
    lines = [f"policy {policy}: {len(outs)} requests, {emitted} tokens in {wall:.2f} s "
             f"= {emitted / max(wall, 1e-9):.1f} tok/s; {stats.steps} steps",
             f"finished: {finished}",
             f"acceptance length {stats.acceptance_length:.2f} (emitted per sequence-step, incl. the target's token)",
             f"per-position acceptance (position j accepted | j-1 accepted): "
             f"{pos[:last].tolist() if last else 'none verified'}",
             f"time: prefill {stats.prefill_s:.3f} s, draft {stats.draft_s:.3f} s, target {stats.target_s:.3f} s, "
             f"sampling {stats.sample_s:.3f} s, commit {stats.commit_s:.3f} s, controller {stats.control_s:.3f} s, "
             f"rest {max(wall - passes - host, 0):.3f} s; {100 * max(wall - passes, 0) / max(wall, 1e-9):.0f}% "
             "outside the model passes"]
    if cost_error:
        lines.append(cost_error)
    if fallbacks:
        lines.append(f"policy fallbacks: {dict(fallbacks)}")
    print("\n".join(lines), file=sys.stderr)


def _run_ray(args: argparse.Namespace, prompts: list[str], sampling, own: list) -> int:
    """`specdepth generate --ray`: the same run as in-process, its replicas on Ray (see cmd_generate).

    `--cost auto` profiles replica 0's pair once (cached like the in-process run: SPECDEPTH_CACHE
    or ~/.cache/specdepth) and every replica refines its own copy online. stdout carries the
    results alone: whatever Ray prints of its workers goes to stderr.
    """
    results = sys.stdout  # results only; Ray prints its workers' output to sys.stdout: to stderr here
    with contextlib.redirect_stdout(sys.stderr):
        return _run_ray_quiet(args, prompts, sampling, own, results)


def _run_ray_quiet(args: argparse.Namespace, prompts: list[str], sampling, own: list, results) -> int:
    import ray

    from specdepth.adaptive.replicas.cluster import ClusterConfig, ClusterController
    from specdepth.adaptive.cost.model import parse_cost
    from specdepth.adaptive.engine import Request
    from specdepth.adaptive.replicas.ray_local import init_ray
    from specdepth.adaptive.replicas.replica import ReplicaConfig
    from specdepth.policies.registry import make_policy
    from specdepth.workers.bundled import load_tokenizer
    from specdepth.workers.pair_spec import PairSpec

    started = init_ray(host=args.ray_host)
    tok = load_tokenizer(args.target)
    rc = ReplicaConfig(pair=PairSpec(args.target, args.draft), max_depth=args.max_depth, sampling=sampling,
                       seed=args.seed, device=args.device or "auto", threads=args.threads, compile=args.compile,
                       drafter=args.drafter, ngram=(args.ngram_min, args.ngram_max),
                       n_slots=max(1, min(args.max_batch, -(-len(prompts) // max(args.replicas, 1)))))
    policy = make_policy(args.policy)
    try:
        with ClusterController(policy, ClusterConfig(replicas=args.replicas, replica=rc)) as cc:
            if args.cost != "auto":
                cost = parse_cost(args.cost)
            else:
                cost = cc.profiled_cost()
            cc.set_cost(cost)
            reqs = [Request(f"{i}", tok.encode(p), args.max_new_tokens, args.ignore_eos, sampling=own[i])
                    for i, p in enumerate(prompts)]
            t0 = time.perf_counter()
            outs = cc.run(reqs)
            wall = time.perf_counter() - t0
            emit_outputs(args, prompts, outs, tok, results)
            print_summary(cc.stats, outs, wall, f"{policy.describe()}, drafter {args.drafter}", cc.fallbacks)
    finally:
        if started:
            ray.shutdown()
    return 1 if any(o.error for o in outs) else 0
