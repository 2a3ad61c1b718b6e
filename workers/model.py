"""A decoder-only transformer in the Llama/Qwen shape, with a slot KV cache and ragged forwards.

Read top to bottom: config, norm, rotary embedding, attention, MLP, block, model. One forward
serves prefill, drafting and verification: each sequence in the batch brings its own number of
new tokens (1..T), and every new token gets logits in ONE call. Only attention sees the batch
padded to (B, T) (or, when padding would cost more, in two parts: `attention_parts`); every
per-token layer (projections, MLP, norms, LM head) runs on the packed valid tokens, so a ragged
verify pass costs its real token count, not B x T (unless the padding is small: `padding.py`). The KV
cache is preallocated (one slot per running sequence); rolling back rejected positions is just
resetting the slot's length (see `kv_cache.py`), nothing is copied or recomputed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from specdepth.workers import padding
from specdepth.workers.kv_cache import KVCache
from specdepth.workers.linear import Linear


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a model; names follow Llama's config.json where one exists."""

    vocab_size: int = 4096
    dim: int = 384
    n_layers: int = 6
    n_heads: int = 6
    n_kv_heads: int = 2  # grouped-query attention: n_heads // n_kv_heads queries share a KV head
    ffn_dim: int = 1024  # SwiGLU hidden size
    max_seq_len: int = 1024  # positions the KV cache and RoPE tables hold
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    qkv_bias: bool = False  # Qwen2 has biases on q, k and v
    qk_norm: bool = False  # Qwen3 RMS-normalises q and k per head before RoPE
    head_dim: int = 0  # 0 means dim // n_heads (Qwen3 may set it explicitly)
    rope_scaling: Optional[dict] = None  # Llama-3 style {"rope_type": "llama3", ...} or None

    def __post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")
        if self.head_dim == 0 and self.dim % self.n_heads:
            raise ValueError(f"dim={self.dim} must be a multiple of n_heads={self.n_heads}")
        if min(self.vocab_size, self.dim, self.n_layers, self.max_seq_len) <= 0:
            raise ValueError(f"sizes must be positive: {self}")

    @property
    def hd(self) -> int:
        return self.head_dim or self.dim // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one op where the composite below takes eight (~6 us each on CPU)
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


