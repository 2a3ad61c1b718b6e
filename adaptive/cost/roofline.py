"""Roofline step times for replay at scale: max(compute, memory) + overhead per pass, from a GPU
preset and a target/draft size pair (DESIGN.md "Cost model")."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from specdepth.adaptive.cost.base import CostModel, _like


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
