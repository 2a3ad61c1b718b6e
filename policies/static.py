"""Batch-level fixed-depth peers: `off`, `static`, `vllm-disable`, `vllm-table`.

None of them learns anything: each reads the batch size and returns the same budget for every
sequence. They are the vLLM configuration knobs (DESIGN.md, "The peers' policies").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from specdepth.policies.base import DepthPolicy, PlanContext


def uniform_budgets(ctx: PlanContext, k: int) -> np.ndarray:
    """(B,) int64 budgets, all `min(k, ctx.max_depth)`."""
    return np.full(ctx.batch_size, min(int(k), ctx.max_depth), dtype=np.int64)


def _check_depth(name: str, key: str, k: int) -> int:
    if isinstance(k, bool) or int(k) != k or k < 0:
        raise ValueError(f"{name}: {key} must be an integer >= 0, got {k!r}")
    return int(k)


class Off(DepthPolicy):
    """No speculation: every budget is 0 (plain decoding through the same engine)."""

    name: ClassVar[str] = "off"
    params: ClassVar[dict[str, object]] = {}

    def plan(self, ctx: PlanContext) -> np.ndarray:
        return np.zeros(ctx.batch_size, dtype=np.int64)  # (B,)


class Static(DepthPolicy):
    """Fixed k for every sequence and step (vLLM `num_speculative_tokens`)."""

    name: ClassVar[str] = "static"
    params: ClassVar[dict[str, object]] = {"k": 3}

    def __init__(self, k: int = 3) -> None:
        self.k = _check_depth(self.name, "k", k)

    def depths_asked(self) -> tuple[int, ...]:
        return (self.k,)

    def plan(self, ctx: PlanContext) -> np.ndarray:
        return uniform_budgets(ctx, self.k)  # (B,)


class VllmDisable(DepthPolicy):
    """Static k, but 0 for the whole step once running requests >= threshold.

    vLLM `speculative_disable_by_batch_size`: speculation is disabled for a step when the number
    of running requests reaches the threshold (`running_queue_size >= disable_by_batch_size`).
    """

    name: ClassVar[str] = "vllm-disable"
    params: ClassVar[dict[str, object]] = {"k": 3, "threshold": 8}

    def __init__(self, k: int = 3, threshold: int = 8) -> None:
        self.k = _check_depth(self.name, "k", k)
        self.threshold = _check_depth(self.name, "threshold", threshold)
        if self.threshold < 1:
            raise ValueError(f"{self.name}: threshold must be >= 1, got {threshold}")

    def depths_asked(self) -> tuple[int, ...]:
        return (self.k,)

    def plan(self, ctx: PlanContext) -> np.ndarray:
        k = 0 if ctx.batch_size >= self.threshold else self.k
        return uniform_budgets(ctx, k)  # (B,)


TableRows = Sequence[tuple[int, int, int]]


def parse_table(table: str | TableRows) -> tuple[tuple[int, int, int], ...]:
    """Parse and validate a batch-size table `lo-hi:k/lo-hi:k/...` (or a sequence of triples).

    Args:
        table: e.g. "1-4:5/5-16:3/17-256:1", or [(1, 4, 5), (5, 16, 3), (17, 256, 1)].

    Returns:
        The (bs_lo, bs_hi, k) rows, in order.

    Raises:
        ValueError: malformed item; empty table; first range not starting at 1; a range with
            lo > hi; ranges not increasing or overlapping; negative k.
    """
    if isinstance(table, str):
        rows = []
        for item in table.split("/"):
            try:
                rng, k = item.split(":")
                lo, hi = rng.split("-")
                rows.append((int(lo), int(hi), int(k)))
            except ValueError:
                raise ValueError(
                    f"vllm-table: bad table item {item!r} in {table!r}; expected 'lo-hi:k' items "
                    "separated by '/', e.g. '1-4:5/5-16:3/17-256:1'"
                ) from None
    else:
        rows = [tuple(int(v) for v in row) for row in table]
        if any(len(r) != 3 for r in rows):
            raise ValueError(f"vllm-table: each row must be (bs_lo, bs_hi, k), got {table!r}")
    if not rows:
        raise ValueError("vllm-table: the table is empty")
    if rows[0][0] != 1:
        raise ValueError(f"vllm-table: the first range must start at batch size 1, got {rows[0][0]}")
    prev_hi = 0
    for lo, hi, k in rows:
        if lo > hi:
            raise ValueError(f"vllm-table: range {lo}-{hi} has lo > hi")
        if lo <= prev_hi:
            raise ValueError(f"vllm-table: range {lo}-{hi} overlaps or precedes the previous one")
        if k < 0:
            raise ValueError(f"vllm-table: k must be >= 0, got {k} for range {lo}-{hi}")
        prev_hi = hi
    return tuple(rows)  # type: ignore[return-value]


class VllmTable(DepthPolicy):
    """k by scheduled batch size from a user table (vLLM `num_speculative_tokens_per_batch_size`).

    Rows are [bs_lo, bs_hi, k]; the first starts at 1. A batch size in a gap between two ranges
    inherits the k of the range before it, and one beyond the last range uses the last k.
    """

    name: ClassVar[str] = "vllm-table"
    params: ClassVar[dict[str, object]] = {"table": "1-4:5/5-16:3/17-256:1"}

    def __init__(self, table: str | TableRows = "1-4:5/5-16:3/17-256:1") -> None:
        rows = parse_table(table)
        self.table = "/".join(f"{lo}-{hi}:{k}" for lo, hi, k in rows)  # normalised, for describe()
        self._lo = np.array([r[0] for r in rows], dtype=np.int64)  # (R,) range starts
        self._k = np.array([r[2] for r in rows], dtype=np.int64)  # (R,)

    def depths_asked(self) -> tuple[int, ...]:
        return tuple(int(k) for k in self._k)

    def depth_for(self, batch_size: int) -> int:
        """k for a batch size: the last range starting at or below it (gaps inherit)."""
        i = int(np.searchsorted(self._lo, batch_size, side="right")) - 1
        return int(self._k[max(i, 0)])

    def plan(self, ctx: PlanContext) -> np.ndarray:
        return uniform_budgets(ctx, self.depth_for(ctx.batch_size))  # (B,)