def rope_tables(cfg: ModelConfig, n_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables of shape (n_pos, hd), with Llama-3 frequency scaling when configured, laid
    out for `apply_rope`: cos over both halves, sin negated over the first half."""
    hd = cfg.hd
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    sc = cfg.rope_scaling or {}
    if sc.get("rope_type", sc.get("type")) == "llama3":
        factor, lo, hi = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
        old_len = sc["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - lo) / (hi - lo)
        scaled = torch.where(wavelen > old_len / lo, inv_freq / factor, inv_freq)
        mid = (wavelen <= old_len / lo) & (wavelen >= old_len / hi)
        inv_freq = torch.where(mid, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
    elif sc.get("rope_type", sc.get("type")) == "linear":
        inv_freq = inv_freq / sc["factor"]
    angles = torch.outer(torch.arange(n_pos, dtype=torch.float64), inv_freq)  # (n_pos, hd/2)
    cos, sin = angles.cos().float(), angles.sin().float()
    return torch.cat([cos, cos], -1), torch.cat([-sin, sin], -1)  # (n_pos, hd) each


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (..., nh, hd); cos/sin: (..., hd) from `rope_tables`, the same leading shape ((B, T) or
    packed (N,)). Rotate-half convention (as HF Llama): [x1 c - x2 s, x2 c + x1 s] computed as
    x [c, c] + [x2, x1] [-s, s], the same products and sums in fewer ops."""
    xf = x if x.dtype == torch.float32 else x.float()
    x1, x2 = xf.chunk(2, dim=-1)  # (..., nh, hd/2) each
    y = xf * cos.unsqueeze(-2) + torch.cat([x2, x1], dim=-1) * sin.unsqueeze(-2)  # (..., nh, hd)
    return y if y.dtype == x.dtype else y.type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        hd = cfg.hd
        self.wq = Linear(cfg.dim, cfg.n_heads * hd, bias=cfg.qkv_bias)
        self.wk = Linear(cfg.dim, cfg.n_kv_heads * hd, bias=cfg.qkv_bias)
        self.wv = Linear(cfg.dim, cfg.n_kv_heads * hd, bias=cfg.qkv_bias)
        self.wo = Linear(cfg.n_heads * hd, cfg.dim, bias=False)
        self.q_norm = RMSNorm(hd, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(hd, cfg.norm_eps) if cfg.qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layer: int,
                cache: Optional[KVCache], meta: "BatchMeta") -> torch.Tensor:
        """x: (B, T, dim) in training; with a cache, (N, dim): the batch's valid tokens, packed."""
        cfg, hd = self.cfg, self.cfg.hd
        lead = x.shape[:-1]  # (B, T) or (N,)
        q = self.wq(x).view(*lead, cfg.n_heads, hd)  # (..., nh, hd)
        k = self.wk(x).view(*lead, cfg.n_kv_heads, hd)  # (..., nkv, hd)
        v = self.wv(x).view(*lead, cfg.n_kv_heads, hd)  # (..., nkv, hd)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = cfg.n_heads // cfg.n_kv_heads
        if cache is None:  # training: plain causal attention over the T tokens
            B, T = lead
            keys, values = k.transpose(1, 2), v.transpose(1, 2)  # (B, nkv, T, hd)
            if rep > 1:
                keys = keys.repeat_interleave(rep, dim=1)  # (B, nh, T, hd)
                values = values.repeat_interleave(rep, dim=1)
            y = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, is_causal=True)
            return self.wo(y.transpose(1, 2).reshape(B, T, cfg.n_heads * hd))
        cache.write(layer, meta.write_rows, meta.write_pos, k, v)
        if meta.pack is None:  # every row full: the batch is one part, nothing to gather
            B, T = meta.parts[0].shape
            return self.wo(self._attend(q.view(B, T, cfg.n_heads, hd), layer, cache, meta.parts[0]).view(B * T, -1))
        y = q.new_empty(q.shape[0], cfg.n_heads * hd)  # (N, nh*hd)
        for part in meta.parts:
            Bp, Tp = part.shape
            qp = q[part.rows]  # (n, nh, hd): a part's queries are a run of packed rows, no gather
            if part.dst is not None:  # padded: place them in the part's (Bp * Tp) grid
                qp = q.new_zeros(Bp * Tp, cfg.n_heads, hd).index_copy_(0, part.dst, qp)
            yp = self._attend(qp.view(Bp, Tp, cfg.n_heads, hd), layer, cache, part).view(Bp * Tp, -1)
            y[part.rows] = yp if part.dst is None else yp.index_select(0, part.dst)
        return self.wo(y)  # (N, dim)

    def _attend(self, q: torch.Tensor, layer: int, cache: KVCache, part: "AttnPart") -> torch.Tensor:
        """q: (Bp, Tp, nh, hd) queries of one part -> (Bp, Tp, nh*hd), over its cached keys."""
        cfg, hd = self.cfg, self.cfg.hd
        B, T = q.shape[:2]
        keys, values = cache.read(layer, part.read_index, part.span)  # (Bp, nkv, S, hd)
        # GQA without copying keys: fold each KV head's `rep` query heads into the query axis
        rep = cfg.n_heads // cfg.n_kv_heads
        qg = q.transpose(1, 2).reshape(B, cfg.n_kv_heads, rep * T, hd)  # (Bp, nkv, rep*Tp, hd)
        y = F.scaled_dot_product_attention(qg, keys, values, attn_mask=part.mask)  # (Bp, nkv, rep*Tp, hd)
        # reshape, not view: a CUDA attention kernel may return y in another memory layout
        return y.reshape(B, cfg.n_heads, T, hd).transpose(1, 2).reshape(B, T, cfg.n_heads * hd)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w_gate = Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w_up = Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w_down = Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, layer, cache, meta):
        x = x + self.attn(self.attn_norm(x), cos, sin, layer, cache, meta)
        return x + self.mlp(self.mlp_norm(x))


