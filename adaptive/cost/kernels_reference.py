"""numpy statements of the numba kernels in `cost.kernels`, for tests only.

Each function here is the arithmetic a kernel compiles, written with numpy array calls in the
same order, so the tests can check a kernel against it. Nothing in the library calls them.
"""

from __future__ import annotations

import numpy as np

from specdepth.adaptive.cost.profiled import _FAR


def cells(x: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bracketing grid indices (i0, i1) and weight w of i1 for each x, linear extrapolation on
    the right (w > 1), clamped on the left (w = 0)."""
    if len(grid) == 1:
        z = np.zeros(np.shape(x), dtype=np.int64)
        return z, z, np.zeros(np.shape(x))
    i0 = np.minimum(np.maximum(np.searchsorted(grid, x, side="right") - 1, 0), len(grid) - 2)
    w = (np.asarray(x, np.float64) - grid[i0]) / (grid[i0 + 1] - grid[i0])
    return i0, i0 + 1, np.maximum(w, 0.0)


def row(table: np.ndarray, ctx_grid: np.ndarray, x_ext: np.ndarray, ctx: float) -> np.ndarray:
    """(Nx + 1,) `cost.kernels.row_kernel`: the (Nc, Nx) table at context `ctx`, and at x = _FAR
    (x_ext: the x grid, then _FAR)."""
    i0, i1, w = cells(np.float64(ctx), ctx_grid)
    r = table[int(i0)] + float(w) * (table[int(i1)] - table[int(i0)])  # (Nx,)
    if len(r) > 1:
        far = r[-1] + (r[-1] - r[-2]) / (x_ext[-2] - x_ext[-3]) * (_FAR - x_ext[-2])
    else:
        r, far = np.repeat(r, 1), r[-1]
    return np.append(r, far)


def monotone_fast(table: np.ndarray) -> np.ndarray:
    """`cost.kernels.monotone_kernel`: the (Nc, Nx) table made non-decreasing along x, then along
    context, each line becoming the midpoint of its running max from the left and running min from
    the right. That is the line itself where it is already monotone; like the profile's isotonic
    fit it is order-preserving and scale-equivariant, so a cell moved by at most (1 + s) moves the
    result by at most that factor."""
    out = table
    for axis in (1, 0):
        up = np.maximum.accumulate(out, axis=axis)
        rev = out[:, ::-1] if axis == 1 else out[::-1]
        down = np.minimum.accumulate(rev, axis=axis)
        out = 0.5 * (up + (down[:, ::-1] if axis == 1 else down[::-1]))
    return out
