"""`specdepth synth`: synthetic acceptance traces with a known acceptance process.

    specdepth synth --out syn.jsonl.gz --requests 200 --tokens 256 --seed 0 --alpha 0.8
    specdepth synth --out syn.jsonl.gz --requests 200 --tokens 256 --seed 0 --curve 0.94,0.86,0.8

Each output position t of a request draws, for every chain position j, an acceptance probability
p_{t,j} ~ Beta(alpha_j * kappa, (1 - alpha_j) * kappa) (mean exactly alpha_j; the curve's last
value repeats past its end) and an outcome ~ Bernoulli(p_{t,j}), independently, so match[t] is the
run of leading successes and static-k replays reproduce Leviathan's formulas. The confidence
features carry p_{t,j} through noise: top1 = sigmoid(slope * logit(p) + bias + noise * N(0, 1)),
so P(accept | top1) is smooth and monotone but not equal to top1 (calibratable, not an oracle);
entropy is that of a distribution with top1 on one token and the rest spread over 20, jittered.
With --temperature > 0 the trace is a sampling trace and accept_prob = p_{t,j}.
"""

from __future__ import annotations

import argparse

import numpy as np

from specdepth.experiments.cli.argtypes import float_range, int_range, non_negative_int, positive_int
from specdepth.experiments.cli.spec_types import K_LIMIT, float_list, output_path
from specdepth.experiments.replay.traces import TraceHeader, TraceRequest, TraceSet

SPREAD = 20  # tokens sharing the draft's non-top-1 mass, for the synthetic entropy
PROMPT_LIMIT = 10_000_000  # --prompt-len: far past any model's context
CELLS_LIMIT = 100_000_000  # requests x tokens x K: the arrays of one trace stay within a few GB


def _curve(alpha: float | None, curve: tuple[float, ...] | None, K: int) -> np.ndarray:
    """(K,) conditional acceptance probability per chain position."""
    if (alpha is None) == (curve is None):
        raise ValueError("give exactly one of alpha or curve")
    vals = np.full(K, alpha, np.float64) if curve is None else np.array(
        [curve[min(j, len(curve) - 1)] for j in range(K)], np.float64)
    if len(vals) == 0 or not ((vals >= 0) & (vals <= 1)).all():
        raise ValueError(f"acceptance probabilities must be in [0, 1], got {vals.tolist()}")
    return vals


