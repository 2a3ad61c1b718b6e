"""Step-time models: how long a target pass over N step tokens, and a draft pass, take.

The allocation maximises Theta = tau * SPS(N) (DESIGN.md "Allocation"); this module is SPS. Three
kinds behind one interface, `CostModel` (which implements `policies.base.StepCost`):

- `FixedCost`: every pass takes a constant time, for checks against Leviathan's formulas.
- `RooflineCost`: step time = max(compute, memory) + overhead, from a GPU preset and a
  target/draft size pair, for replay at scale.
- `ProfiledCost`: a measured table over (step tokens x context tokens), interpolated, refined
  online from reported step times with a bounded update. `adaptive.profiler.profile` builds one.

Times are seconds. `context_tokens` is the KV held by the whole batch (sum over sequences), which
is what a pass has to read. `parse_cost` turns a CLI spec into a model.
"""

from __future__ import annotations

import bisect
import json
import math
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from specdepth.adaptive.cost_kernels import by_n_kernel, prices_kernel, refresh_kernel, row_kernel

FORMAT = "specdepth-cost-v1"


def _like(x: np.ndarray, ref: Any) -> np.ndarray | float:
    """Return a Python float when the caller passed a scalar, else the array."""
    return float(x) if np.ndim(ref) == 0 else x


class CostModel(ABC):
    """Step-time model (seconds). Every kind is listed in `COST_KINDS` under its `kind`."""

    kind: ClassVar[str] = ""

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


# ---- fixed -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class FixedCost(CostModel):
    """Every target pass takes `target_ms`, every draft pass `draft_ms`, whatever the tokens."""

    target_ms: float = 10.0
    draft_ms: float = 0.5
    kind: ClassVar[str] = "fixed"

    def __post_init__(self) -> None:
        if not (self.target_ms > 0 and self.draft_ms >= 0):
            raise ValueError(f"need target_ms > 0 and draft_ms >= 0, got {self}")

    def target_time(self, n_tokens: np.ndarray | int, context_tokens: int = 0,
                    batch_size: int = 0) -> np.ndarray | float:
        return _like(np.full(np.shape(n_tokens), self.target_ms * 1e-3), n_tokens)

    def draft_time(self, batch_size: int, context_tokens: int = 0) -> float:
        return self.draft_ms * 1e-3

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}


# ---- roofline --------------------------------------------------------------------------------
@dataclass(frozen=True)
class GPUSpec:
    bandwidth: float  # bytes/s: achievable device-memory bandwidth (device-to-device copy)
    peak_flops: float  # FLOP/s: achievable dense bf16 (a large square matmul)
    note: str


GPUS: dict[str, GPUSpec] = {
    "h200": GPUSpec(4.3e12, 790e12, "H200 SXM 141GB, measured here: 4.3 TB/s D2D copy, 790 TFLOP/s "
                    "bf16 8192^3 matmul (datasheet 4.8 TB/s, 989 TFLOP/s)"),
    "h100": GPUSpec(3.0e12, 750e12, "H100 SXM 80GB: datasheet 3.35 TB/s HBM3, 989 TFLOP/s dense bf16; "
                    "~90% / ~75% achievable, as commonly measured"),
    "a100": GPUSpec(1.75e12, 270e12, "A100 SXM 80GB: datasheet 2.039 TB/s HBM2e, 312 TFLOP/s dense "
                    "bf16; ~86% / ~87% achievable, as commonly measured"),
}


@dataclass(frozen=True)
class ModelShape:
    """Attention shape of a named dense model: enough to size its KV cache per token."""

    name: str
    n_layers: int
    n_kv_heads: int
    head_dim: int

    def kv_bytes_per_token(self, bytes_per_elem: float) -> float:
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * bytes_per_elem  # K and V


# Sizes in billions of parameters. The 27B default is Gemma-2-27B's shape (GQA 32 query : 16 KV
# heads; 368 KiB of bf16 KV per token; its sliding-window layers are counted as global, an upper
# bound beyond 4k tokens per sequence). Other sizes use the nearest entry in log size, unless the
# spec sets target_kv_bytes / draft_kv_bytes.
SHAPES: dict[float, ModelShape] = {
    1: ModelShape("Llama-3.2-1B", 16, 8, 64),  # 32 KiB/token
    3: ModelShape("Llama-3.2-3B", 28, 8, 128),  # 112 KiB/token
    8: ModelShape("Llama-3.1-8B", 32, 8, 128),  # 128 KiB/token
    27: ModelShape("Gemma-2-27B", 46, 16, 128),  # 368 KiB/token
    70: ModelShape("Llama-3.1-70B", 80, 8, 128),  # 320 KiB/token
    405: ModelShape("Llama-3.1-405B", 126, 8, 128),  # 504 KiB/token
}


