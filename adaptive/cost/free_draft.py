"""A cost model for model-free drafters: the target priced as before, no draft pass.

An n-gram or suffix drafter runs no model pass: depth costs it nothing, so wrapping the pair's
cost model in `FreeDraftCost` prices a draft pass at 0 and keeps the draft model's table out of
the online learning (the drafting steps report no draft passes to it). Proposing is host work per
row, though: ~10-15 us a row here, 0.7-1 ms at batch 64, 4-6% of a plain step there. `drafting_s(B)` is
that price, learned from the steps that drafted (`draft_s` per row, a running mean); a plan pays
it once if it drafts at all (dspark's `first`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specdepth.adaptive.cost.base import CostModel


DRAFT_RATE = 0.1  # the running mean's weight on a new step, once it has 1 / DRAFT_RATE steps


class _RowTime:
    """Seconds of proposing per drafting row, a running mean; shared by a model's batch views."""

    def __init__(self) -> None:
        self.row_s, self.n = 0.0, 0

    def add(self, seconds: float, rows: int) -> None:
        w = max(1.0 / (self.n + 1), DRAFT_RATE)
        self.row_s = (1 - w) * self.row_s + w * seconds / rows
        self.n += 1


class FreeDraftCost(CostModel):
    kind = "free-draft"
    pass_overhead_s = 0.0

    def __init__(self, inner: CostModel, _rows: _RowTime | None = None) -> None:
        if isinstance(inner, FreeDraftCost):
            inner, _rows = inner.inner, inner._rows if _rows is None else _rows
        self.inner = inner
        self._rows = _rows if _rows is not None else _RowTime()

    def drafting_s(self, batch_size: int) -> float:
        """Seconds of host work proposing for `batch_size` rows (0 until a step has drafted)."""
        return self._rows.row_s * batch_size

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

    def jump_s(self, batch_size: int, context_tokens: int = 0) -> float | None:
        return self.inner.jump_s(batch_size, context_tokens)

    def ready(self) -> None:
        self.inner.ready()

    def at_batch(self, batch_size: int) -> CostModel:
        view = self.inner.at_batch(batch_size)
        return self if view is self.inner else FreeDraftCost(view, self._rows)

    def observe(self, n_tokens: int, context_tokens: int, target_s: float, draft_batch: int,
                draft_passes: int, draft_s: float, overhead_s: float | None = None,
                overhead_passes: int = 0, batch_size: int = 0) -> None:
        if draft_passes > 0 and draft_batch > 0 and self.learns:
            self._rows.add(draft_s, draft_batch)
        self.inner.observe(n_tokens, context_tokens, target_s, draft_batch, 0, 0.0, overhead_s, 0,
                           batch_size=batch_size)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "inner": self.inner.to_dict()}

    @classmethod
    def _from_dict(cls, d: dict[str, Any]) -> "FreeDraftCost":
        return cls(CostModel.from_dict(d["inner"]))