def synth_traces(requests: int, tokens: int, seed: int = 0, alpha: float | None = None,
                 curve: tuple[float, ...] | None = None, k_max: int = 8, prompt_len: int = 256,
                 temperature: float = 0.0, concentration: float = 4.0, noise: float = 0.5,
                 slope: float = 0.7, bias: float = 1.0) -> TraceSet:
    """Synthetic traces (see the module docstring for the process).

    Args:
        requests, tokens: R requests of T output tokens each.
        seed: the only source of randomness.
        alpha / curve: i.i.d. acceptance alpha, or per-position values (last one repeats).
        k_max: K, chain length.
        prompt_len: each request's prompt tokens (the cost model's context term).
        temperature: 0: greedy trace; > 0: sampling trace with accept_prob.
        concentration: kappa of the Beta spread of p around alpha_j (larger: less informative).
        noise, slope, bias: top1 = sigmoid(slope * logit(p) + bias + noise * N(0, 1)).
    Raises:
        ValueError: bad sizes or probabilities.
    """
    if requests < 1 or tokens < 1 or k_max < 1 or prompt_len < 0 or concentration <= 0 or noise < 0:
        raise ValueError("need requests, tokens, k_max >= 1, prompt_len >= 0, concentration > 0, noise >= 0")
    a = _curve(alpha, curve, k_max)  # (K,)
    rng = np.random.default_rng(seed)
    out = []
    f32 = (lambda x: x.astype(np.float32).astype(np.float64))  # as a file stores it: loaded == in memory
    for i in range(requests):
        inner = (a > 0) & (a < 1)
        p = np.broadcast_to(a, (tokens, k_max)).copy()  # (T, K)
        p[:, inner] = rng.beta(a[inner] * concentration, (1 - a[inner]) * concentration,
                               size=(tokens, int(inner.sum())))
        ok = rng.random((tokens, k_max)) < p  # (T, K) would chain position j be accepted at t
        match = np.minimum(np.cumprod(ok, axis=1).sum(1), tokens - np.arange(tokens))  # (T,)
        z = slope * np.log(np.clip(p, 1e-4, 1 - 1e-4) / np.clip(1 - p, 1e-4, 1)) + bias
        with np.errstate(over="ignore"):  # a huge --noise saturates the sigmoid at 0 or 1, as it should
            top1 = 1 / (1 + np.exp(-(z + noise * rng.standard_normal((tokens, k_max)))))
        top1 = np.clip(top1, 1e-4, 1.0)
        rest = np.clip(1 - top1, 1e-12, 1)
        ent = -(top1 * np.log(top1) + rest * np.log(rest / SPREAD))
        ent = np.maximum(ent * np.exp(0.2 * rng.standard_normal((tokens, k_max))), 0.0)
        toks = rng.integers(0, 32000, tokens)
        out.append(TraceRequest(f"syn{i}", prompt_len, toks.astype(np.int64), match.astype(np.int64),
                                f32(top1), f32(ent), f32(p) if temperature > 0 else None))
    meta = {"source": "synth", "seed": seed, "alpha": alpha, "curve": list(curve) if curve else None,
            "concentration": concentration, "noise": noise, "slope": slope, "bias": bias}
    return TraceSet(TraceHeader("synthetic", "synthetic", "none", k_max, float(temperature), meta=meta), out)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("synth", help="write synthetic acceptance traces (known alpha or curve)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=output_path, help="trace file to write (.jsonl or .jsonl.gz)")
    p.add_argument("--requests", type=positive_int, required=True, help="number of requests")
    p.add_argument("--tokens", type=positive_int, required=True, help="output tokens per request")
    p.add_argument("--seed", type=non_negative_int, default=0)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--alpha", type=float_range(0.0, 1.0), help="i.i.d. acceptance probability of every draft position")
    g.add_argument("--curve", type=_curve_arg, help="per-position acceptance, e.g. 0.94,0.86,0.8 (last repeats)")
    p.add_argument("--k-max", type=int_range(1, K_LIMIT), default=8,
                   help=f"chain length K recorded per position (1 to {K_LIMIT})")
    p.add_argument("--prompt-len", type=int_range(0, PROMPT_LIMIT), default=256,
                   help="prompt tokens per request (cost context)")
    p.add_argument("--temperature", type=float_range(0.0), default=0.0, help="> 0: a sampling trace with accept_prob")
    p.add_argument("--concentration", type=float_range(0.0, lo_open=True), default=4.0,
                   help="Beta concentration of p around alpha (> 0)")
    p.add_argument("--noise", type=float_range(0.0), default=0.5, help="noise on logit(top1) (>= 0)")
    p.set_defaults(func=run)


def _curve_arg(text: str) -> tuple[float, ...]:
    return tuple(float_list(0.0, 1.0)(text))


def run(args: argparse.Namespace) -> int:
    cells = args.requests * args.tokens * args.k_max
    if cells > CELLS_LIMIT:
        raise ValueError(f"--requests x --tokens x --k-max = {cells} chain positions; at most {CELLS_LIMIT}")
    traces = synth_traces(args.requests, args.tokens, args.seed, args.alpha, args.curve, args.k_max,
                          args.prompt_len, args.temperature, args.concentration, args.noise)
    traces.save(args.out)
    acc = traces.match.mean()
    print(f"wrote {args.out}: {len(traces)} requests x {args.tokens} tokens, K = {args.k_max}, "
          f"mean match {acc:.2f}")
    return 0
