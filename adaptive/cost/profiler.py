"""Measure a draft/target pair's step times on this machine: the table behind `ProfiledCost`.

A target step of N step tokens is timed as a verification pass really runs: ceil(N / T)
sequences of T = min(N, tokens_per_seq) new tokens each (the last one ragged), logits on, each
sequence holding an equal share of `context_tokens` in the KV cache; and in the decode shape, as a
step that drafts nothing runs: `batch` sequences of one token (`ProfiledCost`'s decode table), and
in the near shape, as a step that verifies one drafted token runs: the same with one sequence of
two tokens (the jump to a ragged pass, `ProfiledCost.jump_s`). The cache is only advanced, never
filled: attention cost depends on lengths, not values. A draft pass is `batch` sequences of one
token.

Each point is the median of its timed forwards, each after a warm-up forward. The grid is timed
in passes, every pass in a fresh shuffled order, so a slow spell of a shared machine spreads over
many points instead of landing on all the repeats of a few. Cheap points get more passes (up to
`max_repeats`, as many as fit in `point_budget_s` each): depth choices at small batches rest on
the differences between neighbouring small cells, a few percent of a pass.

The profile is taken on the path that serves: `compile="on"` times the compiled passes
(`workers/compiled.py`), compiling each shape on its first (warm-up) forward; a runner's own
compiled passes can also be given as the models.
"""

from __future__ import annotations

import math
import random
import time
from typing import Sequence

import numpy as np
import torch
from tqdm import tqdm

from specdepth.adaptive.cost.profiled import ProfiledCost
from specdepth.workers.compiled import buckets, compiled
from specdepth.workers.kv_cache import KVCache
from specdepth.workers.model import Transformer

TOKEN_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256, 512)  # fine where depth choices are made
CTX_GRID = (0, 1024, 4096, 16384)
DRAFT_BATCH_GRID = (1, 2, 4, 8, 16, 32, 64, 128)
QUICK = dict(token_grid=(1, 8, 64), ctx_grid=(0, 256), draft_batch_grid=(1, 8), repeats=2)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_forward(model: Transformer, n_tokens: int, context_tokens: int, tokens_per_seq: int,
                 repeats: int, cache: KVCache | None = None) -> float:
    """Median seconds of one ragged forward of `n_tokens` new tokens over `context_tokens` of KV.

    Args:
        model: the model or its compiled forward (its device and dtype are used).
        n_tokens: step tokens N >= 1.
        context_tokens: KV positions already held, summed over the batch.
        tokens_per_seq: new tokens per sequence T (the last sequence gets the remainder).
        repeats: timed runs (>= 1) after one warm-up.
        cache: a cache to time in (its first slots; large enough), instead of a fresh one: CUDA
            graphs capture the cache's address, so the compiled path times in one cache per model.
    """
    t = min(n_tokens, tokens_per_seq)
    b = math.ceil(n_tokens / t)
    n_new = np.full(b, t, dtype=np.int64)  # (b,)
    n_new[-1] = n_tokens - t * (b - 1)
    return time_rows(model, n_new, context_tokens, repeats, cache)