def shape_for(params_b: float) -> ModelShape:
    """The named shape nearest to `params_b` billion parameters (in log size)."""
    return SHAPES[min(SHAPES, key=lambda b: abs(math.log(b / params_b)))]


@dataclass(frozen=True)
class RooflineCost(CostModel):
    """step time = max(compute, memory) + overhead, per pass.

    compute = 2 * params * tokens / (compute_eff * peak_flops)
    memory  = (params * bytes_per_param + kv_bytes_per_token * context_tokens) / (memory_eff * bandwidth)
    Attention FLOPs and activation traffic are ignored (small next to the weights at these sizes).
    """

    gpu: str = "h200"  # key of GPUS
    target_b: float = 27.0  # target parameters, billions (dense)
    draft_b: float = 1.0  # draft parameters, billions
    bytes_per_param: float = 2.0  # bf16 weights and KV
    compute_eff: float = 0.75  # share of peak FLOP/s a decode step's GEMMs reach
    memory_eff: float = 0.9  # share of copy bandwidth weight streaming reaches
    target_overhead_ms: float = 1.0  # launches, sampling, scheduling per target pass (CUDA graphs)
    draft_overhead_ms: float = 0.3
    target_kv_bytes: float = 0.0  # KV bytes per context token; 0: from SHAPES
    draft_kv_bytes: float = 0.0
    bandwidth_tbs: float = 0.0  # override the preset's bandwidth (TB/s); 0: preset
    peak_tflops: float = 0.0  # override the preset's peak (TFLOP/s); 0: preset
    kind: ClassVar[str] = "roofline"

    def __post_init__(self) -> None:
        if self.gpu not in GPUS:
            raise ValueError(f"unknown gpu {self.gpu!r}; expected one of {sorted(GPUS)}")
        if min(self.target_b, self.draft_b, self.bytes_per_param, self.compute_eff, self.memory_eff) <= 0:
            raise ValueError(f"sizes and efficiencies must be positive: {self}")
        if min(self.target_overhead_ms, self.draft_overhead_ms, self.target_kv_bytes, self.draft_kv_bytes,
               self.bandwidth_tbs, self.peak_tflops) < 0:
            raise ValueError(f"overheads, KV sizes and overrides must be >= 0: {self}")

    @property
    def bandwidth(self) -> float:
        return self.bandwidth_tbs * 1e12 or GPUS[self.gpu].bandwidth

    @property
    def peak(self) -> float:
        return self.peak_tflops * 1e12 or GPUS[self.gpu].peak_flops

    def kv_bytes(self, params_b: float, override: float) -> float:
        return override or shape_for(params_b).kv_bytes_per_token(self.bytes_per_param)

    @cached_property
    def _terms(self) -> dict[str, tuple[float, float, float, float, float, float]]:
        """Per pass ('target', 'draft'): the formula's constant factors, computed once (the dataclass
        is frozen). The pass evaluates them in the docstring's order, so every time is the same float."""
        out = {}
        for kind, params_b, kv_override, overhead_ms in (
                ("target", self.target_b, self.target_kv_bytes, self.target_overhead_ms),
                ("draft", self.draft_b, self.draft_kv_bytes, self.draft_overhead_ms)):
            params = params_b * 1e9
            out[kind] = (2.0 * params, self.compute_eff * self.peak, params * self.bytes_per_param,
                         self.kv_bytes(params_b, kv_override), self.memory_eff * self.bandwidth,
                         overhead_ms * 1e-3)
        return out

    def _pass(self, kind: str, tokens: np.ndarray, context_tokens: float) -> np.ndarray:
        flops, peak, weights, kv, bandwidth, overhead = self._terms[kind]
        compute = flops * tokens / peak
        memory = (weights + kv * context_tokens) / bandwidth
        return np.maximum(compute, memory) + overhead

    def target_time(self, n_tokens: np.ndarray | int, context_tokens: int = 0,
                    batch_size: int = 0) -> np.ndarray | float:
        n = np.asarray(n_tokens, dtype=np.float64)
        return _like(self._pass("target", n, context_tokens), n_tokens)

    @cached_property
    def _compute_rows(self) -> dict[int, np.ndarray]:
        return {}  # size -> the compute term for N = 0..size-1 (it does not depend on the context)

    def target_by_n(self, size: int, context_tokens: int = 0, batch_size: int = 0) -> np.ndarray:
        flops, peak, weights, kv, bandwidth, overhead = self._terms["target"]
        compute = self._compute_rows.get(size)
        if compute is None:
            if len(self._compute_rows) >= 64:
                self._compute_rows.clear()
            compute = self._compute_rows[size] = flops * np.arange(size, dtype=np.float64) / peak
        out = np.maximum(compute, (weights + kv * context_tokens) / bandwidth)
        out += overhead
        return out

    def draft_time(self, batch_size: int, context_tokens: int = 0) -> float:
        flops, peak, weights, kv, bandwidth, overhead = self._terms["draft"]
        return max(flops * float(batch_size) / peak, (weights + kv * context_tokens) / bandwidth) + overhead

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}


