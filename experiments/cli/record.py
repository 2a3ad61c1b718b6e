"""`specdepth record`: run a draft/target pair on prompts once and write its acceptance trace.

    specdepth record --out traces.jsonl.gz [--n 200] [--max-new-tokens 128] [--k-max 8]
    specdepth record --out t.jsonl.gz --prompts prompts.jsonl --target t.safetensors --draft d.safetensors

Plain decoding through the live PairRunner (one target token per step) while the drafter
(--drafter, default the draft model) proposes K tokens from the true prefix at every position;
see `experiments.replay.traces` for the format. A trace of a model-free drafter replays with
its drafts priced free.
Prompts: the bundled held-out set by default, or --prompts (JSON lines with a "prompt" field, or
plain text, one prompt per line). --temperature > 0 records a sampling trace (accept_prob).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdepth.experiments.cli.argtypes import existing_file, float_range, int_range, non_negative_int, positive_int
from specdepth.experiments.cli.main import report
from specdepth.experiments.cli.generate import add_compile_arg, add_drafter_args
from specdepth.experiments.cli.spec_types import K_LIMIT, device_spec, model_path, output_path, threads


BATCH_LIMIT = 1024  # --batch: every slot holds a full-context KV cache


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("record", help="record a draft/target pair's acceptance trace on prompts",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=output_path, help="trace file to write (.jsonl or .jsonl.gz)")
    p.add_argument("--prompts", type=existing_file, default=None,
                   help="prompt file (default: bundled held-out prompts)")
    p.add_argument("--n", type=non_negative_int, default=0, help="use the first N prompts (default all)")
    p.add_argument("--max-new-tokens", type=positive_int, default=128, help="output tokens per request")
    p.add_argument("--k-max", type=int_range(1, K_LIMIT), default=8,
                   help=f"draft chain length K recorded per position (1 to {K_LIMIT})")
    p.add_argument("--target", type=model_path, default=None,
                   help="target model (.safetensors or HF folder); with --draft")
    p.add_argument("--draft", type=model_path, default=None,
                   help="draft model; with --target (default: the bundled pair)")
    p.add_argument("--batch", type=int_range(1, BATCH_LIMIT), default=16,
                   help=f"sequences decoded together (1 to {BATCH_LIMIT})")
    p.add_argument("--temperature", type=float_range(0.0), default=0.0, help="> 0: record a sampling trace")
    p.add_argument("--seed", type=int_range(0, 2**64 - 1), default=0, help="sampling seed")
    p.add_argument("--device", type=device_spec, default=None,
                   help="cpu, cuda, ... (default: cuda when available)")
    p.add_argument("--threads", type=threads, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_drafter_args(p, default="model")
    add_compile_arg(p)
    p.set_defaults(func=run)


def read_prompts(path: Path) -> list[str | list[int]]:
    """Prompts from JSON lines ({"prompt": text or [token ids]}) or plain text lines (a literal
    backslash-n is a newline). Raises ValueError naming the file and line."""
    out: list[str | list[int]] = []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                prompt = json.loads(line)["prompt"]
                ok = isinstance(prompt, str) or (isinstance(prompt, list) and all(
                    isinstance(t, int) and not isinstance(t, bool) for t in prompt))
                if not ok:
                    raise TypeError("prompt must be text or a list of token ids")
            except (ValueError, KeyError, TypeError, RecursionError) as e:  # JSON, digits, nesting
                raise ValueError(f"{path}:{n}: expected a JSON object with a \"prompt\" field ({e})") from None
            out.append(prompt)
        else:
            out.append(line.replace("\\n", "\n"))
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out


def run(args: argparse.Namespace) -> int:
    import torch

    from specdepth.experiments.replay.traces import record_traces
    from specdepth.workers.bundled import heldout_prompts, load_pair
    from specdepth.workers.drafters.registry import drafter_options

    if args.ngram_min > args.ngram_max:
        return report("record", ValueError(f"--ngram-min {args.ngram_min} is above --ngram-max {args.ngram_max}"))
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        prompts = read_prompts(args.prompts) if args.prompts else heldout_prompts()
        pair = load_pair(args.target, args.draft, device=args.device)
        prompts = prompts[: args.n] if args.n else prompts
        traces = record_traces(pair, prompts, k_max=args.k_max, max_new_tokens=args.max_new_tokens,
                               batch=args.batch, progress=not args.no_progress, temperature=args.temperature,
                               seed=args.seed, compile=args.compile, drafter=args.drafter,
                               drafter_options=drafter_options(args.drafter, (args.ngram_min, args.ngram_max)))
    except (ValueError, FileNotFoundError) as e:
        return report("record", e)
    traces.save(args.out)
    m = traces.match
    print(f"wrote {args.out}: {len(traces)} requests, {len(m)} positions, K = {args.k_max}; "
          f"P(first draft token accepted) = {(m > 0).mean():.3f}, mean match {m.mean():.2f}")
    return 0
