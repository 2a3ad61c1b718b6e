"""Token sampling and speculative rejection sampling.

Speculative sampling (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding"; Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative
Sampling"). For sequence r the draft proposed x_1..x_L from distributions q_1..q_L and the target
scored them in one pass, giving p_1..p_{L+1} (p_j is the target's distribution for position j
given the prefix and x_1..x_{j-1}). Of these, the first d_r (the verify length) are checked:

- **accepted** tokens: x_j is kept with probability min(1, p_j(x_j) / q_j(x_j)), in order, until
  the first rejection; `accepted[r]` counts them (0 <= a_r <= d_r).
- **recovered** token: at the first rejection j = a_r + 1 <= d_r, the target's token is drawn
  from norm(max(0, p_j - q_j)) in place of x_j.
- **bonus** token: when all d_r are accepted, one more token is drawn from p_{d_r + 1}.

Every sequence therefore emits a_r + 1 tokens, distributed exactly as the target alone would
produce them. A greedy draft has q_j = one-hot(x_j) (accept with probability p_j(x_j)); a greedy
target (temperature 0) makes p_j one-hot at argmax, so x_j is accepted iff it is the argmax and
the recovered/bonus token is the argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from numba import njit


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0  # nucleus mass kept; 1.0 keeps all
    seed: int | None = None  # a request's own seed: its sampled output repeats (workers/row_sampling.py)

    def __post_init__(self) -> None:
        if not self.temperature >= 0 or self.temperature != self.temperature:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not (isinstance(self.seed, int) and 0 <= self.seed < 1 << 63):
            raise ValueError(f"seed must be an integer in [0, 2^63), got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probs_from_logits(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """(..., V) logits -> (..., V) probabilities after temperature and top-p (greedy: one-hot)."""
    if sp.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(torch.float32)
    probs = torch.softmax(logits.float() / sp.temperature, dim=-1)
    if sp.top_p < 1.0:
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the token crossing it included)
        drop = (sorted_p.cumsum(-1) - sorted_p) >= sp.top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, idx, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    """(B, V) probabilities -> (B,) tokens."""
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


def confidence_features(logits: torch.Tensor, with_argmax: bool = False):
    """The draft's top-1 probability and entropy (nats) at a position, from its raw distribution.

    Computed from the distribution *before* the token is drawn: a function of the prefix only,
    so a depth decision may use it without breaking losslessness. (B, V) -> (B,), (B,), and with
    `with_argmax` also the (B,) argmax token (the greedy draft's choice).
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    p = logp.exp()
    top = p.max(-1)
    ent = -(p * logp).sum(-1)
    return (top.values, ent, top.indices) if with_argmax else (top.values, ent)


@dataclass
class Verdict:
    accepted: torch.Tensor  # (B,) long: a_r
    tokens: torch.Tensor  # (B, D + 1) long: emitted tokens, a_r + 1 valid per row, then -1


def rejection_sample(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
                     target_probs: torch.Tensor, verify_len: torch.Tensor,
                     gen: torch.Generator | None) -> Verdict:
    """Speculative sampling over a ragged batch (see the module docstring).

    Args:
        draft_tokens: (B, D) long, x_1..x_D (entries past verify_len[r] are ignored).
        draft_probs: (B, D, V) q_j the tokens were drawn from, or None for a greedy draft.
        target_probs: (B, D + 1, V) p_1..p_{D+1} (after temperature/top-p; one-hot if greedy).
        verify_len: (B,) long, d_r in [0, D].
        gen: seeded generator; uniforms are drawn for every (r, j) so the stream consumed does
            not depend on the decisions.
    Returns:
        Verdict with accepted counts and emitted tokens.
    """
    B, D = draft_tokens.shape
    dev = target_probs.device
    j = torch.arange(D, device=dev)
    p_x = target_probs[:, :D].gather(-1, draft_tokens[..., None]).squeeze(-1)  # (B, D)
    q_x = (torch.ones_like(p_x) if draft_probs is None
           else draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1))  # (B, D)
    u = torch.rand((B, D), generator=gen, device=dev)  # (B, D)
    ok = (u * q_x < p_x) & (j[None, :] < verify_len[:, None])  # (B, D): accept test, within d_r
    accepted = ok.long().cumprod(dim=1).sum(dim=1)  # (B,) leading accepts
    rows = torch.arange(B, device=dev)
    p_next = target_probs[rows, accepted]  # (B, V): p_{a+1}
    rejected = accepted < verify_len  # (B,) a rejection happened at a + 1
    if draft_probs is None:
        q_next = torch.nn.functional.one_hot(draft_tokens[rows, accepted.clamp(max=D - 1)],
                                             target_probs.shape[-1]).float() if D else torch.zeros_like(p_next)
    else:
        q_next = draft_probs[rows, accepted.clamp(max=D - 1)] if D else torch.zeros_like(p_next)
    residual = (p_next - q_next).clamp(min=0)  # (B, V)
    mass = residual.sum(-1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p_next)
    final = sample(torch.where(rejected[:, None], residual, p_next), gen)  # (B,)
    tokens = torch.full((B, D + 1), -1, dtype=torch.long, device=dev)
    keep = j[None, :] < accepted[:, None]  # (B, D)
    tokens[:, :D] = torch.where(keep, draft_tokens, tokens[:, :D])
    tokens[rows, accepted] = final
    return Verdict(accepted, tokens)


def greedy_verify(draft_tokens: np.ndarray, target_argmax: np.ndarray,
                  verify_len: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The temperature-0 special case of `rejection_sample`, on the host in one compiled call
    (host work right after the target pass runs cache-cold, where each numpy call costs tens of
    us; tests/workers/test_greedy_verify.py holds the rule's numpy statements as the reference).

    Args:
        draft_tokens: (B, D) int; target_argmax: (B, D + 1) int; verify_len: (B,) int, <= D.

    Returns:
        (B,) int64 accepted a_r: the leading drafts within verify_len[r] that equal the target's
        argmax; and (B, D + 1) int64 tokens: the first a_r + 1 of each row's argmax, -1 after.

    Raises:
        ValueError: the shapes disagree (the kernel checks no bounds).
    """
    draft, target, lens = (np.asarray(draft_tokens, np.int64), np.asarray(target_argmax, np.int64),
                           np.asarray(verify_len, np.int64))
    if draft.ndim != 2 or target.shape != (draft.shape[0], draft.shape[1] + 1) or lens.shape != draft.shape[:1]:
        raise ValueError(f"greedy_verify: shapes draft {draft.shape}, target {target.shape}, verify {lens.shape}; "
                         "need (B, D), (B, D + 1), (B,)")
    return _greedy_kernel(draft, target, lens)


@njit(cache=True)
def _greedy_kernel(draft_tokens: np.ndarray, target_argmax: np.ndarray,
                   verify_len: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    B, D = draft_tokens.shape  # (B, D); target_argmax (B, D + 1); verify_len (B,)
    accepted = np.zeros(B, np.int64)  # (B,)
    out = np.full((B, D + 1), -1, np.int64)  # (B, D + 1)
    for r in range(B):
        a = 0
        while a < min(verify_len[r], D) and draft_tokens[r, a] == target_argmax[r, a]:
            a += 1
        accepted[r] = a
        for j in range(a + 1):
            out[r, j] = target_argmax[r, j]
    return accepted, out
