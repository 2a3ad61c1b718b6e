"""Measured step times: a profiled table, interpolated, priced in the step's own shape.

`cost.profiler.profile` builds one on a real pair; `cost.learning.OnlineRefinement` refines it
from the step times the engine reports.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from specdepth.adaptive.cost.base import CostModel, _like
from specdepth.adaptive.cost.kernels import by_n_kernel, point_kernel, prices_kernel, refresh_kernel, row_kernel
from specdepth.adaptive.cost.learning import CELL_SHARE, OnlineRefinement

_FAR = 1e12  # a grid point far right of any step: np.interp then extrapolates the last segment
_SCALARS = (int, float, np.integer, np.floating)


class _Interp:
    """f(ctx, x) over a (ctx grid x x grid) table: linear in both, clamped on the left, extrapolated
    linearly on the right. The row at one context is cached, so a step's many queries at the same
    context are one `np.interp` each."""

    def __init__(self, table: np.ndarray, ctx_grid: np.ndarray, x_grid: np.ndarray) -> None:
        self.table, self.ctx_grid = table, ctx_grid  # (Nc, Nx), (Nc,)
        self.x_ext = np.append(x_grid, _FAR) if len(x_grid) > 1 else np.array([0.0, _FAR])  # (Nx + 1,)
        self._ctx: float | None = None
        self._row = np.zeros(0)  # (Nx + 1,) the table at self._ctx, with its far point

    def reset(self, table: np.ndarray) -> None:
        """The same grids over a new table."""
        self.table, self._ctx = table, None

    def row(self, ctx: float) -> np.ndarray:
        if ctx != self._ctx:
            # = kernels_reference.row(self.table, self.ctx_grid, self.x_ext, ctx), compiled
            self._row, self._ctx = row_kernel(self.table, self.ctx_grid, self.x_ext, float(ctx), _FAR), ctx
        return self._row

    def grid_at(self, x: np.ndarray) -> np.ndarray:
        """(Nc, len(x)) the table at every context of its grid, at x."""
        return np.array([self(c, x) for c in self.ctx_grid])

    def __call__(self, ctx: float, x: Any) -> np.ndarray:
        row = self.row(float(ctx))
        if len(row) == 2:  # a one-point grid: constant
            return np.full(np.shape(x), row[0])
        return np.interp(x, self.x_ext, row)


def _isotonic(y: np.ndarray) -> np.ndarray:
    """Least-squares non-decreasing fit of a 1-D sequence (pool adjacent violators).

    Unlike a running max, one slow outlier is averaged with its neighbours instead of raising
    everything after it. It is order-preserving and scale-equivariant, so a cell moved by at most
    a factor (1 + s) moves the fitted curve by at most that factor too.
    """
    vals: list[float] = []
    counts: list[int] = []
    for v in y:
        vals.append(float(v))
        counts.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            n = counts[-2] + counts[-1]
            vals[-2] = (vals[-2] * counts[-2] + vals[-1] * counts[-1]) / n
            counts[-2] = n
            vals.pop()
            counts.pop()
    return np.repeat(vals, counts)


def _monotone(table: np.ndarray) -> np.ndarray:
    """(Nc, Nx) table made non-decreasing along both axes: more tokens or more context is never
    faster. Isotonic along x, then along context (which keeps the first, being order-preserving)."""
    out = table.copy()
    for axis in (1, 0):  # rows (along x) first, then columns (along context)
        view = out if axis == 1 else out.T
        for i in np.flatnonzero((np.diff(view, axis=1) < 0).any(axis=1)):  # only lines that decrease
            view[i] = _isotonic(view[i])
    return out


class ProfiledCost(OnlineRefinement, CostModel):
    """Measured step times, interpolated (piecewise linear, extrapolated linearly on the right).

    Tables are (context grid x token grid) for the target and (context grid x batch grid) for one
    draft pass. The target's table times N step tokens in one shape, N / 4 sequences of 4, while
    a decode step is B sequences of 1 to K + 1 tokens, and the two shapes differ in what drafting
    seems to cost. Given the step's batch size B (`at_batch`, which the controller hands policies
    each step), a model profiled with a decode table (the target at B sequences of one token,
    `decode_s`) prices every N of that step as the table plus the decode shape's offset at N = B:
    the step without drafts is then what was measured in its own shape.

    `target_time` includes the learned `step_overhead_s` (every step pays it whatever its depth)
    and `draft_time` the learned `pass_overhead_s`; see `cost.learning` for the online refinement
    (`lr`, `max_step`, `cell_share`, `speed_*`, `frozen`, and the learned state's arguments).
    """

    kind: ClassVar[str] = "profiled"

    def __init__(self, token_grid: Any, ctx_grid: Any, target_s: Any, draft_batch_grid: Any,
                 draft_s: Any, *, lr: float = 0.1, max_step: float = 0.03, frozen: bool = False,
                 target_logcorr: Any = None, draft_logcorr: Any = None, speed_logcorr: float = 0.0,
                 cell_share: float = CELL_SHARE, speed_lr: float = 0.45, speed_max_step: float = 0.09,
                 step_overhead_s: float = 0.0, pass_overhead_s: float = 0.0,
                 overhead_moments: Any = None, draft_ratio_logcorr: float = 0.0, draft_steps: float = 0.0,
                 decode_s: Any = None, near_s: Any = None, overhead_bucket: int = 0, overhead_lines: Any = None,
                 meta: dict[str, Any] | None = None) -> None:
        self.token_grid = np.asarray(token_grid, np.float64)  # (Nt,) step tokens
        self.ctx_grid = np.asarray(ctx_grid, np.float64)  # (Nc,) context tokens
        self.batch_grid = np.asarray(draft_batch_grid, np.float64)  # (Nb,) draft batch sizes
        self.base_target = np.asarray(target_s, np.float64).reshape(len(self.ctx_grid), -1)  # (Nc, Nt)
        self.base_draft = np.asarray(draft_s, np.float64).reshape(len(self.ctx_grid), -1)  # (Nc, Nb)
        for name, g in (("token_grid", self.token_grid), ("ctx_grid", self.ctx_grid),
                        ("draft_batch_grid", self.batch_grid)):
            if len(g) == 0 or np.any(np.diff(g) <= 0):
                raise ValueError(f"{name} must be non-empty and strictly increasing, got {g.tolist()}")
        if self.base_target.shape[1] != len(self.token_grid) or self.base_draft.shape[1] != len(self.batch_grid):
            raise ValueError("table shapes do not match their grids")
        if not (np.all(self.base_target > 0) and np.all(self.base_draft > 0)):
            raise ValueError("step times must be positive")
        self._init_learning(lr, max_step, frozen, target_logcorr, draft_logcorr, speed_logcorr, cell_share,
                            speed_lr, speed_max_step, step_overhead_s, pass_overhead_s, overhead_moments,
                            draft_ratio_logcorr, draft_steps, overhead_bucket, overhead_lines)
        self.base_target, self.base_draft = _monotone(self.base_target), _monotone(self.base_draft)
        # (Nc, Nb) the target's pass at B sequences of one token each (the decode shape), or None
        self.base_decode = None if decode_s is None else \
            _monotone(np.asarray(decode_s, np.float64).reshape(len(self.ctx_grid), -1))
        if self.base_decode is not None:
            if self.base_decode.shape[1] != len(self.batch_grid) or not np.all(self.base_decode > 0):
                raise ValueError("decode_s must be positive, one row per context over the draft batch grid")
            table = _Interp(self.base_target, self.ctx_grid, self.token_grid)
            at_b = table.grid_at(self.batch_grid)  # (Nc, Nb) the table at N = B tokens
            # the decode shape's offset to the table at N = B tokens: fixed (profiled, uncorrected)
            self._offset_f = _Interp(self.base_decode - at_b, self.ctx_grid, self.batch_grid)
        # (Nc, Nb) the target's pass at B sequences, one of them of two tokens (a verify of one
        # drafted token), or None; needs the decode table
        self.base_near = None if near_s is None or self.base_decode is None else \
            np.asarray(near_s, np.float64).reshape(len(self.ctx_grid), -1)
        if self.base_near is not None:
            if self.base_near.shape[1] != len(self.batch_grid) or not np.all(self.base_near > 0):
                raise ValueError("near_s must be positive, one row per context over the draft batch grid")
            # the near shape over the decode shape, less what the table prices from N = B to B + 1
            priced = table.grid_at(self.batch_grid + 1) - at_b  # (Nc, Nb)
            self._jump_f = _Interp(np.maximum(self.base_near - self.base_decode - priced, 0.0), self.ctx_grid,
                                   self.batch_grid)
        self.meta = dict(meta or {})
        self._target_f: _Interp | None = None  # the tables' interpolators, made at the first refresh
        self._draft_f: _Interp | None = None
        self._refresh()

    @classmethod
    def _from_dict(cls, d: dict[str, Any]) -> "ProfiledCost":
        d = dict(d)
        if "speed_share" in d:  # the old name, still in saved profiles: the share the cells left
            d["cell_share"] = 1.0 - d.pop("speed_share")
        return cls(**d)

    def _refresh(self) -> None:
        """Rebuild the corrected monotone tables (lazily: at the first query after a correction)."""
        # = kernels_reference.monotone_fast(base * np.exp(logcorr)) of each, in one compiled call
        self._target_table, self._draft_table = refresh_kernel(self.base_target, self.target_logcorr,
                                                               self.base_draft, self.draft_logcorr)  # (Nc, Nt), (Nc, Nb)
        if self._target_f is None or self._draft_f is None:  # the first refresh (construction)
            self._target_f = _Interp(self._target_table, self.ctx_grid, self.token_grid)
            self._draft_f = _Interp(self._draft_table, self.ctx_grid, self.batch_grid)
        else:
            self._target_f.reset(self._target_table)
            self._draft_f.reset(self._draft_table)
        self._dirty = False

    def ready(self) -> None:
        """Rebuild the tables now if a correction left them stale (the next query would)."""
        if self._dirty:
            self._refresh()

    @property
    def target_table(self) -> np.ndarray:
        if self._dirty:
            self._refresh()
        return self._target_table

    @property
    def draft_table(self) -> np.ndarray:
        if self._dirty:
            self._refresh()
        return self._draft_table

    def target_time(self, n_tokens: np.ndarray | int, context_tokens: int = 0,
                    batch_size: int = 0) -> np.ndarray | float:
        if self._dirty:
            self._refresh()
        if isinstance(n_tokens, _SCALARS):  # one size: the array path's floats, in one compiled call
            shift = batch_size > 0 and self.base_decode is not None
            o = self._offset_f if shift else self._target_f  # the offset's table (unread without the shift)
            return float(point_kernel(float(n_tokens), float(context_tokens), _FAR, self._target_table, self.ctx_grid,
                                      self._target_f.x_ext, shift, o.table, o.x_ext,
                                      float(min(batch_size, self.batch_grid[-1])), math.exp(self.speed_logcorr),
                                      self.step_overhead_s))
        t = self._target_f(context_tokens, n_tokens)
        if batch_size > 0 and self.base_decode is not None:  # priced in the step's shape (class doc)
            t = np.maximum(t + float(self._offset_f(context_tokens, min(batch_size, self.batch_grid[-1]))), 0.5 * t)
        return _like(t * math.exp(self.speed_logcorr) + self.step_overhead_s, n_tokens)

    def target_by_n(self, size: int, context_tokens: int = 0, batch_size: int = 0) -> np.ndarray:
        # = target_time(np.arange(size), context_tokens, batch_size), bit for bit, in one compiled call
        if self._dirty:
            self._refresh()
        shift = batch_size > 0 and self.base_decode is not None
        o = self._offset_f if shift else self._target_f  # the offset's row (unread without the shift)
        return by_n_kernel(int(size), self._target_f.x_ext, self._target_f.row(float(context_tokens)), shift,
                           float(min(batch_size, self.batch_grid[-1])), o.x_ext, o.row(float(context_tokens)),
                           math.exp(self.speed_logcorr), self.step_overhead_s)

    def step_prices(self, size: int, context_tokens: int, draft_batch: int,
                    batch_size: int = 0) -> tuple[np.ndarray, float]:
        # = (target_by_n(...), draft_time(draft_batch, ...)), bit for bit, in one compiled call
        if self._dirty:
            self._refresh()
        shift = batch_size > 0 and self.base_decode is not None
        o = self._offset_f if shift else self._draft_f  # the offset's table (unread without the shift)
        t, d = prices_kernel(int(size), float(context_tokens), _FAR, self._target_table, self.ctx_grid,
                             self._target_f.x_ext, shift, o.table, self._draft_f.x_ext,
                             float(min(batch_size, self.batch_grid[-1])), self._draft_table, float(draft_batch),
                             math.exp(self.speed_logcorr), self.step_overhead_s,
                             math.exp(self.speed_logcorr + self.draft_ratio_logcorr), self.pass_overhead_s)
        return t, float(d)

    def jump_s(self, batch_size: int, context_tokens: int = 0) -> float | None:
        """The profiled jump (`CostModel.jump_s`), scaled as the model's passes are; None without a
        near table, 0 at batch 1 (a pass of one sequence of two tokens is the table's own shape)."""
        if self.base_near is None:
            return None
        if batch_size < 2:
            return 0.0
        b = float(min(batch_size, self.batch_grid[-1]))
        return max(float(self._jump_f(context_tokens, b)), 0.0) * math.exp(self.speed_logcorr)

    def at_batch(self, batch_size: int) -> CostModel:
        return self if self.base_decode is None or batch_size <= 0 else _AtBatch(self, batch_size)

    def draft_time(self, batch_size: int, context_tokens: int = 0) -> float:
        if self._dirty:
            self._refresh()
        return float(self._draft_f(context_tokens, batch_size)) * math.exp(self.speed_logcorr + self.draft_ratio_logcorr) \
            + self.pass_overhead_s

    def _pass_time(self, batch_size: int, context_tokens: int) -> float:
        """One draft pass's predicted time without the overhead outside it."""
        return self.draft_time(batch_size, context_tokens) - self.pass_overhead_s

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "token_grid": self.token_grid.tolist(), "ctx_grid": self.ctx_grid.tolist(),
                "target_s": self.base_target.tolist(), "draft_batch_grid": self.batch_grid.tolist(),
                "draft_s": self.base_draft.tolist(), **self._learning_dict(),
                **({} if self.base_decode is None else {"decode_s": self.base_decode.tolist()}),
                **({} if self.base_near is None else {"near_s": self.base_near.tolist()}), "meta": self.meta}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")


class _AtBatch:
    """A `ProfiledCost` bound to one step's batch size (`ProfiledCost.at_batch`): the `StepCost`
    calls policies make price the target in that step's shape; everything else is the model's."""

    def __init__(self, model: ProfiledCost, batch_size: int) -> None:
        self.model, self.batch_size = model, int(batch_size)

    def target_time(self, n_tokens: np.ndarray | int, context_tokens: int = 0,
                    batch_size: int = 0) -> np.ndarray | float:
        return self.model.target_time(n_tokens, context_tokens, batch_size or self.batch_size)

    def target_by_n(self, size: int, context_tokens: int = 0, batch_size: int = 0) -> np.ndarray:
        return self.model.target_by_n(size, context_tokens, batch_size or self.batch_size)

    def draft_time(self, batch_size: int, context_tokens: int = 0) -> float:
        return self.model.draft_time(batch_size, context_tokens)

    def step_prices(self, size: int, context_tokens: int, draft_batch: int,
                    batch_size: int = 0) -> tuple[np.ndarray, float]:
        return self.model.step_prices(size, context_tokens, draft_batch, batch_size or self.batch_size)

    def __getattr__(self, name: str) -> Any:  # only for names the view lacks
        if name == "model" or name.startswith("__"):  # unpickling (a Ray replica) before __dict__ is set
            raise AttributeError(name)
        return getattr(self.model, name)
