"""The bundled draft/target pair: trained here on the standard library, shipped as package data.

`load_pair()` loads it (or a user's pair: our safetensors files or Hugging Face folders) with no
network and no training step. See `workers/bundled_pair/MODEL_CARD.md`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from specdepth.workers.model import Transformer
from specdepth.workers.tokenizer import Tokenizer
from specdepth.workers.weights import load_model

BUNDLED_DIR = Path(__file__).parent / "bundled_pair"


@dataclass
class Pair:
    target: Transformer
    draft: Transformer
    tokenizer: Tokenizer
    name: str  # identity for trace headers, e.g. "bundled" or the two paths

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return self.tokenizer.eos_ids


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _load_one(path: Path, device: str) -> Transformer:
    if path.is_dir():
        from specdepth.workers.hf_loader import load_hf_model
        return load_hf_model(path, device=device)
    return load_model(path, device=device)


def load_pair(target: str | Path | None = None, draft: str | Path | None = None,
              device: str | None = None) -> Pair:
    """Load a draft/target pair (bundled when neither path is given).

    Args:
        target, draft: a specdepth .safetensors file or a Hugging Face model folder; both or neither.
        device: "cpu", "cuda", ... (default: CUDA when available).
    Raises:
        FileNotFoundError: a path that does not exist (never a download).
        ValueError: only one of target/draft given, or their vocabularies differ.
    """
    device = device or default_device()
    if (target is None) != (draft is None):
        raise ValueError("give both --target and --draft, or neither (the bundled pair)")
    if target is None:
        return Pair(load_model(BUNDLED_DIR / "target.safetensors", device),
                    load_model(BUNDLED_DIR / "draft.safetensors", device),
                    Tokenizer(BUNDLED_DIR / "tokenizer.json"), "bundled")
    tpath, dpath = Path(target), Path(draft)
    for p in (tpath, dpath):
        if not p.exists():
            raise FileNotFoundError(f"no model at {p} (specdepth never downloads; give a local path)")
    if tpath.is_dir() and dpath.is_dir():
        from specdepth.workers.hf_loader import check_same_tokenizer
        check_same_tokenizer(dpath, tpath)  # before the weights: a wrong pair fails at once
    t, d = _load_one(tpath, device), _load_one(dpath, device)
    if tpath.is_dir():
        from specdepth.workers.hf_loader import load_hf_tokenizer, shared_rows
        tok = load_hf_tokenizer(tpath)
        if dpath.is_dir():
            shared_rows(tok, t.cfg.vocab_size, d.cfg.vocab_size)  # padded rows may differ; real ids may not
    else:
        tok = Tokenizer(tpath.parent / "tokenizer.json")
    if t.cfg.vocab_size != d.cfg.vocab_size and not (tpath.is_dir() and dpath.is_dir()):
        raise ValueError(f"draft vocabulary ({d.cfg.vocab_size} tokens, {dpath}) differs from the target's "
                         f"({t.cfg.vocab_size} tokens, {tpath}): they must share one")
    return Pair(t, d, tok, f"{tpath}|{dpath}")


def load_tokenizer(target: str | Path | None = None) -> Tokenizer:
    """A pair's tokenizer without its models (they may load elsewhere, e.g. in Ray replicas):
    the bundled one, an HF folder's (with its EOS ids), or the tokenizer.json beside a
    specdepth .safetensors target."""
    if target is None:
        return Tokenizer(BUNDLED_DIR / "tokenizer.json")
    if Path(target).is_dir():
        from specdepth.workers.hf_loader import load_hf_tokenizer
        return load_hf_tokenizer(Path(target))
    return Tokenizer(Path(target).parent / "tokenizer.json")


def heldout_prompts(n: int | None = None) -> list[str]:
    """The held-out prompt set (function/class headers plus first lines from held-out modules)."""
    lines = (BUNDLED_DIR / "prompts.jsonl").read_text().splitlines()
    prompts = [json.loads(line)["prompt"] for line in lines if line.strip()]
    return prompts[:n] if n else prompts
