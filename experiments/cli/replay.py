"""`specdepth replay`: evaluate depth policies offline on recorded traces, at any load and cost.

    specdepth replay --trace traces.jsonl.gz --policy off --policy static:k=4 --policy dspark \\
        --policy oracle --concurrency 1,4,16,64,256 --cost h200 --json out.jsonl --plot out.png
    specdepth replay --trace traces.jsonl.gz --policy dspark --arrivals conv --rate-scale 0.5,1,2 --cost h200

Load is a closed loop of C clients (--concurrency) or an Azure arrival trace (--arrivals: a CSV
path, or `code` / `conv` from ../shared/data/azure-llm-2023/) with its clock sped up by each
--rate-scale. Times come from the cost model (--cost: h200 | h100 | a100[:key=value,...] |
fixed:target_ms=..,draft_ms=.. | a `specdepth profile` JSON), never from the wall clock. Greedy
traces replay exactly; sampling traces sample acceptance (flagged approximate). Prints a table
(one row per policy x load), and optionally writes JSON lines and a goodput-vs-load plot.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from specdepth.experiments.cli.argtypes import int_range, non_negative_int, positive_int
from specdepth.experiments.cli.main import report
from specdepth.experiments.cli.spec_types import (arrivals_csv, cost_spec, float_list, int_list, output_path,
                                              plot_path, policy_spec, trace_file)
from specdepth.experiments.replay.traces import TraceError, load_trace_files


ARRIVALS_DEFAULT = 1000  # arrivals replayed when --requests is not given (the Azure files hold ~10^4)
LOAD_LIMIT = 1 << 20  # largest --concurrency and --max-batch: sizes past it only exhaust memory
REQUESTS_LIMIT = 10_000_000  # largest --requests: each simulated request keeps a few arrays' entries

_ints = int_list(1, LOAD_LIMIT)  # closed-loop client counts (shared with `specdepth tune`)


def add_load_args(p: argparse.ArgumentParser) -> None:
    """--trace, --cost and the closed-loop options, shared with `specdepth tune`."""
    p.add_argument("--trace", action="append", required=True, type=trace_file,
                   help="trace file (.jsonl[.gz]); repeat to pool several")
    p.add_argument("--cost", default="h200", type=cost_spec, help="cost model spec or profile JSON (default h200)")
    p.add_argument("--max-batch", type=int_range(1, LOAD_LIMIT), default=256,
                   help="most sequences per step (default 256)")
    p.add_argument("--requests", type=int_range(0, REQUESTS_LIMIT), default=0,
                   help="closed loop: requests per run (default max(#traces, 4 C)); arrivals: the first N "
                        "(default 1000)")
    p.add_argument("--k-max", type=non_negative_int, default=0, help="largest draft budget (default the traces' K)")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("replay", help="replay depth policies on traces at given loads (goodput, latency)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_load_args(p)
    p.add_argument("--hybrid-trace", action="append", default=None, type=trace_file,
                   help="a model-free drafter's trace of the --trace requests (record --drafter suffix): "
                        "replay the hybrid drafter, each sequence's chain chosen each step by the policy")
    p.add_argument("--policy", action="append", required=True, type=policy_spec,
                   help="policy spec; repeat for several")
    load = p.add_mutually_exclusive_group(required=True)
    load.add_argument("--concurrency", type=_ints, help="closed-loop clients, e.g. 1,2,4,...,256")
    load.add_argument("--arrivals", type=arrivals_csv,
                      help="Azure CSV (TIMESTAMP,ContextTokens,GeneratedTokens), or code / conv")
    p.add_argument("--rate-scale", type=float_list(0.0, lo_open=True), default=[1.0],
                   help="arrival-rate multipliers, e.g. 0.5,1,2")
    p.add_argument("--max-output", type=positive_int, default=2048, help="arrivals: cap on output tokens per request")
    p.add_argument("--drain", action="store_true", help="closed loop: run every request to completion")
    p.add_argument("--seed", type=non_negative_int, default=0, help="sampling traces: acceptance draws")
    p.add_argument("--json", type=output_path, default=None, help="write one JSON line per run here")
    p.add_argument("--plot", type=plot_path, default=None,
                   help="goodput vs load, one line per policy (.png, .pdf or .svg)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from specdepth.experiments.replay.simulator import load_arrivals, replay  # the simulator loads torch: not for --help

    try:
        traces = load_trace_files(args.trace)
        free = load_trace_files(args.hybrid_trace) if args.hybrid_trace else None
        arrivals = load_arrivals(args.arrivals, args.requests or ARRIVALS_DEFAULT) if args.arrivals else None
    except (TraceError, ValueError, FileNotFoundError) as e:
        return report("replay", e)
    loads: list[dict[str, Any]] = ([{"concurrency": c} for c in args.concurrency] if arrivals is None
                                   else [{"arrivals": arrivals, "rate_scale": r} for r in args.rate_scale])
    rows = []
    runs = [(spec, load) for spec in args.policy for load in loads]
    for spec, load in tqdm(runs, desc="replay", unit="run", disable=args.no_progress, file=sys.stderr):
        try:
            res = replay(traces, spec, args.cost, max_batch=args.max_batch, requests=args.requests or None,
                         drain=args.drain, max_output=args.max_output, k_max=args.k_max or None,
                         seed=args.seed, free_traces=free, **load)
        except ValueError as e:
            return report("replay", e)
        rows.append(res.metrics)
    print(format_table(rows))
    if traces.header.sampling:
        print("approximate: sampling traces (acceptance drawn from the recorded 1 - TV(p, q))")
    if args.json:
        write_jsonl(rows, args.json)
        print(f"wrote {args.json}")
    if args.plot:
        plot_goodput(rows, args.plot, title=f"{traces.header.target} / {traces.header.draft}, cost {args.cost}")
        print(f"wrote {args.plot}")
    return 0


def load_key(m: dict[str, Any]) -> str:
    return "concurrency" if "concurrency" in m else "rate_scale"


def format_table(rows: list[dict[str, Any]]) -> str:
    """One row per run; `x off` is goodput relative to `off` at the same load, when it was run."""
    if not rows:
        return "(no runs)"
    key = load_key(rows[0])
    off = {m[key]: m["goodput_tok_s"] for m in rows if m["policy"] == "off"}
    cols = [("policy", 28, "s"), ("C" if key == "concurrency" else "rate", 6, "g"), ("goodput", 10, ".1f"),
            ("x off", 6, ".3f"), ("acc len", 7, ".3f"), ("step ms", 8, ".3f"), ("tpot50 ms", 9, ".2f"),
            ("tpot99 ms", 9, ".2f"), ("ttft50 ms", 9, ".1f"), ("wasted", 6, ".3f"), ("flop/tok", 8, ".3f"),
            ("steps", 7, "d"), ("seq-steps", 9, "d"), ("fallbk", 6, "d")]
    lines = [" ".join(f"{name:>{w}s}" if i else f"{name:<{w}s}" for i, (name, w, _) in enumerate(cols))]
    for m in rows:
        vals = [m["policy"], m[key], m["goodput_tok_s"],
                m["goodput_tok_s"] / off[m[key]] if off.get(m[key]) else float("nan"),
                m["acceptance_length"], m["mean_step_s"] * 1e3, m["tpot_p50_s"] * 1e3, m["tpot_p99_s"] * 1e3,
                m["ttft_p50_s"] * 1e3, m["wasted_verify_frac"], m["flops_per_token_vs_off"], m["steps"],
                m["seq_steps"], m["fallbacks"]]
        cells = [f"{v:<{w}.{w}s}" if i == 0 else f"{v:>{w}{f}}" for i, (v, (_, w, f)) in enumerate(zip(vals, cols))]
        lines.append(" ".join(cells))
    return "\n".join(lines)


def _plain(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def write_jsonl(rows: list[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for m in rows:
            f.write(json.dumps({k: _plain(v) for k, v in m.items()}) + "\n")


def plot_goodput(rows: list[dict[str, Any]], path: Path, title: str = "") -> None:
    """Goodput vs load, one line per policy (oracle dashed); log2 x for concurrency. When `off`
    was run, a second panel shows goodput relative to it at each load."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = load_key(rows[0])
    off = {m[key]: m["goodput_tok_s"] for m in rows if m["policy"] == "off"}
    fig, axes = plt.subplots(1, 2 if off else 1, figsize=(13 if off else 8, 5), squeeze=False)
    colors = plt.get_cmap("tab20").colors  # 20 distinct colours: every policy its own
    for i, pol in enumerate(dict.fromkeys(m["policy"] for m in rows)):
        pts = sorted((m[key], m["goodput_tok_s"]) for m in rows if m["policy"] == pol)
        name = pol.split(":")[0]
        style = ({"ls": "--", "color": "black"} if name == "oracle" else
                 {"ls": "-", "color": "crimson", "lw": 2.5, "zorder": 5} if name == "dspark" else
                 {"ls": "-", "color": colors[i % len(colors)], "lw": 1.2})
        axes[0, 0].plot([x for x, _ in pts], [y for _, y in pts], marker="o", ms=3, label=pol, **style)
        if off:
            rel = [(x, y / off[x]) for x, y in pts if off.get(x)]
            axes[0, 1].plot([x for x, _ in rel], [y for _, y in rel], marker="o", ms=3, label=pol, **style)
    for ax in axes[0]:
        if key == "concurrency":
            ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency (closed-loop clients)" if key == "concurrency" else "arrival rate scale")
        ax.grid(alpha=0.3, which="both")
    axes[0, 0].set_ylabel("goodput (emitted tokens / s)")
    axes[0, 0].legend(fontsize=8)
    if off:
        axes[0, 1].axhline(1.0, color="grey", lw=1)
        axes[0, 1].set_ylabel("goodput / goodput of off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
