"""GPU readiness: profile an 8B Llama-shaped target (random init, bf16, no download) and a 1B
draft on this GPU, eagerly and on the compiled path (CUDA graphs), write the cost tables, run the
losslessness tests on the device on both paths, and a short live benchmark of the bundled pair.

    python -m specdepth.experiments.bench.gpu_check --out DIR        # on a GPU: the full check
    python -m specdepth.experiments.bench.gpu_check --out DIR --tiny # tiny sizes (automatic on a CPU)

Writes DIR/profile-<size>-<dtype>-<device>[-compiled].json (ProfiledCosts: `--cost` reuses this
GPU's curves in replays), DIR/lossless.log, DIR/bench_live.json (+ .log) and DIR/gpu_check.json,
and prints a short table per path: step time against step tokens, the knee, the draft pass, and
the tests' result. Timings are synchronised (adaptive.cost.profiler calls torch.cuda.synchronize around
every timed forward). The compiled profile takes a smaller grid (each shape is one graph to
compile and capture); tiny mode (the CPU test) profiles eagerly and runs the eager tests only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

from specdepth.adaptive.cost.profiler import profile
from specdepth.experiments.cli.profile import summary
from specdepth.workers.model import ModelConfig, Transformer

REPO = Path(__file__).resolve().parents[2]
# Llama-3-8B and Llama-3.2-1B shapes (vocabulary shared, as a draft/target pair needs).
LLAMA_8B = ModelConfig(vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336,
                       max_seq_len=20480, rope_theta=500000.0, tie_embeddings=False)
LLAMA_1B = ModelConfig(vocab_size=128256, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192,
                       max_seq_len=20480, rope_theta=500000.0, tie_embeddings=True)
TINY_TARGET = ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=512)
TINY_DRAFT = ModelConfig(vocab_size=256, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=512)
FULL_GRID = dict(token_grid=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048), ctx_grid=(0, 1024, 4096, 16384),
                 draft_batch_grid=(1, 2, 4, 8, 16, 32, 64, 128), repeats=5)
TINY_GRID = dict(token_grid=(1, 8, 64), ctx_grid=(0, 256), draft_batch_grid=(1, 8), repeats=2)
# the compiled path's grid: the batch-1 goals (1-token pass, 8-token verify, draft pass) and a few more
# (each shape is one 8B graph to compile: three in all, a one-token pass, an 8-token verify, the draft pass)
COMPILED_GRID = dict(token_grid=(1, 8), ctx_grid=(0, 4096), draft_batch_grid=(1,), repeats=5, tokens_per_seq=8)
# bench_live on the bundled pair: off, static depths, dspark; small enough for the 8-minute budget
BENCH = ["--batches", "1", "--rounds", "1", "--warmup", "32", "--warm-steps", "16", "--steps", "48",
         "--tokens", "32", "--solo", "0", "--policies", "off,static:k=2,static:k=4,static:k=6,dspark"]


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


@torch.no_grad()
def random_model(cfg: ModelConfig, device: str, dtype: torch.dtype, seed: int) -> Transformer:
    """Built directly on `device` in `dtype` (an 8B model never touches host memory), normal(0, 0.02)
    weights drawn on the device (values do not matter for timing, only shapes)."""
    with torch.device(device), default_dtype(dtype):
        model = Transformer(cfg)
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if not name.endswith("norm.weight"):
            p.normal_(0.0, 0.02, generator=gen)
    return model.eval()


def run_lossless_tests(device: str, out: Path, select: str | None, sampling: bool, timeout_s: float) -> dict:
    """pytest tests/workers/test_lossless_greedy.py (and with `sampling`, test_lossless_sampling.py),
    eager and compiled (CUDA graphs on a GPU), with SPECDEPTH_DEVICE=device (tests/pairs.py)."""
    files = ["tests/workers/test_lossless_greedy.py"] + (["tests/workers/test_lossless_sampling.py"] if sampling else [])
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files]
    if select:
        cmd += ["-k", select]
    env = dict(os.environ, SPECDEPTH_DEVICE=device, PYTHONPATH=str(REPO))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
        rc, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, text = "timeout", f"{_text(e.stdout)}{_text(e.stderr)}\nstopped after {timeout_s:.0f} s"
    wall = time.perf_counter() - t0
    (out / "lossless.log").write_text(text)
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|error|errors|skipped)", text)}
    return {"returncode": rc, "seconds": round(wall, 1), **counts}


def _text(b: bytes | str | None) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def run_bench_live(device: str, out: Path, timeout_s: float) -> dict:
    """bench_live on `device`, compiled, for off, static depths and dspark (`BENCH`)."""
    cmd = [sys.executable, "-m", "specdepth.experiments.bench.live", "--device", device, "--compile", "on",
           "--out", str(out / "bench_live.json"), *BENCH]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True,
                              text=True, timeout=timeout_s)
        rc, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, text = "timeout", f"{_text(e.stdout)}{_text(e.stderr)}\nstopped after {timeout_s:.0f} s"
    (out / "bench_live.log").write_text(text)
    return {"returncode": rc, "seconds": round(time.perf_counter() - t0, 1), "json": str(out / "bench_live.json")}


def batch1_goals(eager, compiled) -> dict:
    """The issue's batch-1 figures per path: one-token and 8-token target passes, the draft pass (ms)."""
    return {name: {"target_1_ms": round(float(c.target_time(1)) * 1e3, 3),
                   "target_8_ms": round(float(c.target_time(8)) * 1e3, 3),
                   "draft_1_ms": round(float(c.draft_time(1)) * 1e3, 3)}
            for name, c in (("eager", eager), ("compiled", compiled)) if c is not None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_check_out")),
                    help="folder for the results (default: $OUT, else ./gpu_check_out)")
    ap.add_argument("--device", default="auto", help="cuda, cuda:1, cpu (auto: cuda when available)")
    ap.add_argument("--tiny", action="store_true", help="tiny models and grid (automatic on a CPU)")
    ap.add_argument("--skip-tests", action="store_true", help="profile only")
    ap.add_argument("--skip-compiled", action="store_true", help="no compiled profile (automatic in tiny mode)")
    ap.add_argument("--bench-timeout", type=float, default=180.0, help="seconds bench_live may take (GPU only)")
    ap.add_argument("--tests-timeout", type=float, default=240.0, help="seconds the losslessness tests may take")
    ap.add_argument("--tests", default=None, help="pytest -k expression for the losslessness tests "
                    "(default: the compiled variants on a GPU (CUDA graphs), the quick eager one in tiny mode)")
    args = ap.parse_args(argv)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    tiny = args.tiny or not device.startswith("cuda")
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    args.out.mkdir(parents=True, exist_ok=True)
    tcfg, dcfg, grid = (TINY_TARGET, TINY_DRAFT, TINY_GRID) if tiny else (LLAMA_8B, LLAMA_1B, FULL_GRID)
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 tests stay fp32; bf16 is unaffected
        print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    t0 = time.perf_counter()
    target = random_model(tcfg, device, dtype, seed=0)
    draft = random_model(dcfg, device, dtype, seed=1)
    t_build = time.perf_counter() - t0
    cost = profile(target, draft, device, **grid)
    t_prof = time.perf_counter() - t0 - t_build
    size = "tiny" if tiny else "llama8b-1b"
    path = args.out / f"profile-{size}-{str(dtype).removeprefix('torch.')}-{device.replace(':', '')}.json"
    cost.save(path)
    comp, comp_path, t_comp = None, None, 0.0
    if not (tiny or args.skip_compiled):
        t1 = time.perf_counter()
        comp = profile(target, draft, device, compile="on", progress=True, **COMPILED_GRID)
        t_comp = time.perf_counter() - t1
        comp_path = path.with_name(path.stem + "-compiled.json")
        comp.save(comp_path)
    del target, draft
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    tests = None if args.skip_tests else run_lossless_tests(
        device, args.out, args.tests if args.tests is not None else ("off_and_static and eager" if tiny else "compiled"),
        sampling=not tiny, timeout_s=args.tests_timeout)
    bench = run_bench_live(device, args.out, args.bench_timeout) if device.startswith("cuda") else None
    result = {"device": device, "tiny": tiny, "dtype": str(dtype), "profile": str(path),
              "profile_compiled": str(comp_path) if comp_path else None,
              "build_s": round(t_build, 1), "profile_s": round(t_prof, 1), "profile_compiled_s": round(t_comp, 1),
              "knee_ctx0": cost.knee(0),
              "target_ms_ctx0": {int(n): round(float(cost.target_time(int(n))) * 1e3, 3) for n in cost.token_grid},
              "draft_ms_batch1": round(cost.draft_time(1) * 1e3, 3), "batch1": batch1_goals(cost, comp),
              "lossless_tests": tests, "bench_live": bench}
    (args.out / "gpu_check.json").write_text(json.dumps(result, indent=1) + "\n")
    print(summary(cost))
    if comp is not None:
        print("\ncompiled path (CUDA graphs):\n" + summary(comp))
    print(f"\nbuilt in {t_build:.1f} s, profiled in {t_prof:.1f} s (compiled: {t_comp:.1f} s); wrote {path}")
    print(f"batch 1 (ms): {json.dumps(result['batch1'])}")
    if bench is not None:
        print(f"bench_live on {device}: returncode {bench['returncode']}, {bench['seconds']} s; log {args.out / 'bench_live.log'}")
    if tests is not None:
        ok = tests["returncode"] == 0
        print(f"losslessness tests on {device}: {'PASS' if ok else 'FAIL'} "
              f"({tests.get('passed', 0)} passed, {tests.get('failed', 0)} failed, {tests['seconds']} s); "
              f"log {args.out / 'lossless.log'}")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