@dataclass
class AttnPart:
    """Sequences whose queries attend in one call: Bp sequences, each padded to Tp queries."""

    shape: tuple[int, int]  # (Bp, Tp)
    read_index: slice | torch.Tensor  # their cache rows (a slice when consecutive: no copy)
    span: int  # S: keys to read
    mask: Optional[torch.Tensor]  # (Bp, 1, rep*Tp, S) bool: key s visible to query t (repeated per query head); None: all
    rows: slice = field(default_factory=lambda: slice(None))  # the part's queries: a run of consecutive rows of the packed batch
    dst: Optional[torch.Tensor] = None  # (n,) long: those rows' places in the (Bp*Tp) padding; None: no padding


@dataclass
class BatchMeta:
    """Where a ragged batch's new tokens go in the cache and which keys each attends to."""

    pack: Optional[torch.Tensor]  # (N,) long: valid tokens' rows in the flat (B*T) batch, in packed order; None: all valid
    write_rows: torch.Tensor  # (N,) long: the cache row of each new token
    write_pos: torch.Tensor  # (N,) long: its position there
    parts: list[AttnPart]  # one part, or the two of `attention_parts` where one would pad more than PAD_LIMIT allows
    last: Optional[torch.Tensor] = None  # (B,) long: each sequence's last new token's packed row


def _visible(positions: np.ndarray, span: int, rep: int) -> torch.Tensor:
    """(Bp, Tp) positions -> (Bp, 1, rep*Tp, span) bool causal mask, tiled per folded query head."""
    m = np.arange(span)[None, None, :] <= positions[:, :, None]  # (Bp, Tp, span)
    return torch.from_numpy(np.tile(m[:, None], (1, 1, rep, 1)))


# A ragged batch attends as one (B, T) part, padded, while its B x T queries are at most PAD_LIMIT x
# the queries of the two-part split (`attention_parts`), or PAD_LIMIT x WIDE where at least a third
# of its rows bring more than one token. Padding reads each sequence's keys once, the split reads
# the longer rows' keys twice and pays a second call and its gathers in every layer, but padded
# queries cost compute: it pays where many rows are longer than 1, not with one long row among many
# of 1 (measurements in docs/benchmarks.md).
PAD_LIMIT = 1.5
WIDE = 4.0 / 3.0


