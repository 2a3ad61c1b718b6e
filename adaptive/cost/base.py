"""The step-time interface every cost model implements, `CostModel` (a `policies.base.StepCost`).

The kinds themselves live in `cost.model` (fixed), `cost.roofline` and `cost.profiled`, and
register themselves in `COST_KINDS` when defined; import them from `specdepth.adaptive.cost.model`.
Times are seconds; `context_tokens` is the KV held by the whole batch (summed over sequences).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

FORMAT = "specdepth-cost-v1"
COST_KINDS: dict[str, type["CostModel"]] = {}  # kind -> class, filled as each kind is defined


def _like(x: np.ndarray, ref: Any) -> np.ndarray | float:
    """Return a Python float when the caller passed a scalar, else the array."""
    return float(x) if np.ndim(ref) == 0 else x


class CostModel(ABC):
    """Step-time model (seconds). Every kind registers itself in `COST_KINDS` under its `kind`."""

    kind: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind:
            COST_KINDS[cls.kind] = cls

    @abstractmethod
    def target_time(self, n_tokens: np.ndarray | int, context_tokens: int = 0,
                    batch_size: int = 0) -> np.ndarray | float:
        """One target pass over `n_tokens` step tokens (vectorised) with `context_tokens` of KV,
        for a step of `batch_size` sequences (0: not known; only a model that measured step shapes
        uses it, see `ProfiledCost`)."""

    @abstractmethod
    def draft_time(self, batch_size: int, context_tokens: int = 0) -> float:
        """One draft pass: one token for each of `batch_size` sequences."""

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description; `CostModel.from_dict` inverts it."""

    def target_by_n(self, size: int, context_tokens: int = 0, batch_size: int = 0) -> np.ndarray:
        """(size,) float64 `target_time(N)` for N = 0..size-1: the same numbers, which a model may
        compute faster (policies price a whole step's table each step)."""
        return np.asarray(self.target_time(np.arange(size), context_tokens, batch_size), np.float64)

    def step_prices(self, size: int, context_tokens: int, draft_batch: int,
                    batch_size: int = 0) -> tuple[np.ndarray, float]:
        """A step's prices: `target_by_n(size, context_tokens, batch_size)` and
        `draft_time(draft_batch, context_tokens)`, the same numbers, which a model may compute in
        one go (dspark prices both every step)."""
        return self.target_by_n(size, context_tokens, batch_size), float(self.draft_time(draft_batch, context_tokens))

    def jump_s(self, batch_size: int, context_tokens: int = 0) -> float | None:
        """Seconds a pass of `batch_size` rows with one of them verifying a drafted token costs
        over this model's price of N = batch_size + 1 tokens: the jump from a plain pass to a
        ragged one, which a table interpolated between grid cells cannot hold. None: not known
        (the default)."""
        return None

    def ready(self) -> None:
        """Bring tables rebuilt lazily after a correction up to date (the next query would). Default: no-op."""
        return None

    def at_batch(self, batch_size: int) -> "CostModel":
        """The model as one step of `batch_size` sequences sees it, with the `StepCost` signature
        policies call (`target_time(N, ctx)`): itself, unless it prices step shapes (`ProfiledCost`
        with a decode table), which returns a view bound to that batch."""
        return self

    # Seconds a step takes outside the two models' passes (scheduling, sampling, the controller):
    # `step_overhead_s` every step pays, whatever its depth (included in `target_time`), and
    # `pass_overhead_s` more for each draft pass (included in `draft_time`). 0 unless a model learns them.
    step_overhead_s: float = 0.0
    pass_overhead_s: float = 0.0
    # whether `observe` refines the model (a policy may then show it steps it would not take)
    learns: bool = False

    def observe(self, n_tokens: int, context_tokens: int, target_s: float, draft_batch: int,
                draft_passes: int, draft_s: float, overhead_s: float | None = None,
                overhead_passes: int = 0, batch_size: int = 0) -> None:
        """Refine from one measured step of `batch_size` sequences (target pass, `draft_passes`
        draft passes) and one step's time outside its passes (`overhead_s`, of a step with
        `overhead_passes` draft passes: the engine reports the last complete step's). Default: no-op."""
        return None

    def sps(self, n_tokens: np.ndarray | int, context_tokens: int = 0) -> np.ndarray | float:
        """SPS(N, ctx): target steps per second."""
        return _like(1.0 / np.asarray(self.target_time(n_tokens, context_tokens)), n_tokens)

    def knee(self, context_tokens: int = 0, elasticity: float = 0.5, max_tokens: int = 1 << 14) -> int:
        """Step tokens where the target pass turns compute-bound: the smallest N whose step-time
        elasticity N * (t(N + 1) - t(N)) / t(N) reaches `elasticity`.

        Below the knee time per token falls almost as 1/N (extra step tokens are nearly free: the
        free compute speculation spends); past it, doubling N costs at least ~2**elasticity - 1
        more time. For a roofline it is where compute overtakes memory. Returns `max_tokens` when
        the curve never gets that steep within it (e.g. `FixedCost`).
        """
        n = np.arange(1, max_tokens + 2)
        t = np.asarray(self.target_time(n, context_tokens), dtype=np.float64)
        e = n[:-1] * np.diff(t) / t[:-1]  # (max_tokens,) elasticity at N = 1..max_tokens
        above = np.nonzero(e >= elasticity)[0]
        return int(n[above[0]]) if len(above) else max_tokens

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, **self.to_dict()}, indent=1)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "CostModel":
        """Raises ValueError on an unknown kind or bad fields."""
        d = dict(d)
        d.pop("format", None)
        kind = d.pop("kind", None)
        if kind not in COST_KINDS:
            raise ValueError(f"unknown cost model kind {kind!r}; expected one of {sorted(COST_KINDS)}")
        try:
            return COST_KINDS[kind]._from_dict(d)
        except TypeError as e:  # missing or unexpected fields
            raise ValueError(f"bad {kind} cost model: {e}") from None

    @staticmethod
    def from_json(text: str) -> "CostModel":
        d = json.loads(text)
        if not isinstance(d, dict) or d.get("format", FORMAT) != FORMAT:
            raise ValueError(f"not a specdepth cost model (expected format {FORMAT!r})")
        return CostModel.from_dict(d)

    @classmethod
    def _from_dict(cls, d: dict[str, Any]) -> "CostModel":
        return cls(**d)
