"""Small random draft/target pairs whose acceptance is non-trivial, for engine tests.

A random-init transformer's next-token distribution is nearly uniform, so a random draft would
accept almost nothing and test nothing. Here the target's logits are sharpened (embeddings
scaled up) and the draft is the target with noise on its weights: it agrees often but not always,
so full accepts, partial accepts and rollbacks at every position all occur.
"""

from __future__ import annotations

import copy
import os

import torch

from specdepth.workers.model import ModelConfig, Transformer


def tiny_pair(vocab: int = 96, dim: int = 64, n_layers: int = 2, noise: float = 0.35, sharpen: float = 4.0,
              max_seq_len: int = 256, seed: int = 0, device: str | None = None) -> tuple[Transformer, Transformer]:
    """The pair, built on the CPU (same weights everywhere) and moved to `device` (default: the
    SPECDEPTH_DEVICE environment variable, else cpu; experiments/bench/gpu_check.py sets it to cuda)."""
    cfg = ModelConfig(vocab_size=vocab, dim=dim, n_layers=n_layers, n_heads=4, n_kv_heads=2,
                      ffn_dim=2 * dim, max_seq_len=max_seq_len, tie_embeddings=False)
    target = Transformer(cfg)
    target.init_weights(seed)
    with torch.no_grad():
        target.embed.weight.mul_(50.0)  # unit-scale inputs: the residual stream carries the token
        target.lm_head.weight.mul_(sharpen)
    draft = copy.deepcopy(target)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.add_(torch.randn(p.shape, generator=g) * p.std() * noise)
    device = device or os.environ.get("SPECDEPTH_DEVICE", "cpu")
    return target.to(device).eval(), draft.to(device).eval()