# ---- profiled --------------------------------------------------------------------------------
def _cells(x: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bracketing grid indices (i0, i1) and weight w of i1 for each x, linear extrapolation on
    the right (w > 1), clamped on the left (w = 0)."""
    if len(grid) == 1:
        z = np.zeros(np.shape(x), dtype=np.int64)
        return z, z, np.zeros(np.shape(x))
    i0 = np.minimum(np.maximum(np.searchsorted(grid, x, side="right") - 1, 0), len(grid) - 2)
    w = (np.asarray(x, np.float64) - grid[i0]) / (grid[i0 + 1] - grid[i0])
    return i0, i0 + 1, np.maximum(w, 0.0)


_FAR = 1e12  # a grid point far right of any step: np.interp then extrapolates the last segment


def _row(table: np.ndarray, ctx_grid: np.ndarray, x_ext: np.ndarray, ctx: float) -> np.ndarray:
    """(Nx + 1,) the (Nc, Nx) table at context `ctx`, and at x = _FAR (x_ext: the x grid, then
    _FAR). The numpy statement of `row_kernel`, which `_Interp` runs."""
    i0, i1, w = _cells(np.float64(ctx), ctx_grid)
    r = table[int(i0)] + float(w) * (table[int(i1)] - table[int(i0)])  # (Nx,)
    if len(r) > 1:
        far = r[-1] + (r[-1] - r[-2]) / (x_ext[-2] - x_ext[-3]) * (_FAR - x_ext[-2])
    else:
        r, far = np.repeat(r, 1), r[-1]
    return np.append(r, far)


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
            # = _row(self.table, self.ctx_grid, self.x_ext, ctx), compiled
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


def _update_weights(x: float, grid: np.ndarray) -> list[tuple[int, float]]:
    """Which cells an observation at x corrects, and by what share. Beyond the right edge both
    edge cells move together, so the extrapolated line scales instead of tilting."""
    if len(grid) == 1 or x <= grid[0]:
        return [(0, 1.0)]
    if x >= grid[-1]:
        return [(len(grid) - 2, 1.0), (len(grid) - 1, 1.0)]
    i0 = bisect.bisect_right(grid, x) - 1  # as `_cells` for one x inside the grid, in plain Python
    w = (float(x) - float(grid[i0])) / (float(grid[i0 + 1]) - float(grid[i0]))
    return [(i0, 1.0 - w), (i0 + 1, w)]


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


def _monotone_fast(table: np.ndarray) -> np.ndarray:
    """(Nc, Nx) table made non-decreasing along x, then along context, in a few numpy calls: each
    line becomes the midpoint of its running max from the left and running min from the right.
    That is the line itself where it is already monotone, and, like `_monotone`, it is order-
    preserving and scale-equivariant (so a cell moved by at most (1 + s) moves the result by at
    most that factor, and the second pass keeps the first's order). The numpy statement of
    `cost_kernels.monotone_kernel`, which the online refresh runs: corrections leave at most small
    dents in the (PAV-fitted) profiled table."""
    out = table
    for axis in (1, 0):
        up = np.maximum.accumulate(out, axis=axis)
        rev = out[:, ::-1] if axis == 1 else out[::-1]  # np.flip without its per-call overhead
        down = np.minimum.accumulate(rev, axis=axis)
        out = 0.5 * (up + (down[:, ::-1] if axis == 1 else down[::-1]))
    return out


class ProfiledCost(CostModel):
    """Measured step times, interpolated (piecewise linear, extrapolated linearly on the right).

    Tables are (context grid x token grid) for the target and (context grid x batch grid) for one
    draft pass. The target's table times N step tokens in one shape, N / 4 sequences of 4; a
    decode step is B sequences of 1 to K + 1 tokens. Given the step's batch size B (`at_batch`,
    which the controller hands policies each step), a model profiled with a decode table (the
    target at B sequences of one token, `decode_s`) prices every N of that step as the table plus
    the decode shape's offset at N = B: the step without drafts is then what was measured in its
    own shape. On the bundled pair (2-core CPU, ~128 context tokens a sequence) 64 x 1 tokens took
    15.5 ms where the table's 16 x 4 read 18.4, and 64 x 2 took 21.5 against the table's 24.3 at
    N = 128: the table's ratio (1.32) made drafting look cheaper than it is (1.39; the offset gives
    1.38); in another session's profile its ratio was 1.51, dearer. A policy the table misled
    never took the other step, so the online corrections never saw it. At 64 x 4 the shapes meet
    (34.0 ms measured; the table plus the offset, 34.4). Online refinement has two parts. A shared *speed* log-correction scales every
    prediction, target and draft alike: a busy spell of a shared machine slows both models, and
    moving them together keeps the table's shape (the draft/target ratio, the step-time knee),
    which is what depth decisions rest on. A log-correction per grid cell learns the shape's
    own errors. An observed/predicted ratio r moves the cells around the observation by
    clip((1 - speed_share) * lr * log r) (shared by their interpolation weights, clipped to
    (1 - speed_share) * log(1 + max_step)): slowly, since a cell learns the table's lasting error.
    The speed moves by clip(speed_lr * log r, +-log(1 + speed_max_step)), fast: it tracks how busy
    the machine is now. Step logs of bench_live on a shared 2-core CPU (batch 1 to 64; `off`,
    `static` and `dspark`), replayed offline through the model: with the speed as slow as the
    cells (0.067 of log r a step, at most 2%, as it was) the whole step was predicted 7.8% off
    (median per run, mean over 12 interleaved runs; 4.7% underpriced on batch 64 `off`, whose
    contexts grew faster than it followed) and 7.9% on 12 solo runs recorded later; at 0.45 and
    9%, 6.4% and 6.1% (0.3 to 1.0 all did about as well). No single step moves a prediction by
    more than the two bounds together, a slow outlier's effect halves with each normal step after
    it, and consistent evidence converges geometrically. (`speed_share` is a name kept from when
    the speed took that share of the evidence: it is now the share the cells leave.) `frozen`
    turns refinement off (exact replays).

    A step also costs time outside the two passes: the engine's scheduling, sampling and
    bookkeeping, and the controller. It is learned online as `step_overhead_s + pass_overhead_s x
    draft passes` (a least-squares line through what the engine reports, from exponentially
    weighted moments: a running mean over the first 2 / lr steps, then 2 / lr steps' memory;
    the slope ridge-shrunk toward its last value, so a run whose passes hardly vary keeps it;
    both kept >= 0), one line per bucket of batch sizes (`_overhead_bucket`). `target_time`
    includes the first, since every step pays it whatever its depth: on this CPU at batch 1 it
    is 1-2 ms next to an 8 ms target pass, and leaving it out made a step of one token look
    cheaper than it is, against deeper steps. `draft_time` includes the second: each draft
    pass also samples, features and calls the policy (0.3-0.9 ms a pass here, batch 4 to 64),
    and leaving it out made drafting look cheaper than it is at batch 64, where it did not pay.
    Each outlier (a first step's one-off allocations and first calls, a pause) counts as at most
    twice the prediction plus 1 ms. The draft pass as the engine runs it also has its own fast
    log-ratio to the table (`_learn_draft_ratio`).
    """

    kind: ClassVar[str] = "profiled"

    def __init__(self, token_grid: Any, ctx_grid: Any, target_s: Any, draft_batch_grid: Any,
                 draft_s: Any, *, lr: float = 0.1, max_step: float = 0.03, frozen: bool = False,
                 target_logcorr: Any = None, draft_logcorr: Any = None, speed_logcorr: float = 0.0,
                 speed_share: float = 0.67, speed_lr: float = 0.45, speed_max_step: float = 0.09,
                 step_overhead_s: float = 0.0, pass_overhead_s: float = 0.0,
                 overhead_moments: Any = None, draft_ratio_logcorr: float = 0.0, draft_steps: float = 0.0,
                 decode_s: Any = None, overhead_bucket: int = 0, overhead_lines: Any = None,
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
        if not (0 < max_step < 1 and 0 < lr <= 1 and 0 <= speed_share <= 1 and 0 <= speed_lr <= 1
                and 0 <= speed_max_step < 1):
            raise ValueError(f"need 0 < max_step < 1, 0 < lr <= 1, 0 <= speed_share <= 1, 0 <= speed_lr <= 1, "
                             f"0 <= speed_max_step < 1, got {max_step}, {lr}, {speed_share}, {speed_lr}, "
                             f"{speed_max_step}")
        self.speed_logcorr, self.speed_share = float(speed_logcorr), float(speed_share)
        self.speed_lr, self.speed_max_step = float(speed_lr), float(speed_max_step)
        # the draft pass as the engine runs it vs the profiled forward (see `_learn_draft_ratio`)
        self.draft_ratio_logcorr, self.draft_steps = float(draft_ratio_logcorr), float(draft_steps)
        for name, v in (("step_overhead_s", step_overhead_s), ("pass_overhead_s", pass_overhead_s)):
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {v}")
        self.step_overhead_s, self.pass_overhead_s = float(step_overhead_s), float(pass_overhead_s)
        # weighted moments of (draft passes p, overhead y): n, E[p], E[y], E[p^2], E[p y]
        self._moments = np.array([0.0 if step_overhead_s == 0 else 2 / lr, 0.0, step_overhead_s, 0.0, 0.0]) \
            if overhead_moments is None \
            else np.asarray(overhead_moments, np.float64).reshape(5)
        # the line above is the overhead bucket `_bucket`'s; the other buckets' (moments, step,
        # pass) wait here (see `_overhead_bucket`)
        self._bucket = int(overhead_bucket)
        self._lines: dict[int, tuple[np.ndarray, float, float]] = {
            int(k): (np.asarray(v[:5], np.float64), float(v[5]), float(v[6])) for k, v in (overhead_lines or {}).items()}
        self.base_target, self.base_draft = _monotone(self.base_target), _monotone(self.base_draft)
        # (Nc, Nb) the target's pass at B sequences of one token each (the decode shape), or None
        self.base_decode = None if decode_s is None else \
            _monotone(np.asarray(decode_s, np.float64).reshape(len(self.ctx_grid), -1))
        if self.base_decode is not None:
            if self.base_decode.shape[1] != len(self.batch_grid) or not np.all(self.base_decode > 0):
                raise ValueError("decode_s must be positive, one row per context over the draft batch grid")
            # the decode shape's offset to the table at N = B tokens: fixed (profiled, uncorrected)
            self._offset_f = _Interp(self.base_decode - _Interp(self.base_target, self.ctx_grid, self.token_grid)
                                     .grid_at(self.batch_grid), self.ctx_grid, self.batch_grid)
        self.lr, self.max_step, self.frozen = float(lr), float(max_step), bool(frozen)
        self.target_logcorr = np.zeros_like(self.base_target) if target_logcorr is None \
            else np.asarray(target_logcorr, np.float64).reshape(self.base_target.shape)
        self.draft_logcorr = np.zeros_like(self.base_draft) if draft_logcorr is None \
            else np.asarray(draft_logcorr, np.float64).reshape(self.base_draft.shape)
        self.meta = dict(meta or {})
        self._target_f: _Interp | None = None  # the tables' interpolators, made at the first refresh
        self._draft_f: _Interp | None = None
        self._refresh()

    def _refresh(self) -> None:
        """Rebuild the corrected monotone tables (lazily: at the first query after a correction)."""
        # = _monotone_fast(base * np.exp(logcorr)) of each, in one compiled call (after a forward each
        # call into the model costs 10-30 us on this CPU, caches cold)
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
        t = self._target_f(context_tokens, n_tokens)
        if batch_size > 0 and self.base_decode is not None:  # priced in the step's shape (class doc)
            t = np.maximum(t + float(self._offset_f(context_tokens, min(batch_size, self.batch_grid[-1]))), 0.5 * t)
        return _like(t * math.exp(self.speed_logcorr) + self.step_overhead_s, n_tokens)

    def target_by_n(self, size: int, context_tokens: int = 0, batch_size: int = 0) -> np.ndarray:
        # = target_time(np.arange(size), context_tokens, batch_size), bit for bit, in one compiled
        # call instead of ~8 numpy calls (dspark prices a step's whole table each step)
        if self._dirty:
            self._refresh()
        shift = batch_size > 0 and self.base_decode is not None
        o = self._offset_f if shift else self._target_f  # the offset's row (unread without the shift)
        return by_n_kernel(int(size), self._target_f.x_ext, self._target_f.row(float(context_tokens)), shift,
                           float(min(batch_size, self.batch_grid[-1])), o.x_ext, o.row(float(context_tokens)),
                           math.exp(self.speed_logcorr), self.step_overhead_s)

    def step_prices(self, size: int, context_tokens: int, draft_batch: int,
                    batch_size: int = 0) -> tuple[np.ndarray, float]:
        # = (target_by_n(...), draft_time(draft_batch, ...)), bit for bit, in one compiled call: after
        # a forward each call into the model costs 10-30 us on this CPU, caches cold
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

    @property
    def learns(self) -> bool:
        return not self.frozen

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

    def _learn_draft_ratio(self, observed: float, predicted: float) -> bool:
        """The engine's draft pass is not the profiled forward: the first pass of a step catches up
        on the tokens committed since the sequence last drafted (two per row or more), and every
        pass computes features and moves tokens. On the bundled pair at batch 64 a pass took
        13 ms against a profiled 4.4 ms, so drafting looked half its price. The per-cell
        correction, bounded for robustness, needs ~70 drafting steps to fix that, and a policy
        that drafts now and then never gives it as many: this log-ratio is a running mean of
        log(observed / predicted) over the drafting steps, applied to every draft pass. Each
        observation counts as at most twice the prediction (or half): an engine's first drafting
        step pays one-off first calls, and taken at face value (clipped at 4x, as it was) it set
        the ratio to 3.6x on `specdepth generate`'s first step (2.77 ms against 0.76 priced), after
        which the plan drafted nothing; one request's 64 tokens in 2 of 8 runs came out at
        acceptance length 1.00. A true 3x is reached within a few drafting steps, and a clipped
        observation is not evidence for the draft's cells or the shared speed (`observe`). Its
        memory is 2 / lr *steps*, drafting or not: `draft_steps` is the weight of the drafting
        steps seen, decayed by 1 - lr / 2 at every step (`observe`), and a
        new one weighs 1 / (1 + draft_steps): 1 / n over the first n steps when all draft, lr / 2
        once many have. Counted in drafting steps alone, a policy that stopped drafting
        because the ratio priced the pass too dear kept that ratio: the odd pass it then drafts
        to check (dspark's `_trying`) moved it by lr / 2 of its error. On the bundled pair at
        batch 1, a ratio set 3x too high kept dspark from drafting for a whole 384-step round
        (0.84x static k = 1); now a drafting step after 16 steps without one weighs ~0.1, after
        64 ~0.6, and dspark drafted again within ~100 steps (0.95x static k = 1 over the round).
        Returns whether the observation was taken whole (False: not finite, or clipped)."""
        if not (math.isfinite(observed) and observed > 0 and predicted > 0):
            return False
        w = 1.0 / (1.0 + self.draft_steps)
        self.draft_steps += 1
        bound, r = math.log(2.0), math.log(observed / predicted)
        self.draft_ratio_logcorr += w * min(max(r, -bound), bound)
        return abs(r) <= bound

    def _overhead_bucket(self, batch_size: int) -> None:
        """Switch the overhead line to `batch_size`'s bucket (batch sizes of one power of two).

        The time outside the passes grows with the batch (per-sequence bookkeeping: 0.4 ms a step
        at batch 1, 1.9 ms at 64 without drafts on the bundled pair), so one line through steps of
        every batch size fits the batch's changes instead of the passes' (after a warm-up of
        8-pass steps at batch 32, steps of 0 and 1 pass at batch 64 fitted a slope near 0 against a
        measured 1.2 ms). A bucket first seen starts from the line in use, its intercept refitted
        from its first step, its slope kept until its own steps' passes vary."""
        bucket = int(batch_size).bit_length()
        if bucket == self._bucket:
            return
        self._lines[self._bucket] = (self._moments, self.step_overhead_s, self.pass_overhead_s)
        self._moments, self.step_overhead_s, self.pass_overhead_s = self._lines.pop(
            bucket, (np.zeros(5), self.step_overhead_s, self.pass_overhead_s))
        self._bucket = bucket

    def _learn_overhead(self, seconds: float, passes: int) -> None:
        """One step's time outside its passes: move the moments, refit the line (see class doc)."""
        m = self._moments
        m[0] += 1
        # an outlier counts as at most twice the prediction plus 1 ms, from the very first step: an
        # engine's first step pays one-off allocations and first calls (0.53 s at batch 64 here),
        # and taken at face value it set a 0.5 s overhead on every step that took ~60 steps to
        # decay, next to which deep drafts looked free (dspark drafted 3-8 deep at batch 64 and
        # ran at 0.69-0.8x off). A true overhead above the cap is reached by doubling in a few steps.
        y = min(max(seconds, 0.0), 2.0 * (self.step_overhead_s + self.pass_overhead_s * passes) + 1e-3)
        w = max(self.lr / 2, 1.0 / m[0])
        m[1:] += w * (np.array([passes, y, passes * passes, passes * y]) - m[1:])
        var, cov = m[3] - m[1] ** 2, m[4] - m[1] * m[2]
        # ridge toward the current slope: little spread in the passes (a run that stopped drafting)
        # keeps what was learned instead of fitting noise
        self.pass_overhead_s = max((cov + 0.05 * self.pass_overhead_s) / (max(var, 0.0) + 0.05), 0.0)
        self.step_overhead_s = max(m[2] - self.pass_overhead_s * m[1], 0.0)

    def _correct(self, logcorr: np.ndarray, cols: np.ndarray, x: float, ctx: float, observed: float,
                 predicted: float) -> float | None:
        """Move the cells around (x, ctx); return the log ratio for the speed (None: no evidence)."""
        if not (math.isfinite(observed) and observed > 0 and predicted > 0):
            return None
        bound = math.log1p(self.max_step) * (1.0 - self.speed_share)
        r = math.log(observed / predicted)
        step = min(max((1.0 - self.speed_share) * self.lr * r, -bound), bound)
        for ci, wc in _update_weights(ctx, self.ctx_grid):
            for xi, wx in _update_weights(x, cols):
                logcorr[ci, xi] += wc * wx * step
        return r

    def observe(self, n_tokens: int, context_tokens: int, target_s: float, draft_batch: int,
                draft_passes: int, draft_s: float, overhead_s: float | None = None,
                overhead_passes: int = 0, batch_size: int = 0) -> None:
        """Bounded multiplicative correction of the cells around this step (see class doc).
        The draft's time is attributed per pass at `draft_batch` (its first, largest pass).
        `overhead_s` (of a step with `overhead_passes` draft passes) refits the overhead line.
        The target pass is predicted at the step's `batch_size` (0: not known)."""
        if self.frozen:
            return
        self.draft_steps *= 1.0 - self.lr / 2  # every step ages the draft ratio's evidence (`_learn_draft_ratio`)
        if overhead_s is not None and math.isfinite(overhead_s):
            if batch_size > 0:
                self._overhead_bucket(batch_size)
            self._learn_overhead(overhead_s, overhead_passes)
        ratios = []
        if n_tokens > 0:
            ratios.append(self._correct(self.target_logcorr, self.token_grid, n_tokens, context_tokens, target_s,
                                        self.target_time(n_tokens, context_tokens, batch_size) - self.step_overhead_s))
        if draft_passes > 0 and draft_batch > 0:
            per_pass = draft_s / draft_passes
            # the cells then learn what the ratio left: the prediction is taken again after it moved;
            # an observation the ratio had to clip is an outlier (or a ratio still on its way), not evidence
            if self._learn_draft_ratio(per_pass, self._pass_time(draft_batch, context_tokens)):
                ratios.append(self._correct(self.draft_logcorr, self.batch_grid, draft_batch, context_tokens,
                                            per_pass, self._pass_time(draft_batch, context_tokens)))
        ratios = [r for r in ratios if r is not None]
        if ratios:  # the shared speed: both models' evidence, averaged
            bound = math.log1p(self.speed_max_step)
            self.speed_logcorr += min(max(self.speed_lr * sum(ratios) / len(ratios), -bound), bound)
        self._dirty = True

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "token_grid": self.token_grid.tolist(), "ctx_grid": self.ctx_grid.tolist(),
                "target_s": self.base_target.tolist(), "draft_batch_grid": self.batch_grid.tolist(),
                "draft_s": self.base_draft.tolist(), "lr": self.lr, "max_step": self.max_step,
                "frozen": self.frozen, "target_logcorr": self.target_logcorr.tolist(),
                "draft_logcorr": self.draft_logcorr.tolist(), "speed_logcorr": self.speed_logcorr,
                "speed_share": self.speed_share, "speed_lr": self.speed_lr, "speed_max_step": self.speed_max_step,
                "step_overhead_s": self.step_overhead_s,
                "pass_overhead_s": self.pass_overhead_s, "overhead_moments": self._moments.tolist(),
                "overhead_bucket": self._bucket,
                "overhead_lines": {str(k): [*m.tolist(), a, b] for k, (m, a, b) in self._lines.items()},
                "draft_ratio_logcorr": self.draft_ratio_logcorr, "draft_steps": self.draft_steps,
                **({} if self.base_decode is None else {"decode_s": self.base_decode.tolist()}), "meta": self.meta}

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


COST_KINDS: dict[str, type[CostModel]] = {k.kind: k for k in (FixedCost, RooflineCost, ProfiledCost)}


# ---- specs -----------------------------------------------------------------------------------
def _spec_kwargs(cls: type, body: str, spec: str, fixed: dict[str, Any]) -> dict[str, Any]:
    """'a=1,b=2' -> typed keyword arguments for dataclass `cls`."""
    types = {f.name: f.type for f in fields(cls)}
    out = dict(fixed)
    for item in filter(None, (s.strip() for s in body.split(","))):
        key, eq, val = item.partition("=")
        key = key.strip()
        if not eq or key not in types or key in fixed:
            valid = sorted(k for k in types if k not in fixed)
            raise ValueError(f"bad cost spec {spec!r}: {item!r} is not key=value with key in {valid}")
        try:
            out[key] = val.strip() if types[key] in ("str", str) else float(val)
        except ValueError:
            raise ValueError(f"bad cost spec {spec!r}: {key}={val!r} is not a number") from None
    return out


def load_cost(path: str | Path) -> CostModel:
    """Read a cost model JSON (as written by `to_json`). Raises ValueError naming the file."""
    try:
        return CostModel.from_json(Path(path).read_text())
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise ValueError(f"cannot read cost model {str(path)!r}: {e}") from None


def parse_cost(spec: str) -> CostModel:
    """A cost model from a CLI spec.

    Specs: `h200` | `h100` | `a100` [`:key=value,...`] (RooflineCost fields, e.g.
    `h200:target_b=70,draft_b=1`), `roofline:gpu=h100,...`, `fixed:target_ms=10,draft_ms=0.5`, or
    the path of a JSON written by `CostModel.to_json` / `specdepth profile`.

    Raises:
        ValueError: naming the spec, when it is none of these or a value is bad.
    """
    s = spec.strip()
    name, _, body = s.partition(":")
    kinds: dict[str, tuple[type, dict[str, Any]]] = {
        "fixed": (FixedCost, {}), "roofline": (RooflineCost, {}),
        **{g: (RooflineCost, {"gpu": g}) for g in GPUS}}
    if name not in kinds and (s.endswith(".json") or Path(s).is_file()):
        return load_cost(s)
    if name not in kinds:
        raise ValueError(f"bad cost spec {spec!r}: expected one of {sorted(kinds)} (optionally "
                         f"':key=value,...') or the path of a profile JSON")
    cls, fixed = kinds[name]
    kwargs = _spec_kwargs(cls, body, spec, fixed)
    try:
        return cls(**kwargs)
    except ValueError as e:  # __post_init__ validation
        raise ValueError(f"bad cost spec {spec!r}: {e}") from None


def profile(*args: Any, **kwargs: Any) -> ProfiledCost:
    """Time real forwards; see `adaptive.profiler.profile` (imported lazily: it needs torch)."""
    from specdepth.adaptive.profiler import profile as _profile
    return _profile(*args, **kwargs)