def attention_parts(start: np.ndarray, n_new: np.ndarray, rep: int,
                    slot_index: Callable[[np.ndarray], slice | torch.Tensor], rows: np.ndarray,
                    pad_limit: float | None = None) -> tuple[np.ndarray, list[AttnPart]]:
    """How a ragged batch's queries attend, on the host: one part, the batch padded to (B, T), or
    two: every sequence's first new token (B x 1, no padding), and the later tokens of the Bs
    sequences with more than one (padded to the longest, minus one). Padded when B x T <=
    `pad_limit` (PAD_LIMIT if None) x (B + Bs (T - 1)), that limit x WIDE where 3 Bs >= B.

    Returns the packed order, (N,) rows of the flat (B*T) batch, and the parts (tensors on the
    host). Each part's queries are consecutive packed rows: padded, row-major; split, every first
    token (row b at b), then the later tokens, sequence by sequence."""
    B, T = len(start), int(n_new.max())
    sub = np.flatnonzero(n_new > 1)  # (Bs,)
    valid = np.arange(T)[None, :] < n_new[:, None]  # (B, T)
    limit = (PAD_LIMIT if pad_limit is None else pad_limit) * (WIDE if 3 * len(sub) >= B else 1.0)
    if B * T <= limit * (B + len(sub) * (T - 1)):
        pack = np.flatnonzero(valid)  # (N,) row-major
        span = int((start + n_new).max())
        part = AttnPart((B, T), slot_index(rows), span, _visible(start[:, None] + np.arange(T), span, rep),
                        slice(0, len(pack)), torch.from_numpy(pack))
        return pack, [part]
    span1 = int((start + 1).max())
    mask1 = None if (start == start[0]).all() else _visible(start[:, None], span1, rep)
    parts = [AttnPart((B, 1), slot_index(rows), span1, mask1, slice(0, B))]
    Tp = T - 1
    later = valid[sub, 1:]  # (Bs, Tp)
    pack = np.concatenate([np.arange(B) * T, (sub[:, None] * T + 1 + np.arange(Tp))[later]])  # (N,)
    span = int((start[sub] + n_new[sub]).max())
    dst = None if later.all() else torch.from_numpy(np.flatnonzero(later))
    parts.append(AttnPart((len(sub), Tp), slot_index(rows[sub]), span,
                          _visible(start[sub, None] + 1 + np.arange(Tp), span, rep), slice(B, len(pack)), dst))
    return pack, parts


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        cos, sin = rope_tables(cfg, cfg.max_seq_len + 1)
        self.register_buffer("rope_cos", cos, persistent=False)  # (max_seq_len + 1, hd)
        self.register_buffer("rope_sin", sin, persistent=False)

    def init_weights(self, seed: int) -> None:
        """GPT-2 style init: normal(0, 0.02), residual projections scaled by 1/sqrt(2 * layers)."""
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                continue
            std = 0.02 / math.sqrt(2 * self.cfg.n_layers) if name.endswith(("wo.weight", "w_down.weight")) else 0.02
            with torch.no_grad():
                if p.dim() == 1:
                    p.zero_()
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * std)

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def forward_train(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (B, T) -> logits (B, T, V), causal, no cache."""
        B, T = tokens.shape
        pos = torch.arange(T, device=tokens.device).expand(B, T)
        x = self.embed(tokens)  # (B, T, dim)
        cos, sin = self.rope_cos[pos], self.rope_sin[pos]  # (B, T, hd)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, i, None, None)
        return self.lm_head(self.norm(x))

    def forward(self, cache: KVCache, slots: torch.Tensor, tokens: torch.Tensor,
                n_new: torch.Tensor, logits: bool = True, last: bool = False) -> Optional[torch.Tensor]:
        """Ragged forward: sequence b appends tokens[b, :n_new[b]] to its slot and gets their logits.

        Args:
            cache: the KV cache this model owns; slot lengths advance by n_new.
            slots: (B,) long, distinct slot ids.
            tokens: (B, T) long, right-padded new tokens.
            n_new: (B,) long, 1 <= n_new[b] <= T.
            logits: False skips the LM head (prefill whose logits nobody reads).
            last: the LM head on each sequence's last new token only (a draft pass reads no other;
                in its first pass, which catches up on several committed tokens, the head was half
                the bundled draft's per-token work).
        Returns:
            (B, T, V) float32 logits, rows t >= n_new[b] padding and meaningless; with `last`, (B, V).
        """
        B, T = tokens.shape
        dev = self.device
        slots_h, n_h = slots.cpu().numpy(), n_new.cpu().numpy()  # (B,) each, on the host
        start_h = cache.lengths[slots_h]  # (B,)
        span = int((start_h + n_h).max())
        if span > cache.max_len:
            raise ValueError(f"sequence exceeds the context of {cache.max_len} tokens")
        rep = self.cfg.n_heads // self.cfg.n_kv_heads
        rows_h = cache.rows(slots_h)  # (B,) their rows in the cache
        order = None if (np.diff(rows_h) > 0).all() else np.argsort(rows_h)  # (B,)
        if order is not None:  # run in row order (consecutive rows read as a view), results back in the caller's
            rows_h, start_h, n_h = rows_h[order], start_h[order], n_h[order]
            order_t = torch.from_numpy(order).to(dev)  # (B,) the run's row -> the caller's
            tokens = tokens[order_t]
        tokens = tokens.flatten()  # (B*T,)
        if padding.runs_padded(B, T, int(n_h.sum())):  # (nearly) every row full: one padded part, no packing
            meta, pos_c = self._padded_meta(cache, rows_h, start_h, T, span, rep)
        else:  # per-token layers run on the N valid tokens only; attention padded (or in two parts)
            meta, pos_c = self._packed_meta(cache, rows_h, start_h, n_h, T, rep)
            tokens = tokens[meta.pack]
        cos, sin = self.rope_cos[pos_c], self.rope_sin[pos_c]  # (N, hd)
        x = self.embed(tokens)  # (N, dim)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, i, cache, meta)
        cache.advance(slots, n_new)
        if not logits:
            return None
        back = None if order is None else torch.from_numpy(np.argsort(order)).to(dev)  # (B,) caller's row -> run's
        if last:  # each sequence's last new token: its row in the packed (N,) or flat (B*T,) batch
            if T > 1:
                x = x[meta.last if meta.pack is not None else torch.from_numpy(np.arange(B) * T + n_h - 1).to(dev)]
            x = x if back is None else x[back]
            return self.lm_head(self.norm(x)).float()  # (B, V)
        out = self.lm_head(self.norm(x)).float()  # (N, V)
        if meta.pack is None:
            out = out.view(B, T, -1)
            return out if back is None else out[back]
        pack = meta.pack if order is None else order_t[meta.pack // T] * T + meta.pack % T  # (N,) in the caller's rows
        return out.new_zeros(B * T, out.shape[-1]).index_copy_(0, pack, out).view(B, T, -1)

    def _padded_meta(self, cache: KVCache, rows: np.ndarray, start: np.ndarray, T: int, span: int,
                     rep: int) -> tuple[BatchMeta, torch.Tensor]:
        """A batch run padded to (B, T) as one attention part, its indices built on the host (a
        draft pass at batch 1 spent a third of its time building them with small tensor ops).
        Returns the metadata and each token's RoPE position (B*T,)."""
        dev = self.device
        positions = start[:, None] + np.arange(T)  # (B, T); padded queries see stale keys, and are dropped
        if T == 1 and (start == start[0]).all():
            mask = None  # each row's one query sees all of its span keys
        else:
            mask = _visible(positions, span, rep).to(dev)  # (B, 1, rep*T, span)
        index = cache.slot_index(rows)
        if torch.is_tensor(index):
            index = index.to(dev)
        # a padded token's key lands past its sequence's new length (never read: the next write
        # there overwrites it), or in the scratch column where it would pass the cache's end
        write_rows = torch.from_numpy(np.repeat(rows, T)).to(dev)  # (B*T,)
        write_pos = torch.from_numpy(np.minimum(positions, cache.max_len).ravel()).to(dev)  # (B*T,)
        pos_c = torch.from_numpy(np.minimum(positions, self.cfg.max_seq_len).ravel()).to(dev)  # (B*T,)
        meta = BatchMeta(None, write_rows, write_pos,
                         [AttnPart((len(rows), T), index, span, mask)])
        return meta, pos_c

    def _packed_meta(self, cache: KVCache, rows: np.ndarray, start: np.ndarray, n_new: np.ndarray,
                     T: int, rep: int) -> tuple[BatchMeta, torch.Tensor]:
        """A ragged batch: per-token layers on its N valid tokens, attention in one padded part or
        two (`attention_parts`), its indices built on the host. Returns the metadata and each valid
        token's RoPE position (N,)."""
        dev = self.device
        pack, parts = attention_parts(start, n_new, rep, cache.slot_index, rows)  # pack: (N,) flat rows
        for part in parts:
            part.read_index = part.read_index.to(dev) if torch.is_tensor(part.read_index) else part.read_index
            part.mask = None if part.mask is None else part.mask.to(dev)
            part.dst = None if part.dst is None else part.dst.to(dev)
        row, t = pack // T, pack % T  # (N,) each: the sequence and the new token of every packed row
        positions = start[row] + t  # (N,): valid tokens stay inside the cache
        end = np.flatnonzero(t == n_new[row] - 1)  # (B,) packed rows of the sequences' last new tokens
        last = np.empty(len(rows), np.int64)  # (B,)
        last[row[end]] = end
        meta = BatchMeta(torch.from_numpy(pack).to(dev), torch.from_numpy(rows[row]).to(dev),
                         torch.from_numpy(positions).to(dev), parts, torch.from_numpy(last).to(dev))
        return meta, torch.from_numpy(np.minimum(positions, self.cfg.max_seq_len)).to(dev)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