@torch.inference_mode()
def time_rows(model: Transformer, n_new: np.ndarray, context_tokens: int, repeats: int,
              cache: KVCache | None = None) -> float:
    """Median seconds of one forward of len(n_new) sequences, n_new[i] >= 1 new tokens each, over
    `context_tokens` of KV shared out equally (`time_forward`'s other arguments)."""
    device, cfg = model.device, model.cfg
    b, t = len(n_new), int(n_new.max())
    ctx = np.full(b, context_tokens // b, dtype=np.int64) + (np.arange(b) < context_tokens % b)  # (b,)
    dtype = model.embed.weight.dtype
    if cache is None:
        cache = KVCache(cfg.n_layers, b, cfg.n_kv_heads, cfg.hd, int(ctx.max()) + t, dtype, device)
    slots = list(range(b))
    slots_t = torch.tensor(slots, dtype=torch.long, device=device)  # (b,)
    cache.lengths[slots] = ctx
    tokens = (torch.arange(b * t, device=device) % cfg.vocab_size).view(b, t)  # (b, t)
    n_new_t = torch.from_numpy(n_new).to(device)  # (b,)
    times = []
    for _ in range(repeats + 1):
        _sync(device)
        t0 = time.perf_counter()
        model(cache, slots_t, tokens, n_new_t, logits=True)
        _sync(device)
        times.append(time.perf_counter() - t0)
        for s, c in zip(slots, ctx):
            cache.truncate(s, int(c))
    return float(np.median(times[1:]))


def profile(target: Transformer, draft: Transformer, device: torch.device | str | None = None,
            token_grid: Sequence[int] = TOKEN_GRID, ctx_grid: Sequence[int] = CTX_GRID,
            draft_batch_grid: Sequence[int] = DRAFT_BATCH_GRID, repeats: int = 5,
            tokens_per_seq: int = 4, quick: bool = False, progress: bool = False, max_repeats: int = 25,
            point_budget_s: float = 0.1, compile: str = "off") -> ProfiledCost:
    """Time the pair on a grid and return the (monotone) table as a `ProfiledCost`.

    Args:
        target, draft: the models, already on `device`.
        device: where they run (default: the target's device); only checked.
        token_grid: step tokens N to time the target at.
        ctx_grid: total context tokens to time both at.
        draft_batch_grid: draft batch sizes.
        repeats: timed runs per point (median), at least.
        max_repeats: at most, for points cheap enough that `point_budget_s` holds more (module doc).
        point_budget_s: seconds of timed forwards a point may take beyond its `repeats`.
        tokens_per_seq: new tokens per sequence in a target pass (a verify length + 1).
        quick: a tiny grid with 2 repeats (tests, smoke runs); overrides the grids and both repeats.
        progress: a progress bar on stderr.
        compile: "on" times the compiled passes (every grid shape bucketed), "off" the models as given.
    Returns:
        ProfiledCost whose `meta` records the device, dtype, sizes and grid settings.
    Raises:
        ValueError: models not on `device`, or a bad grid.
    """
    if quick:
        token_grid, ctx_grid = QUICK["token_grid"], QUICK["ctx_grid"]
        draft_batch_grid, repeats = QUICK["draft_batch_grid"], QUICK["repeats"]
        max_repeats = repeats
    device = torch.device(device) if device is not None else target.device
    if device.type == "cuda" and device.index is None:  # "cuda": the current CUDA device, as torch places models
        device = torch.device("cuda", torch.cuda.current_device())
    if target.device != device or draft.device != device:
        raise ValueError(f"models are on {target.device} / {draft.device}, not {device}")
    if repeats < 1 or tokens_per_seq < 1 or min(token_grid) < 1 or min(draft_batch_grid) < 1:
        raise ValueError("repeats, tokens_per_seq and grid sizes must be >= 1")
    max_repeats = max(max_repeats, repeats)
    if compile not in ("on", "off"):
        raise ValueError(f"compile must be on or off here, got {compile!r}")
    compiled_path = compile == "on" or not isinstance(target, Transformer)
    if compile == "on":
        widest = max(max(draft_batch_grid), math.ceil(max(token_grid) / tokens_per_seq))
        sizes = (buckets(widest), buckets(tokens_per_seq))
        target, draft = compiled(target, *sizes), compiled(draft, *sizes)
    caches = {}  # model -> the one cache it is timed in (CUDA graphs on the compiled path)
    if compiled_path and device.type == "cuda":
        b_max = max(max(draft_batch_grid), math.ceil(max(token_grid) / tokens_per_seq))
        for m in (target, draft):
            caches[id(m)] = KVCache(m.cfg.n_layers, b_max, m.cfg.n_kv_heads, m.cfg.hd,
                                    max(ctx_grid) + max(tokens_per_seq, 1), m.embed.weight.dtype, device)
    points = [("target", n, c) for c in ctx_grid for n in token_grid] + \
        [(kind, b, c) for kind in ("draft", "decode", "near") for c in ctx_grid for b in draft_batch_grid]
    samples: dict[tuple[str, int, int], list[float]] = {p: [] for p in points}
    want = dict.fromkeys(points, repeats)  # passes each point takes: more for cheap ones, after the first
    order = random.Random(0)
    for i in tqdm(range(max_repeats), desc="profiling (passes over the grid)", unit="pass", disable=not progress):
        todo = [p for p in points if want[p] > i]
        if not todo:
            break
        order.shuffle(todo)
        for kind, n, c in todo:
            if kind == "near":  # n sequences, the first verifying one drafted token
                samples[kind, n, c].append(time_rows(target, np.r_[2, np.ones(n - 1, np.int64)], c, 1,
                                                     caches.get(id(target))))
                continue
            model, per_seq = {"target": (target, tokens_per_seq), "draft": (draft, 1), "decode": (target, 1)}[kind]
            samples[kind, n, c].append(time_forward(model, n, c, per_seq, 1, caches.get(id(model))))
        if i == 0:
            for p in points:
                want[p] = min(max_repeats, repeats + int(point_budget_s / max(samples[p][0], 1e-9)))
    target_s = np.array([[np.median(samples["target", n, c]) for n in token_grid] for c in ctx_grid])  # (Nc, Nt)
    draft_s, decode_s, near_s = (np.array([[np.median(samples[kind, b, c]) for b in draft_batch_grid] for c in ctx_grid])
                                 for kind in ("draft", "decode", "near"))  # (Nc, Nb) each
    meta = {"device": str(device), "device_name": _device_name(device),
            "dtype": str(target.embed.weight.dtype).removeprefix("torch."),
            "target_params": target.num_params(), "draft_params": draft.num_params(),
            "repeats": repeats, "max_repeats": max_repeats, "point_budget_s": point_budget_s,
            "tokens_per_seq": tokens_per_seq, "torch": torch.__version__, "compiled": compiled_path,
            "raw_target_s": target_s.tolist(), "raw_draft_s": draft_s.tolist(), "raw_decode_s": decode_s.tolist()}
    # ProfiledCost makes the tables monotone; the raw medians stay in meta for inspection.
    return ProfiledCost(token_grid, ctx_grid, target_s, draft_batch_grid, draft_s, decode_s=decode_s, near_s=near_s,
                        meta=meta)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu x{torch.get_num_threads()} threads"
