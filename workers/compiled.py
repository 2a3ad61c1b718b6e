"""Compiled passes: a model's ragged forward as a few fixed-shape graphs (inductor on CPU, CUDA graphs).

An eager pass launches a few hundred small ops from Python; on a small model or a fast GPU the
launches, not the arithmetic, set its time. `CompiledModel` runs the same forward through
`torch.compile`, over the same KV cache, at a few shape buckets, as gpt-fast and vLLM do:

- the batch is padded to a batch bucket (1, 2, 4, ... up to the slot count) and every row to a
  token-width bucket (1, 2, 4, K + 1); a padded row writes its keys to the cache's scratch column
  (`kv_cache.py`), a padded token of a real row writes past its sequence's new length (never read);
- attention reads each slot's live prefix only, rounded up to a multiple of `SPAN_STEP` and marked
  dynamic, so one graph serves every context length;
- on CPU inductor's freezing folds the weights into the graph (oneDNN/MKL prepacked), on CUDA the
  graph is captured once per shape (`mode="reduce-overhead"`).

A shape outside the buckets, or a pass without logits (prefill), runs eagerly: the compiled and
the eager forwards compute the same function (only rounding differs), so the path never changes
what is decided. Compiled code is cached on disk under specdepth's cache directory
(`cache_dir()`), so a later start loads it instead of compiling.
"""

from __future__ import annotations

import os
import sys
import time
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from specdepth.workers.cache import cache_dir
from specdepth.workers.kv_cache import KVCache
from specdepth.workers.model import Transformer, apply_rope

MODES = ("auto", "on", "off")
SPAN_STEP = {"cpu": 64, "cuda": 256}  # attention spans are rounded up to a multiple of this


def configure(device: torch.device) -> None:
    """Point inductor's on-disk cache under `cache_dir()`, allow one graph per bucket, and on CPU
    turn freezing on (weights become constants, prepacked for the GEMM library)."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir() / "inductor"))
    import torch._dynamo
    import torch._inductor.config as inductor_config
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
    torch._dynamo.config.accumulated_cache_size_limit = max(torch._dynamo.config.accumulated_cache_size_limit, 1024)
    if device.type == "cpu":
        inductor_config.freezing = True


def buckets(limit: int) -> tuple[int, ...]:
    """Powers of two below `limit`, then `limit` itself: (1, 2, 4, ..., limit)."""
    out, b = [], 1
    while b < limit:
        out.append(b)
        b *= 2
    return tuple(out) + (limit,)


class _StaticForward(nn.Module):
    """The ragged forward on padded, fixed-shape inputs: what gets compiled. Same layers and the
    same arithmetic as `Transformer.forward` (projections through F.linear, so that inductor
    sees, and on CPU prepacks, plain weights)."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, kc: torch.Tensor, vc: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor,
                wpos: torch.Tensor, slots: torch.Tensor, wslots: torch.Tensor, mask: torch.Tensor,
                rows: torch.Tensor) -> torch.Tensor:
        """kc, vc: (L, slots, nkv, P, hd) the cache; tokens, pos, wpos, wslots: (B, T) long (RoPE
        position, cache position and slot of each token); slots: (B,) long; mask: (B, 1, rep*T, S)
        bool; rows: (R,) long rows of the flat (B*T) batch to return logits for -> (R, V) float."""
        m, cfg = self.model, self.model.cfg
        hd, (B, T), S = cfg.hd, tokens.shape, mask.shape[-1]
        rep = cfg.n_heads // cfg.n_kv_heads
        cos, sin = m.rope_cos[pos], m.rope_sin[pos]  # (B, T, hd)
        layer_ix = torch.arange(cfg.n_layers, device=tokens.device)  # (L,)
        heads = torch.arange(cfg.n_kv_heads, device=tokens.device)  # (nkv,)
        x = F.embedding(tokens, m.embed.weight)  # (B, T, dim)
        for i, blk in enumerate(m.layers):
            a, mlp = blk.attn, blk.mlp
            h = blk.attn_norm(x)
            q = F.linear(h, a.wq.weight, a.wq.bias).view(B, T, cfg.n_heads, hd)
            k = F.linear(h, a.wk.weight, a.wk.bias).view(B, T, cfg.n_kv_heads, hd)
            v = F.linear(h, a.wv.weight, a.wv.bias).view(B, T, cfg.n_kv_heads, hd)
            if a.q_norm is not None:
                q, k = a.q_norm(q), a.k_norm(k)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            # one index_put_ on the whole cache (no view of it): inductor writes it in place, where
            # a write through kc[i] made it copy the cache back every call
            where = (layer_ix[i], wslots[:, :, None], heads[None, None, :], wpos[:, :, None])  # (B, T, nkv) each
            kc.index_put_(where, k.to(kc.dtype))  # (B, T, nkv, hd) into the cache
            vc.index_put_(where, v.to(vc.dtype))
            keys, values = kc[i][slots, :, :S], vc[i][slots, :, :S]  # (B, nkv, S, hd)
            qg = q.transpose(1, 2).reshape(B, cfg.n_kv_heads, rep * T, hd)  # (B, nkv, rep*T, hd)
            y = F.scaled_dot_product_attention(qg, keys, values, attn_mask=mask)  # (B, nkv, rep*T, hd)
            y = y.reshape(B, cfg.n_heads, T, hd).transpose(1, 2).reshape(B, T, cfg.n_heads * hd)
            x = x + F.linear(y, a.wo.weight)
            h = blk.mlp_norm(x)
            x = x + F.linear(F.silu(F.linear(h, mlp.w_gate.weight)) * F.linear(h, mlp.w_up.weight), mlp.w_down.weight)
        x = x.reshape(B * T, -1)[rows]  # (R, dim)
        return F.linear(m.norm(x), m.lm_head.weight).float()  # (R, V)


