"""`specdepth profile`: time the bundled pair's target and draft passes, write the cost table.

    specdepth profile --out cost.json [--plot cost.png] [--quick]

The JSON is a `ProfiledCost` (`--cost cost.json` elsewhere reuses this machine's curve in
replays). The plot is the picture behind the whole project: target step time is flat in the step
tokens N up to the knee (extra tokens are free compute that speculation spends) and linear after
it, so time per token falls as 1/N and then stops falling.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from specdepth.adaptive.cost.model import ProfiledCost
from specdepth.experiments.cli.argtypes import int_range
from specdepth.experiments.cli.spec_types import device_spec, int_list, output_path, plot_path, threads

DTYPES = ("auto", "float32", "bfloat16", "float16")
REPEATS_LIMIT = 1000
TOKENS_LIMIT = 4096  # step tokens of one timed pass (the default grid ends at 512)
CTX_LIMIT = 65536  # context tokens of one timed pass: its KV cache is allocated whole


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("profile", help="time the bundled pair's forwards; write a cost table JSON",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=output_path, help="where to write the ProfiledCost JSON")
    p.add_argument("--plot", type=plot_path, default=None,
                   help="also draw step time and time per token (.png, .pdf or .svg)")
    p.add_argument("--quick", action="store_true", help="tiny grid, 2 repeats (smoke test)")
    p.add_argument("--device", type=device_spec, default="auto",
                   help="cpu, cuda, cuda:1, ... (auto: cuda if available)")
    p.add_argument("--dtype", default="auto", choices=DTYPES, help="auto: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--repeats", type=int_range(1, REPEATS_LIMIT), default=5,
                   help=f"timed runs per grid point (median; 1 to {REPEATS_LIMIT})")
    p.add_argument("--token-grid", type=int_list(1, TOKENS_LIMIT, increasing=True), default=None,
                   help=f"step tokens, increasing, 1 to {TOKENS_LIMIT}: e.g. 1,2,4,...,512")
    p.add_argument("--ctx-grid", type=int_list(0, CTX_LIMIT, increasing=True), default=None,
                   help=f"total context tokens, increasing, 0 to {CTX_LIMIT}: e.g. 0,1024,4096")
    p.add_argument("--threads", type=threads, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--compile", choices=("auto", "on", "off"), default="off",
                   help="time the compiled passes (auto: where a start-up timing finds them faster)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from specdepth.adaptive.cost.profiler import CTX_GRID, TOKEN_GRID, profile
    from specdepth.workers.bundled import load_pair

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else "cpu" if args.device == "auto" else args.device)
    dtype = getattr(torch, args.dtype) if args.dtype != "auto" else (
        torch.bfloat16 if device.type == "cuda" else torch.float32)
    pair = load_pair()
    target, draft = (m.to(device=device, dtype=dtype).eval() for m in (pair.target, pair.draft))
    compile_on = args.compile == "on"
    if args.compile == "auto":  # the runner's start-up timing decides, as `generate` does
        from specdepth.workers.runner import PairRunner
        probe = PairRunner(target, draft, n_slots=1, max_depth=8, compile="auto", progress=True)
        print(probe.compile_summary)
        compile_on = probe.target_pass is not target
    cost = profile(target, draft, device, token_grid=args.token_grid or TOKEN_GRID,
                   ctx_grid=args.ctx_grid or CTX_GRID, repeats=args.repeats, quick=args.quick, progress=True,
                   compile="on" if compile_on else "off")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    cost.save(args.out)
    print(summary(cost))
    print(f"wrote {args.out}")
    if args.plot:
        plot_profile(cost, args.plot)
        print(f"wrote {args.plot}")
    return 0


def summary(cost: ProfiledCost) -> str:
    """Text table: target step time (ms) per context row and step tokens, and the knee."""
    m = cost.meta
    lines = [f"device {m.get('device_name', m.get('device', '?'))}, {m.get('dtype', '?')}: target "
             f"{m.get('target_params', 0) / 1e6:.1f}M, draft {m.get('draft_params', 0) / 1e6:.1f}M params",
             "target step ms   " + " ".join(f"{int(n):>7d}" for n in cost.token_grid) + "   (step tokens)"]
    for c, row in zip(cost.ctx_grid, cost.target_table):
        lines.append(f"  ctx {int(c):>9d}  " + " ".join(f"{t * 1e3:7.2f}" for t in row))
    lines.append("draft pass ms    " + " ".join(f"{int(b):>7d}" for b in cost.batch_grid) + "   (batch)")
    for c, row in zip(cost.ctx_grid, cost.draft_table):
        lines.append(f"  ctx {int(c):>9d}  " + " ".join(f"{t * 1e3:7.2f}" for t in row))
    if cost.base_decode is not None:
        lines.append("target decode ms " + " ".join(f"{int(b):>7d}" for b in cost.batch_grid)
                     + "   (batch of 1 token each, as a step without drafts)")
        for c, row in zip(cost.ctx_grid, cost.base_decode):
            lines.append(f"  ctx {int(c):>9d}  " + " ".join(f"{t * 1e3:7.2f}" for t in row))
    lines.append("knee (step tokens where step time starts growing at least half as fast as N): "
                 + ", ".join(f"ctx {int(c)}: {cost.knee(int(c), max_tokens=4 * int(cost.token_grid[-1]))}"
                             for c in cost.ctx_grid))
    return "\n".join(lines)


def plot_profile(cost: ProfiledCost, path: Path) -> None:
    """Two panels over step tokens N (log x): step time, and time per token, with the knee."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = np.unique(np.geomspace(1, cost.token_grid[-1], 200).round().astype(int))
    knee = cost.knee(0, max_tokens=4 * int(cost.token_grid[-1]))
    fig, (ax_t, ax_p) = plt.subplots(1, 2, figsize=(11, 4.2))
    for c in cost.ctx_grid:
        t = np.asarray(cost.target_time(n, int(c))) * 1e3
        line, = ax_t.plot(n, t, label=f"context {int(c)}")
        ax_t.plot(cost.token_grid, np.asarray(cost.target_time(cost.token_grid, int(c))) * 1e3, "o",
                  color=line.get_color(), ms=3)
        ax_p.plot(n, t / n, color=line.get_color())
        if cost.base_decode is not None:  # B sequences of one token: the step without drafts
            ax_t.plot(cost.batch_grid, cost.base_decode[list(cost.ctx_grid).index(c)] * 1e3, "x",
                      color=line.get_color(), ms=5)
    for ax in (ax_t, ax_p):
        ax.set_xscale("log", base=2)
        ax.axvspan(1, knee, color="tab:green", alpha=0.08)
        ax.axvline(knee, color="tab:green", ls="--", lw=1)
        ax.set_xlabel("step tokens N (target verification pass)")
        ax.grid(alpha=0.3, which="both")
    ax_t.text(knee, ax_t.get_ylim()[1] * 0.95, f" knee ~{knee} (context 0)", color="tab:green", va="top")
    ax_t.text(1.1, ax_t.get_ylim()[1] * 0.85, "free compute:\nflat step time", color="tab:green", va="top")
    ax_t.set_ylabel("target step time (ms); x: B sequences x 1 token")
    ax_t.legend(fontsize=8, loc="center left")
    ax_p.set_yscale("log")
    ax_p.set_ylabel("time per step token (ms)")
    ax_p.set_title("falls ~1/N below the knee, flattens past it", fontsize=9)
    m = cost.meta
    fig.suptitle(f"{m.get('device_name', m.get('device', ''))}: target {m.get('target_params', 0) / 1e6:.1f}M, "
                 f"draft {m.get('draft_params', 0) / 1e6:.1f}M params, {m.get('dtype', '')}; "
                 f"draft pass {cost.draft_time(1) * 1e3:.2f} ms at batch 1", fontsize=10)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
