"""Save and load specdepth models as safetensors (the config travels in the file's metadata).

Never pickle: weights are read with `safetensors`, which cannot execute code.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specdepth.workers.model import ModelConfig, Transformer


def save_model(model: Transformer, path: str | Path, dtype: torch.dtype = torch.bfloat16,
               extra: dict[str, str] | None = None) -> None:
    """Write weights (tied lm_head stored once) and the config to `path`."""
    sd = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()
          if not (model.cfg.tie_embeddings and k == "lm_head.weight")}
    meta = {"config": json.dumps(model.cfg.to_dict()), "format": "specdepth-v1", **(extra or {})}
    save_file(sd, str(path), metadata=meta)


def read_metadata(path: str | Path) -> dict[str, str]:
    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})


def load_model(path: str | Path, device: str | torch.device = "cpu",
               dtype: torch.dtype | None = None) -> Transformer:
    """Load a model saved by `save_model`. dtype defaults to fp32 on CPU, bf16 on CUDA.

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: the file is not a specdepth model or lacks tensors.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no model weights at {path}")
    meta = read_metadata(path)
    if "config" not in meta:
        raise ValueError(f"{path} has no specdepth config in its metadata")
    cfg = ModelConfig(**json.loads(meta["config"]))
    device = torch.device(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    model = Transformer(cfg)
    tensors = {}
    with safe_open(str(path), framework="pt") as f:
        for k in f.keys():
            tensors[k] = f.get_tensor(k)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    missing = [m for m in missing if not (cfg.tie_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"{path}: missing tensors {missing}, unexpected tensors {unexpected}")
    return model.to(device=device, dtype=dtype).eval()