class CompiledModel:
    """A `Transformer`'s forward with the compiled path: same call, same cache, same results.

    Args:
        model: the model (its weights are read at compile time: do not train it afterwards).
        batch_buckets: batch sizes compiled; a larger batch runs eagerly.
        width_buckets: tokens per sequence compiled; a wider pass runs eagerly.
    """

    def __init__(self, model: Transformer, batch_buckets: tuple[int, ...], width_buckets: tuple[int, ...]) -> None:
        self.model = model
        self.device = model.device
        self.batch_buckets, self.width_buckets = tuple(sorted(batch_buckets)), tuple(sorted(width_buckets))
        configure(self.device)
        mode = "reduce-overhead" if self.device.type == "cuda" else None
        self._fn = torch.compile(_StaticForward(model), mode=mode, dynamic=False)
        self.span_step = SPAN_STEP.get(self.device.type, 64)
        self.compiled_calls = 0  # passes that ran compiled (tests check the path was taken)
        self._marked: set[int] = set()

    def __getattr__(self, name: str):  # cfg, embed, num_params, ...: the model's
        if name == "model":
            raise AttributeError(name)
        return getattr(self.model, name)

    def _bucket(self, n: int, options: tuple[int, ...]) -> int | None:
        return next((b for b in options if b >= n), None)

    def __call__(self, cache: KVCache, slots: torch.Tensor, tokens: torch.Tensor, n_new: torch.Tensor,
                 logits: bool = True, last: bool = False) -> torch.Tensor | None:
        """`Transformer.forward`'s contract; padding rows of the (B, T, V) result are meaningless."""
        B, T = tokens.shape
        Bb, Tb = self._bucket(B, self.batch_buckets), self._bucket(T, self.width_buckets)
        if not logits or Bb is None or Tb is None:
            return self.model(cache, slots, tokens, n_new, logits=logits, last=last)
        slots_h, n_h = slots.cpu().numpy(), n_new.cpu().numpy()  # (B,) each
        start = cache.lengths[slots_h]  # (B,)
        span = int((start + n_h).max())
        if span > cache.max_len:
            raise ValueError(f"sequence exceeds the context of {cache.max_len} tokens")
        out = self._run(cache, slots_h, start, n_h, tokens, Bb, Tb, span, last)
        cache.advance(slots, n_new)
        self.compiled_calls += 1
        return out[:B] if last else out.view(Bb, Tb, -1)[:B, :T]

    def _run(self, cache: KVCache, slots: np.ndarray, start: np.ndarray, n_new: np.ndarray, tokens: torch.Tensor,
             Bb: int, Tb: int, span: int, last: bool) -> torch.Tensor:
        """Pad to (Bb, Tb), build the indices on the host, run the compiled graph."""
        B, T = tokens.shape
        dev, cfg, P = self.device, self.model.cfg, cache.max_len
        rep = cfg.n_heads // cfg.n_kv_heads
        S = max(min(-(-span // self.span_step) * self.span_step, P), 2)  # never the full axis (a special case)
        pos = np.zeros((Bb, Tb), np.int64)
        pos[:B] = start[:, None] + np.arange(Tb)  # (Bb, Tb); padded rows sit at position 0
        wpos = np.full((Bb, Tb), P, np.int64)  # padded rows write to the scratch column
        wpos[:B] = np.minimum(pos[:B], P)
        rows_c = cache.rows(slots)  # (B,) their rows in the cache
        slot_p = np.full(Bb, rows_c[0], np.int64)  # (Bb,)
        slot_p[:B] = rows_c
        mask = np.arange(S)[None, None, :] <= pos[:, :, None]  # (Bb, Tb, S)
        mask = np.repeat(mask[:, None], rep, axis=1).reshape(Bb, 1, rep * Tb, S)  # query heads folded
        rows = np.arange(Bb) * Tb + (np.concatenate([n_new, np.ones(Bb - B, np.int64)]) - 1 if last else 0)
        tok = torch.zeros((Bb, Tb), dtype=torch.long, device=dev)
        tok[:B, :T] = tokens
        def t(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(a).to(dev)
        mask_t = t(mask)
        torch._dynamo.maybe_mark_dynamic(mask_t, 3)
        kc, vc = cache.k, cache.v
        if dev.type == "cuda" and id(kc) not in self._marked:  # a mutated input graphs may capture
            torch._dynamo.mark_static_address(kc)
            torch._dynamo.mark_static_address(vc)
            self._marked.add(id(kc))
        rows_t = t(rows) if last else torch.arange(Bb * Tb, device=dev)
        pos_t = t(np.minimum(pos, cfg.max_seq_len))
        out = self._fn(kc, vc, tok, pos_t, t(wpos), t(slot_p), t(np.repeat(slot_p[:, None], Tb, 1)), mask_t, rows_t)
        return out.clone() if dev.type == "cuda" else out  # a graph's output is overwritten by its next replay

    def warm_up(self, cache: KVCache, last: bool, progress: bool = False, desc: str = "compiling") -> None:
        """Compile the width buckets at batch 1 and at the largest batch bucket now, on `cache`'s
        slots (their lengths left as they were); other batch buckets compile on first use.

        Args:
            last: the shape asked for: logits of each row's last token (a draft pass) or of all.
        """
        from tqdm import tqdm
        fit = [b for b in self.batch_buckets if b <= cache.n_slots]
        if not fit:
            return
        shapes = [(b, w) for b in sorted({fit[0], fit[-1]}) for w in self.width_buckets]
        saved = cache.lengths.copy()
        with torch.inference_mode():
            for b, w in tqdm(shapes, desc=desc, unit="shape", disable=not progress, file=sys.stderr):
                slots = torch.arange(b, device=self.device)
                cache.lengths[:b] = 0
                n = torch.full((b,), w, dtype=torch.long, device=self.device)
                tokens = torch.zeros((b, w), dtype=torch.long, device=self.device)
                for _ in range(2 if self.device.type == "cuda" else 1):  # CUDA graphs record on a later call
                    cache.lengths[:b] = 0
                    self(cache, slots, tokens, n, last=last)
        cache.lengths[:] = saved


def time_pass(fwd, cache: KVCache, batch: int, width: int, repeats: int) -> float:
    """Median seconds of `repeats` forwards of `batch` sequences of `width` tokens at context 0."""
    slots = torch.arange(batch, device=cache.k.device)
    n = torch.full((batch,), width, dtype=torch.long, device=cache.k.device)
    tokens = torch.zeros((batch, width), dtype=torch.long, device=cache.k.device)
    saved, times = cache.lengths.copy(), []
    with torch.inference_mode():
        for _ in range(repeats + 1):
            cache.lengths[:batch] = 0
            if cache.k.is_cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fwd(cache, slots, tokens, n, last=width == 1)
            if cache.k.is_cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    cache.lengths[:] = saved
    return float(np.median(times[1:]))


def compiled(model: Transformer, batches: tuple[int, ...], widths: tuple[int, ...]) -> CompiledModel:
    """The model's compiled forward for these buckets, made once per model and shared (by every
    runner of the model: a graph compiles once per process)."""
    made = model.__dict__.setdefault("_specdepth_compiled", {})
    key = (tuple(sorted(batches)), tuple(sorted(widths)))
    if key not in made:
        made[key] = CompiledModel(model, *key)
    return made[key]


def compile_pair(target: Transformer, draft: Transformer, tcache: KVCache, dcache: KVCache, mode: str,
                 max_depth: int, progress: bool = False,
                 bucket_sizes: tuple[tuple[int, ...], tuple[int, ...]] | None = None):
    """The pair's passes for `mode` (auto, on, off): (target pass, draft pass, a summary line).

    Buckets: `bucket_sizes` (batch sizes, tokens per sequence), by default batches 1, 2, 4, ...
    up to the slot count and widths 1, 2, 4, K + 1.

    `on` compiles; `auto` compiles and keeps the compiled passes when a few timed passes (draft at
    batch 1, target at 1 and K + 1 tokens) are faster in sum than eager; `off` keeps the models. A
    compile that fails falls back to eager with one warning line. The summary says which path
    serves, and why.
    """
    if mode not in MODES:
        raise ValueError(f"compile mode must be one of {MODES}, got {mode!r}")
    if mode == "off":
        return target, draft, "compiled passes: off"
    widths = tuple(sorted({w for w in buckets(4) if w <= max_depth + 1} | {max_depth + 1}))
    batches, widths = bucket_sizes or (buckets(tcache.n_slots), widths)
    try:
        t0 = time.perf_counter()
        tc, dc = compiled(target, batches, widths), compiled(draft, batches, widths)
        tc.warm_up(tcache, False, progress, "compiling the target (cached on disk after the first run)")
        dc.warm_up(dcache, True, progress, "compiling the draft")
        took = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 -- no C compiler, an unsupported op, ...: eager still computes the same thing
        msg = f"compiled passes unavailable ({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}); running eagerly"
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
        return target, draft, f"compiled passes: off ({msg})"
    if mode == "on":
        return tc, dc, f"compiled passes: on (ready in {took:.1f} s)"
    eager = time_pass(draft, dcache, 1, 1, 10) + sum(time_pass(target, tcache, 1, w, 5) for w in (1, max_depth + 1))
    comp = time_pass(dc, dcache, 1, 1, 10) + sum(time_pass(tc, tcache, 1, w, 5) for w in (1, max_depth + 1))
    if comp < eager:
        return tc, dc, f"compiled passes: on (auto: {comp * 1e3:.2f} ms vs {eager * 1e3:.2f} ms eager for a draft and two target passes)"
    return target, draft, f"compiled passes: off (auto: eager {eager * 1e3:.2f} ms <= compiled {comp * 1e3:.2f} ms)"
