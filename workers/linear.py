"""A Linear layer whose few-token passes on CPU cost about what a one-token pass does.

Speculative decoding pays where a pass over a few more tokens costs little more than a pass over
one. On a GPU that is the memory-bound regime. On CPU, PyTorch's default fp32 GEMM (MKL) runs one
token as a matrix-vector product, but 2..64 tokens as a general GEMM that is slow at such small
sizes. On the bundled target (2-core AMD EPYC) a pass over 2 tokens cost 1.36x a pass over one,
and over 4 tokens 1.67x. oneDNN's matmul on weights packed once into its blocked layout barely
depends on the token count there: 1.05x at 2 tokens, 1.14x at 4. So inference on CPU may take
that path for 2..SMALL_M_MAX rows, where it is faster on this machine (timed once per weight
shape and row bucket, workers/linear_choice.py: on other CPUs the default wins), and keeps the
default for one row (a matrix-vector product, faster than oneDNN there), for larger batches
(where the two are about even), for weights too small to gain (all of the draft's but its LM
head) and for weights too large to copy.

The choice changes only rounding: both paths compute x @ W.T + b in fp32. Training (autograd on),
other devices and other dtypes use `F.linear`, and so does any build whose oneDNN ops are missing
or disagree with it on a probe (`available`).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from specdepth.workers import linear_choice

SMALL_M_MAX = 64  # most rows through oneDNN; past that the two paths are even
MIN_WEIGHT = 1 << 18  # fewest weight elements: oneDNN's fixed cost a call outweighs its gain on smaller ones
MAX_WEIGHT = 1 << 22  # most: the packed copy doubles a weight's memory, which a CPU user of a
# multi-GB model would rather keep

_available: bool | None = None  # probed once, on first use


def available() -> bool:
    """Whether this build's oneDNN packed linear exists and agrees with F.linear on a probe."""
    global _available
    if _available is None:
        try:
            g = torch.Generator().manual_seed(0)
            w, x = torch.randn(96, 64, generator=g), torch.randn(3, 64, generator=g)
            y = torch.ops.mkldnn._linear_pointwise(x, torch.ops.mkldnn._reorder_linear_weight(w, None),
                                                   None, "none", [], "")
            _available = bool(torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled) \
                and torch.allclose(y, F.linear(x, w), rtol=1e-4, atol=1e-4)
        except Exception:  # no mkldnn ops in this build, or no kernel for this CPU
            _available = False
    return _available


class Linear(nn.Linear):
    """nn.Linear (same parameters, same state dict) with the small-batch CPU path above."""

    _packed: torch.Tensor | None = None
    _packed_of: tuple[int, int] = (-1, -1)  # (data_ptr, version) of the weight that was packed
    _pays: dict[int, bool] | None = None  # rows -> packed, as decided for this weight's shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        m = x.numel() // x.shape[-1]  # rows
        if (2 <= m <= SMALL_M_MAX and MIN_WEIGHT <= w.numel() <= MAX_WEIGHT and not torch.is_grad_enabled()
                and w.device.type == "cpu" and w.dtype == torch.float32 == x.dtype and available()
                and self._packed_pays(m)):
            y = torch.ops.mkldnn._linear_pointwise(x.reshape(m, -1), self._packed_weight(), self.bias,
                                                   "none", [], "")  # (m, out)
            return y.view(*x.shape[:-1], -1)
        return F.linear(x, w, self.bias)

    def _packed_pays(self, m: int) -> bool:
        """This machine's answer for m rows through this weight (`linear_choice`), kept per layer."""
        if self._pays is None:
            self._pays = {}
        hit = self._pays.get(m)
        if hit is None:
            n_out, n_in = self.weight.shape
            hit = self._pays[m] = linear_choice.packed_pays(n_out, n_in, m)
        return hit

    def _apply(self, fn, recurse: bool = True):
        # .to(), .half(), ... may swap the weight's data in place, keeping its version, and a new
        # buffer may reuse the old address: drop the packed copy rather than trust the key
        self._packed, self._packed_of = None, (-1, -1)
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict:
        # the packed weight is an opaque oneDNN tensor, which neither copies nor pickles
        state = dict(super().__getstate__())
        state.pop("_packed", None)
        state.pop("_packed_of", None)
        state.pop("_pays", None)
        return state

    def _packed_weight(self) -> torch.Tensor:
        """The weight in oneDNN's layout, packed again whenever the weight changed (a load, a
        training step, a tied embedding's update)."""
        w = self.weight
        key = (w.data_ptr(), w._version)
        if self._packed is None or self._packed_of != key:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), None)
            self._packed_of = key
        return self._packed


def warm_up(*models: nn.Module, max_rows: int = SMALL_M_MAX) -> None:
    """Call each distinct CPU linear (weight shape, bias or not) once at every row count 1..max_rows.

    The first call at a new row count builds its kernel: here about 0.7 ms on the packed path
    against 0.06 ms a call after, and a target pass at a new token count took 10-20% longer the
    first time. Speculative steps vary their token counts, so a run would pay this mid-way."""
    seen = set()
    with torch.inference_mode():
        for model in models:
            for mod in model.modules():
                w = mod.weight if isinstance(mod, Linear) else None
                if w is None or w.device.type != "cpu":
                    continue
                key = (tuple(w.shape), w.dtype, mod.bias is None)
                if key in seen:
                    continue
                seen.add(key)
                x = torch.zeros(max_rows, mod.in_features, dtype=w.dtype)
                for m in range(1, max_rows + 1):
                    mod(x[:m])


def signature(*models: nn.Module) -> str:
    """The few-row path answers these models' linears run on (`linear_choice.signature`), or
    "default" where none can take the packed path: part of a cost profile's cache key."""
    shapes = {tuple(m.weight.shape) for model in models for m in model.modules()
              if isinstance(m, Linear) and MIN_WEIGHT <= m.weight.numel() <= MAX_WEIGHT
              and m.weight.device.type == "cpu" and m.weight.dtype == torch.float32}
    if not shapes or not available():
        return "default"
    return linear_choice.signature(shapes)
