"""Which draft/target pair to load: plain data that travels to a Ray replica, which loads it."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class PairSpec:
    """Which draft/target pair a replica loads.

    Neither paths nor factory: the bundled pair. `factory` ("module:function") is for pairs built
    in code, e.g. tests' random pairs: `PairSpec(factory="tests.pairs:tiny_pair", kwargs={"seed": 3})`;
    it returns (target, draft) or a `workers.bundled.Pair`.
    """

    target: Optional[str] = None  # .safetensors file or HF folder (with `draft`)
    draft: Optional[str] = None
    factory: Optional[str] = None  # "module:function" building the pair in the actor
    kwargs: dict = field(default_factory=dict)  # keyword arguments for `factory`
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: as loaded

    def __post_init__(self) -> None:
        if (self.target is None) != (self.draft is None):
            raise ValueError("give both target and draft paths, or neither")
        if self.factory is not None and self.target is not None:
            raise ValueError("give a factory or model paths, not both")
        if self.factory is not None and ":" not in self.factory:
            raise ValueError(f"factory must be 'module:function', got {self.factory!r}")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be auto or one of {sorted(DTYPES)}, got {self.dtype!r}")

    def load(self, device: str) -> tuple[Any, Any, tuple[int, ...], str]:
        """Returns (target, draft, eos ids, name) on `device`, eval mode."""
        if self.factory is None:
            from specdepth.workers.bundled import load_pair
            pair = load_pair(self.target, self.draft, device)
        else:
            module, _, attr = self.factory.partition(":")
            pair = getattr(importlib.import_module(module), attr)(**self.kwargs)
        if isinstance(pair, tuple):  # (target, draft) from a factory: no tokenizer, no EOS
            (target, draft), eos, name = pair, (), f"{self.factory}({self.kwargs})"
        else:
            target, draft, eos, name = pair.target, pair.draft, tuple(pair.eos_ids), pair.name
        dtype = DTYPES.get(self.dtype)
        target, draft = (m.to(device=device, dtype=dtype).eval() for m in (target, draft))
        return target, draft, eos, name


def resolve_device(device: str) -> str:
    """`auto`: cuda when available, else cpu."""
    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"
