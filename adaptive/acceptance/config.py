"""The acceptance model's settings and the layout of its statistics, shared by `acceptance.model`,
`acceptance.state` and the compiled `acceptance.kernels`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EPS = 1e-6
IDENTITY = np.array([1.0, 1.0, 0.0, 0.0])  # logit c = log t - log(1 - t) = logit t
Z_EDGES = np.linspace(-6.0, 6.0, 25)  # logit(top1) bin edges: 26 bins, 0.5 wide inside
H_EDGES = np.array([0.05, 0.2, 0.5, 1.0, 2.0, 4.0])  # entropy (nats) bin edges: 7 bins
N_CELLS = (len(Z_EDGES) + 1) * (len(H_EDGES) + 1)
N_FEAT = 3  # log t, -log(1 - t), H
SEQ_COLS = 7  # accepted, rejected, sum c_global, sum (1 - c_global), sum g, sum (1 - g), category
CAT = 6  # the seq_stats column holding the last step's category (`kernels.last_category`; 0 none)
N_CATS = 11  # categories: also the planning states of `prior_conf`


@dataclass(frozen=True)
class AcceptanceConfig:
    max_positions: int = 16  # positions with their own regression; deeper ones share the last
    refit_every: int = 256  # counted observations between refits (once the model has seen as many)
    first_refit: int = 32  # the first refit; until refit_every, one each time the data doubles
    newton_steps: int = 8  # Newton iterations per refit at most (warm-started; stops when settled)
    ridge: float = 1.0  # precision of the Gaussian prior on each position's weights
    window: float = 50_000.0  # effective observations kept per position (older ones scaled down)
    seq_strength: float = 64.0  # k: pseudo-observations of the global model in a sequence's posterior
    cat_strength: float = 64.0  # the same, for the shift per last-step category at position 1
    cat_refresh: int = 64  # counted observations between refreshes of those shifts
    rate_strength: float = 4.0  # pseudo-observations pulling position j's global rate to j - 1's
    prior_rate: float = 0.5  # the global rate before any observation
    optimism: float = 1.0  # z: planning rates get + z * their standard error (see `prior_conf`)
    idle_decay: float = 0.8  # a sequence's own counts age by this factor per step it verifies nothing
    ece_bins: int = 15  # equal-width bins of predicted survival

    def __post_init__(self) -> None:
        if min(self.max_positions, self.refit_every, self.first_refit, self.cat_refresh, self.newton_steps,
               self.ece_bins) < 1:
            raise ValueError(f"counts must be >= 1: {self}")
        if min(self.ridge, self.window, self.seq_strength, self.cat_strength, self.rate_strength) <= 0 \
                or self.optimism < 0:
            raise ValueError(f"strengths and window must be positive: {self}")
        if not 0 < self.idle_decay <= 1:
            raise ValueError(f"idle_decay must be in (0, 1]: {self}")
        if not 0 < self.prior_rate < 1:
            raise ValueError(f"prior_rate must be in (0, 1): {self}")


def refit_interval(cfg: AcceptanceConfig, seen: float) -> float:
    """Counted observations until the next refit, with `seen` behind the model: `first_refit` at
    first, doubling with the data up to `refit_every`, then a quarter of the data if that is more."""
    return max(min(cfg.refit_every, max(cfg.first_refit, seen)), seen / 4)


def _clip(x: np.ndarray | float, lo: float, hi: float) -> np.ndarray:
    return np.minimum(np.maximum(x, lo), hi)  # np.clip, without its Python-level overhead


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-_clip(x, -30.0, 30.0)))


def _logit(p: np.ndarray | float) -> np.ndarray:
    p = _clip(p, 1e-4, 1 - 1e-4)
    return np.log(p) - np.log1p(-p)
