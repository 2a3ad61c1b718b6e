"""Step-time models: how long a target pass over N step tokens, and a draft pass, take.

The allocation maximises Theta = tau * SPS(N) (DESIGN.md "Allocation"); this module is SPS, and
the one place to import cost models from. Three kinds behind one interface, `CostModel`
(`cost.base`, which implements `policies.base.StepCost`):

- `FixedCost` (here): every pass takes a constant time, for checks against Leviathan's formulas.
- `RooflineCost` (`cost.roofline`): step time = max(compute, memory) + overhead, from a GPU
  preset and a target/draft size pair, for replay at scale.
- `ProfiledCost` (`cost.profiled`): a measured table over (step tokens x context tokens),
  interpolated, refined online from reported step times with bounded updates (`cost.learning`).
  `cost.profiler.profile` builds one.

Times are seconds. `context_tokens` is the KV held by the whole batch (sum over sequences), which
is what a pass has to read. `parse_cost` turns a CLI spec into a model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from specdepth.adaptive.cost.base import COST_KINDS, FORMAT, CostModel, _like
from specdepth.adaptive.cost.free_draft import FreeDraftCost  # noqa: F401  (registers its kind)
from specdepth.adaptive.cost.profiled import ProfiledCost
from specdepth.adaptive.cost.roofline import GPUS, SHAPES, GPUSpec, ModelShape, RooflineCost, shape_for

__all__ = ["FORMAT", "COST_KINDS", "CostModel", "FixedCost", "RooflineCost", "ProfiledCost", "GPUS", "GPUSpec",
           "SHAPES", "ModelShape", "shape_for", "load_cost", "parse_cost", "profile"]


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
    """Time real forwards; see `cost.profiler.profile` (imported lazily: it needs torch)."""
    from specdepth.adaptive.cost.profiler import profile as _profile
    return _profile(*args, **kwargs)
