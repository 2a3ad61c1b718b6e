"""Compiled loops for the profiled cost model's per-step hot path (numba).

Every step the controller refines `ProfiledCost` from the step's measured times, and the next
query rebuilds the corrected monotone tables and the row at the batch's new context (the context
grows every step): in numpy, tens of small array calls a step, paid by every policy. These
kernels are the same arithmetic in one call each, in the same order, so they give the same
floats; `tests/adaptive/cost/test_model.py` checks them against `kernels_reference`.

Pure arithmetic on the arrays passed in: no state, clock or RNG.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _midpoint_line(line: np.ndarray, out: np.ndarray) -> None:
    """out = 0.5 * (running max from the left + running min from the right) of `line`."""
    n = line.shape[0]
    down = np.empty(n)
    m = line[n - 1]
    for i in range(n - 1, -1, -1):
        m = min(m, line[i])
        down[i] = m
    m = line[0]
    for i in range(n):
        m = max(m, line[i])
        out[i] = 0.5 * (m + down[i])


@njit(cache=True)
def monotone_kernel(table: np.ndarray) -> np.ndarray:
    """(Nc, Nx) float64 -> `kernels_reference.monotone_fast(table)`: the midpoint line along x,
    then along context."""
    nc, nx = table.shape
    rows = np.empty((nc, nx))
    for c in range(nc):
        _midpoint_line(table[c], rows[c])
    out = np.empty((nc, nx))
    col, res = np.empty(nc), np.empty(nc)
    for x in range(nx):
        for c in range(nc):
            col[c] = rows[c, x]
        _midpoint_line(col, res)
        for c in range(nc):
            out[c, x] = res[c]
    return out


@njit(cache=True)
def refresh_kernel(base_target: np.ndarray, target_logcorr: np.ndarray, base_draft: np.ndarray,
                   draft_logcorr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`ProfiledCost._refresh`'s two corrected monotone tables in one call:
    (monotone_kernel(base_target * exp(target_logcorr)), the same of the draft's)."""
    return monotone_kernel(base_target * np.exp(target_logcorr)), monotone_kernel(base_draft * np.exp(draft_logcorr))


@njit(cache=True)
def row_kernel(table: np.ndarray, ctx_grid: np.ndarray, x_ext: np.ndarray, ctx: float, far: float) -> np.ndarray:
    """(Nx + 1,) `cost.profiled._Interp.row`: the (Nc, Nx) table interpolated at context `ctx`
    (linear, clamped on the left, extrapolated on the right), then its value at x = `far` (the last
    segment extended; x_ext is the x grid with `far` appended)."""
    nc, nx = table.shape
    i0, w = 0, 0.0
    if nc > 1:
        i0 = min(max(np.searchsorted(ctx_grid, ctx, side="right") - 1, 0), nc - 2)
        w = max((ctx - ctx_grid[i0]) / (ctx_grid[i0 + 1] - ctx_grid[i0]), 0.0)
    i1 = i0 + 1 if nc > 1 else 0
    out = np.empty(nx + 1)
    for k in range(nx):
        out[k] = table[i0, k] + w * (table[i1, k] - table[i0, k])
    if nx > 1:
        out[nx] = out[nx - 1] + (out[nx - 1] - out[nx - 2]) / (x_ext[nx - 1] - x_ext[nx - 2]) * (far - x_ext[nx - 1])
    else:
        out[nx] = out[nx - 1]
    return out


@njit(cache=True)
def _interp_at(x: float, xp: np.ndarray, fp: np.ndarray) -> float:
    """np.interp(x, xp, fp) for one x, in numpy's arithmetic: fp[0] left of the grid, fp[-1] from
    its last point on, fp[j] on a grid point, else slope * (x - xp[j]) + fp[j]."""
    n = xp.shape[0]
    if x < xp[0]:
        return fp[0]
    if x >= xp[n - 1]:
        return fp[n - 1]
    j = np.searchsorted(xp, x, side="right") - 1  # xp[j] <= x < xp[j + 1]
    if xp[j] == x:
        return fp[j]
    return (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j]) * (x - xp[j]) + fp[j]


@njit(cache=True)
def by_n_kernel(size: int, x_ext: np.ndarray, row: np.ndarray, shift: bool, b: float, b_ext: np.ndarray,
                b_row: np.ndarray, scale: float, overhead: float) -> np.ndarray:
    """(size,) `ProfiledCost.target_time(np.arange(size), ctx, B)` from the rows at the step's
    context: the target's row (`_Interp.row`, x_ext its grid) at N = 0..size-1; with `shift`,
    plus the decode offset's row at b = min(B, the batch grid's end), floored at half; times
    `scale` (the speed), plus `overhead` (the step's), in that order."""
    out = np.empty(size)
    off = _interp_at(b, b_ext, b_row) if shift else 0.0
    for n in range(size):
        t = _interp_at(float(n), x_ext, row)
        if shift:
            t = max(t + off, 0.5 * t)
        out[n] = t * scale + overhead
    return out


@njit(cache=True)
def point_kernel(n: float, ctx: float, far: float, t_table: np.ndarray, ctx_grid: np.ndarray, x_ext: np.ndarray,
                 shift: bool, o_table: np.ndarray, b_ext: np.ndarray, b: float, scale: float, overhead: float) -> float:
    """`ProfiledCost.target_time(n, ctx, B)` of one step size n, as `by_n_kernel` prices each: the
    target's row at `ctx` at n (with `shift`, plus the decode offset's row of `o_table` at b),
    times `scale`, plus `overhead`."""
    t = _interp_at(n, x_ext, row_kernel(t_table, ctx_grid, x_ext, ctx, far))
    if shift:
        t = max(t + _interp_at(b, b_ext, row_kernel(o_table, ctx_grid, b_ext, ctx, far)), 0.5 * t)
    return t * scale + overhead


@njit(cache=True)
def prices_kernel(size: int, ctx: float, far: float, t_table: np.ndarray, ctx_grid: np.ndarray, x_ext: np.ndarray,
                  shift: bool, o_table: np.ndarray, b_ext: np.ndarray, b: float, d_table: np.ndarray, batch: float,
                  scale: float, overhead: float, d_scale: float, d_overhead: float) -> tuple[np.ndarray, float]:
    """A step's prices in one call, as `ProfiledCost.step_prices`: (size,) `by_n_kernel` over the
    target's row at `ctx` (with `shift`, plus the decode offset's row of `o_table` at b), and the
    draft pass of `batch` rows (`d_table`'s row at `ctx`, at `batch`, as `_Interp.__call__`;
    times `d_scale`, plus `d_overhead`). b_ext: the batch grid as the offset's and the draft's
    `_Interp` hold it."""
    row = row_kernel(t_table, ctx_grid, x_ext, ctx, far)
    b_row = row_kernel(o_table, ctx_grid, b_ext, ctx, far) if shift else row
    target = by_n_kernel(size, x_ext, row, shift, b, b_ext if shift else x_ext, b_row, scale, overhead)
    d_row = row_kernel(d_table, ctx_grid, b_ext, ctx, far)
    d = d_row[0] if d_row.shape[0] == 2 else _interp_at(batch, b_ext, d_row)
    return target, d * d_scale + d_overhead
