"""A cost model for model-free drafters: the target priced as before, drafting free.

An n-gram or suffix drafter runs no model pass: its proposals cost microseconds of host work,
which the step's overhead already carries. Wrapping the pair's cost model in `FreeDraftCost`
prices a draft pass at 0, so depth is priced by verification alone, and keeps the draft
model's table out of the online learning (the drafting steps report no draft passes to it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specdepth.adaptive.cost.base import CostModel


class FreeDraftCost(CostModel):
    kind = "free-draft"
    pass_overhead_s = 0.0

    def __init__(self, inner: CostModel) -> None:
        if isinstance(inner, FreeDraftCost):
            inner = inner.inner
        self.inner = inner

    @property
    def step_overhead_s(self) -> float:  # type: ignore[override]
        return self.inner.step_overhead_s

    @property
    def learns(self) -> bool:  # type: ignore[override]
        return self.inner.learns

    def target_time(self, n_tokens: np.ndarray | int, context_tokens: int = 0,
                    batch_size: int = 0) -> np.ndarray | float:
        return self.inner.target_time(n_tokens, context_tokens, batch_size)

    def draft_time(self, batch_size: int, context_tokens: int = 0) -> float:
        return 0.0

    def target_by_n(self, size: int, context_tokens: int = 0, batch_size: int = 0) -> np.ndarray:
        return self.inner.target_by_n(size, context_tokens, batch_size)

    def step_prices(self, size: int, context_tokens: int, draft_batch: int,
                    batch_size: int = 0) -> tuple[np.ndarray, float]:
        return self.inner.target_by_n(size, context_tokens, batch_size), 0.0

    def ready(self) -> None:
        self.inner.ready()

    def at_batch(self, batch_size: int) -> CostModel:
        view = self.inner.at_batch(batch_size)
        return self if view is self.inner else FreeDraftCost(view)

    def observe(self, n_tokens: int, context_tokens: int, target_s: float, draft_batch: int,
                draft_passes: int, draft_s: float, overhead_s: float | None = None,
                overhead_passes: int = 0, batch_size: int = 0) -> None:
        self.inner.observe(n_tokens, context_tokens, target_s, draft_batch, 0, 0.0, overhead_s, 0,
                           batch_size=batch_size)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "inner": self.inner.to_dict()}

    @classmethod
    def _from_dict(cls, d: dict[str, Any]) -> "FreeDraftCost":
        return cls(CostModel.from_dict(d["inner"]))
