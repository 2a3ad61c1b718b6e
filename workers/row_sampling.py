"""Per-row sampling: each sequence's own temperature, top-p and seed, in one batch.

A step may mix three kinds of rows, each lossless on its own terms:

- **greedy** (temperature 0): the target's p is one-hot at its argmax; the draft model drafts
  argmaxes (q one-hot).
- **seeded**: the target's token at absolute position t is the Gumbel-max token
  argmax(log p_T + g_t), with p_T the row's tempered, top-p-cut distribution and g_t Gumbel noise
  drawn from (seed, t) alone: an exact sample of p_T given the prefix, since g_t is independent of
  the noise that made the prefix. p is one-hot at that token, so verification is exact as for
  greedy rows, and the output is a function of the prompt, the seed and the target alone: it
  repeats whatever else shares the batch and however deep anything drafts (up to float
  differences between batch shapes, as for greedy). The draft model drafts argmax(log q_T + g_t)
  with the same noise (q one-hot: a function of the prefix and the seed).
- **sampled** without a seed: the rejection sampler (`sampler.rejection_sample`) with the draft's
  q at the row's own settings, drawing from the runner's generator.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specdepth.workers.sampler import SamplingParams

_MIX = 0x9E3779B97F4A7C15  # odd 64-bit constant: (seed, position) -> a generator seed


@dataclass
class RowParams:
    """One step's rows' sampling settings."""

    temps: torch.Tensor  # (B,) float: temperature, 1 on greedy rows (unused there)
    top_ps: torch.Tensor  # (B,) float
    greedy: np.ndarray  # (B,) bool
    keyed: np.ndarray  # (B,) bool: sampled with a seed (Gumbel-max on keyed noise)
    seeds: list[int | None]  # (B,) the seeded rows' seeds

    @classmethod
    def of(cls, params: list[SamplingParams], device: str | torch.device = "cpu") -> "RowParams":
        greedy = np.array([p.greedy for p in params], bool)
        return cls(torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=device),
                   torch.tensor([p.top_p for p in params], device=device), greedy,
                   np.array([not p.greedy and p.seed is not None for p in params], bool),
                   [p.seed for p in params])

    @property
    def all_greedy(self) -> bool:
        return bool(self.greedy.all())

    @property
    def drawn(self) -> np.ndarray:
        """(B,) bool rows sampled by the rejection sampler (no seed): their draft keeps its q."""
        return ~self.greedy & ~self.keyed

    def rows(self, idx: np.ndarray) -> "RowParams":
        """These rows' settings, in this order."""
        t = torch.from_numpy(np.asarray(idx, np.int64)).to(self.temps.device)
        return RowParams(self.temps[t], self.top_ps[t], self.greedy[idx], self.keyed[idx],
                         [self.seeds[i] for i in np.asarray(idx).tolist()])


def tempered(logits: torch.Tensor, rp: RowParams) -> torch.Tensor:
    """(B, ..., V) logits -> probabilities at each row's temperature and top-p (greedy rows:
    one-hot at the argmax)."""
    shape = (-1,) + (1,) * (logits.dim() - 1)
    probs = torch.softmax(logits.float() / rp.temps.view(shape), dim=-1)
    cut = rp.top_ps < 1.0
    if bool(cut.any()):
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the token crossing it included), as
        # `sampler.probs_from_logits`; rows with top_p 1 keep everything
        drop = ((sorted_p.cumsum(-1) - sorted_p) >= rp.top_ps.view(shape)) & cut.view(shape)
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, idx, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    if rp.greedy.any():
        g = torch.from_numpy(rp.greedy).to(logits.device)
        one_hot = torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(probs.dtype)
        probs = torch.where(g.view(shape), one_hot, probs)
    return probs


def gumbel(seed: int, positions: list[int], V: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """(T, V) Gumbel noise for absolute positions `positions` of a sequence seeded `seed`: each
    row a function of (seed, position) alone."""
    out = torch.empty((len(positions), V))
    gen = torch.Generator()
    for i, t in enumerate(positions):
        gen.manual_seed((seed * _MIX + t) % (1 << 63))
        u = torch.rand(V, generator=gen).clamp_(min=1e-20)
        out[i] = -torch.log(-torch.log(u))
    return out.to(device)


def keyed_choice(probs: torch.Tensor, seed: int, first: int) -> torch.Tensor:
    """(T, V) one row's probabilities at positions first, first + 1, ... -> (T,) its Gumbel-max
    tokens argmax(log p + g)."""
    g = gumbel(seed, list(range(first, first + probs.shape[0])), probs.shape[-1], probs.device)
    return (torch.log(probs) + g).argmax(-1)


def target_probs(logits: torch.Tensor, rp: RowParams, first: np.ndarray) -> torch.Tensor:
    """(B, T, V) the target's logits over positions first[r], first[r] + 1, ... -> the p the
    rejection sampler verifies with: tempered and cut per row, one-hot on greedy rows and, on
    seeded rows, at the Gumbel-max token."""
    p = tempered(logits, rp)
    for r in np.flatnonzero(rp.keyed).tolist():
        tok = keyed_choice(p[r], rp.seeds[r], int(first[r]))
        p[r] = torch.nn.functional.one_hot(tok, p.shape[-1]).to(p.dtype)
    return p
