"""Cold benchmark: what a user's first `specdepth generate` sees, policy against policy.

    python -m specdepth.experiments.bench.cold [--batches 1,16,64] [--kinds code,prose] [--rounds 6]
        [--tokens 96] [--all | --variant off --variant dspark@ngram ...]

Every run is a fresh `specdepth generate` process with default flags except the policy, the
drafter (`POLICY@DRAFTER`, default drafter `model`), `--max-batch`, `--max-new-tokens` and
`--ignore-eos`; its tokens/s is generate's own (the whole run, prefill included, process
start-up excluded; that is reported apart). Prompts are held out from the pair's training: code
(function headers and first lines) and prose (docstring paragraphs). In each round every
(kind, batch) cell runs every variant once, in a fresh shuffled order, on the same prompts;
rounds take different prompts. A variant's figure is its paired ratio to `off` in the same
round and cell: the median over rounds, with the lowest and highest. The cost profile is taken
once before timing, and every variant runs once untimed (a user pays the profile and numba's
compiles once per machine; both are cached). Results are written after every run.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from specdepth.experiments.cli.argtypes import positive_int
from specdepth.experiments.results_io import default_out, stamp, table, write_result

# off, static depth 1 and dspark with the draft model, then static depth 8 and dspark with the
# default drafter (suffix)
DEFAULT_VARIANTS = ("off", "static:k=1", "dspark", "static:k=8@suffix", "dspark@suffix")
# --all adds the other model-free drafters and the hybrid against Arctic Inference's rule
MORE_VARIANTS = ("static:k=4@ngram", "static:k=8@ngram", "dspark@ngram", "arctic-hybrid@hybrid", "dspark@hybrid")
SUMMARY = {  # what generate's summary on stderr says, read back
    "tps": re.compile(r"= ([0-9.]+) tok/s; (\d+) steps"),
    "acc": re.compile(r"acceptance length ([0-9.]+)"),
    "time": re.compile(r"time: prefill ([0-9.]+) s, draft ([0-9.]+) s, target ([0-9.]+) s, "
                       r"sampling ([0-9.]+) s, commit ([0-9.]+) s, controller ([0-9.]+) s, rest ([0-9.]+) s"),
    "cost_err": re.compile(r"cost model: whole-step time predicted within ([0-9.]+)%"),
}
SPLIT = ("prefill", "draft", "target", "sample", "commit", "control", "rest")  # the summary's time split, in its order


def split_variant(v: str) -> tuple[str, str]:
    """`POLICY[@DRAFTER]` -> (policy, drafter)."""
    policy, _, drafter = v.partition("@")
    return policy, drafter or "model"


def variant_list(asked: list[str] | None, every: bool) -> list[str]:
    """The variants a run times: off first, then those asked (default: DEFAULT_VARIANTS), then
    MORE_VARIANTS with --all; each once."""
    return list(dict.fromkeys(["off", *(asked or DEFAULT_VARIANTS), *(MORE_VARIANTS if every else ())]))


def prompt_sets(kind: str) -> list[str]:
    """The held-out prompts of a kind: code (the bundled set) or prose (docstring paragraphs)."""
    if kind == "code":
        from specdepth.workers.bundled import heldout_prompts
        return heldout_prompts()
    from specdepth.experiments.training.corpus import cut_prose, split_files
    return cut_prose(split_files()[1])


def run_generate(prompts: list[str], variant: str, batch: int, tokens: int, extra: list[str]) -> dict:
    """One fresh `specdepth generate`; returns its summary's figures and the process's wall time.

    Raises:
        RuntimeError: generate failed (its last stderr lines say why).
    """
    policy, drafter = split_variant(variant)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.writelines(json.dumps({"prompt": p}) + "\n" for p in prompts)
    cmd = [sys.executable, "-m", "specdepth.experiments.cli.main", "generate", "--prompts", f.name,
           "--policy", policy, "--drafter", drafter, "--max-batch", str(batch), "--ignore-eos",
           "--max-new-tokens", str(tokens), *extra]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    Path(f.name).unlink()
    if out.returncode != 0:
        raise RuntimeError(f"{variant} at batch {batch} failed: {out.stderr.strip().splitlines()[-3:]}")
    tps, steps = SUMMARY["tps"].search(out.stderr).groups()
    split = dict(zip(SPLIT, map(float, SUMMARY["time"].search(out.stderr).groups())))
    err = SUMMARY["cost_err"].search(out.stderr)
    return {"tps": float(tps), "steps": int(steps), "acc": float(SUMMARY["acc"].search(out.stderr).group(1)),
            **{f"{k}_s": v for k, v in split.items()}, "process_s": wall,
            "cost_err": float(err.group(1)) / 100 if err else None,
            "tokens": len(prompts) * tokens}


def summarise(runs: list[dict], variants: list[str]) -> tuple[list[dict], list[list]]:
    """Per (kind, batch, variant): median tok/s, paired ratio to off (median, min, max), acceptance."""
    rows, cells = [], sorted({(r["kind"], r["batch"]) for r in runs})
    for kind, batch in cells:
        by = {(r["variant"], r["round"]): r for r in runs if r["kind"] == kind and r["batch"] == batch}
        for v in variants:
            mine = [r for (vv, _), r in by.items() if vv == v]
            if not mine:
                continue
            ratios = [r["tps"] / by[("off", r["round"])]["tps"] for r in mine if ("off", r["round"]) in by]
            rows.append({"kind": kind, "batch": batch, "variant": v, "rounds": len(mine),
                         "tps": float(np.median([r["tps"] for r in mine])),
                         "acc": float(np.median([r["acc"] for r in mine])),
                         "ratio": float(np.median(ratios)) if ratios else None,
                         "ratio_lo": min(ratios, default=None), "ratio_hi": max(ratios, default=None),
                         "cost_err": _median([r.get("cost_err") for r in mine]),
                         "split": {k: float(np.median([r[f"{k}_s"] / max(r["tokens"] / r["tps"], 1e-9) for r in mine]))
                                   for k in SPLIT}})
    table_rows = [[r["kind"], r["batch"], r["variant"], r["tps"], r["acc"], r["ratio"],
                   None if r["ratio"] is None else f"[{r['ratio_lo']:.2f}, {r['ratio_hi']:.2f}]",
                   None if r["cost_err"] is None else f"{r['cost_err']:.1%}", r["rounds"]]
                  for r in rows]
    return rows, table_rows


def split_rows(rows: list[dict]) -> list[list]:
    """Per (kind, batch, variant): each part's median share of the run's generate time, and the
    share outside the model passes (everything but prefill, draft and target)."""
    return [[r["kind"], r["batch"], r["variant"], *(r["split"][k] for k in SPLIT),
             1.0 - r["split"]["prefill"] - r["split"]["draft"] - r["split"]["target"]] for r in rows]


def _median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return float(np.median(xs)) if xs else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,16,64", help="batch sizes (--max-batch), comma-separated")
    ap.add_argument("--kinds", default="code,prose", help="prompt kinds: code, prose")
    ap.add_argument("--rounds", type=positive_int, default=6)
    ap.add_argument("--tokens", type=positive_int, default=96, help="--max-new-tokens, with --ignore-eos")
    ap.add_argument("--prompts-at-1", type=positive_int, default=4, help="prompts per run at batch 1")
    ap.add_argument("--variant", action="append", default=None,
                    help=f"POLICY[@DRAFTER], repeatable; `off` always runs (default: {' '.join(DEFAULT_VARIANTS)})")
    ap.add_argument("--all", action="store_true",
                    help=f"the default variants and {' '.join(MORE_VARIANTS)} (each round takes twice as long)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=default_out("bench_cold"))
    ap.add_argument("extra", nargs="*", help="after --: more generate flags, for every run")
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    kinds = args.kinds.split(",")
    if bad := [k for k in kinds if k not in ("code", "prose")]:
        ap.error(f"--kinds: unknown kind {bad[0]!r}; expected code, prose")
    if args.all and args.variant:
        ap.error("--all and --variant: choose one")
    variants = variant_list(args.variant, args.all)
    meta, rng = stamp(), random.Random(args.seed)
    pools = {k: prompt_sets(k) for k in kinds}
    print("taking the cost profile (cached after the first time) ...", file=sys.stderr)
    run_generate(pools[kinds[0]][:1], "dspark", 1, 4, args.extra)  # untimed: profiles once, warms the disk cache
    for v in variants:  # untimed: what a machine pays once (numba compiles each path's kernels, then caches them)
        run_generate(pools[kinds[0]][:2], v, 2, 16, args.extra)
    runs: list[dict] = []
    cells = [(k, b) for b in batches for k in kinds]
    bar = tqdm(total=args.rounds * len(cells) * len(variants), desc="bench_cold", unit="run")
    for rnd in range(args.rounds):
        for kind, batch in cells:
            n = args.prompts_at_1 if batch == 1 else batch
            pool = pools[kind]
            start = (rnd * n) % len(pool)
            prompts = [pool[(start + i) % len(pool)] for i in range(n)]  # the same for every variant
            for v in rng.sample(variants, len(variants)):
                r = run_generate(prompts, v, batch, args.tokens, args.extra)
                runs.append({"round": rnd, "kind": kind, "batch": batch, "variant": v, **r})
                bar.update()
                rows, table_rows = summarise(runs, variants)
                write_result(args.out, "bench_cold", {
                    "tables": [table("Cold runs: tokens/s (prefill included) and the paired ratio to off",
                                     ["prompts", "batch", "policy@drafter", "tok/s", "acc len", "x off",
                                      "x off [min, max]", "step err", "rounds"], table_rows,
                                     ["", "d", "", ".1f", ".2f", ".3f", "", "", "d"]),
                               table("Where a cold run's time goes: shares of generate's wall time (median)",
                                     ["prompts", "batch", "policy@drafter", *SPLIT, "outside passes"],
                                     split_rows(rows), ["", "d", "", *[".3f"] * (len(SPLIT) + 1)])],
                    "notes": [f"{args.tokens} new tokens per request; {args.prompts_at_1} prompts at batch 1, "
                              f"B at batch B; {args.rounds} rounds; step err: the cost model's median error on a "
                              f"whole step's time, steps 50 on (generate's summary); process start-up (median): "
                              f"{np.median([r['process_s'] - r['tokens'] / r['tps'] for r in runs]):.1f} s"],
                    "summary": rows, "runs": runs}, meta)
    bar.close()
    for row in [*table_rows, [], *split_rows(rows)]:
        print(" | ".join(str(c) if not isinstance(c, float) else f"{c:.3f}" for c in row))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
