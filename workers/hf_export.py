"""Writing a model as a Hugging Face checkpoint folder: the inverse of `workers/hf_loader.py`.

The folder holds what transformers and vLLM load: `config.json` (the family the model's shape
is: Llama; Qwen2 with q/k/v biases; Qwen3 with q/k norms), `model.safetensors` with HF tensor
names (`hf_loader.hf_name`, the loader's own table; a tied LM head is stored once, as HF does),
and, given the tokenizer, `tokenizer.json`, `tokenizer_config.json` and `generation_config.json`
with the EOS ids. `load_hf_model` reads it back to the same weights.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors.torch import save_file

from specdepth.workers.hf_loader import FAMILIES, hf_name
from specdepth.workers.model import ModelConfig, Transformer
from specdepth.workers.tokenizer import Tokenizer


def family_of(cfg: ModelConfig) -> str:
    """The HF model_type whose forward is this config's (the loader's FAMILIES, inverted)."""
    for name, fam in FAMILIES.items():
        if (fam.qkv_bias, fam.qk_norm) == (cfg.qkv_bias, cfg.qk_norm):
            return name
    raise ValueError(f"no HF family has qkv_bias={cfg.qkv_bias} and qk_norm={cfg.qk_norm}")


def hf_config(cfg: ModelConfig, eos_ids: tuple[int, ...] = ()) -> dict[str, Any]:
    """config.json for a model of this shape (`hf_loader.config_from_hf` maps it back)."""
    model_type = family_of(cfg)
    out: dict[str, Any] = {
        "architectures": [FAMILIES[model_type].architecture], "model_type": model_type,
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.dim, "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim or cfg.dim // cfg.n_heads,
        "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "tie_word_embeddings": cfg.tie_embeddings, "torch_dtype": "float32",
    }
    if cfg.rope_scaling:
        out["rope_scaling"] = dict(cfg.rope_scaling)
    if eos_ids:
        out["eos_token_id"] = list(eos_ids) if len(eos_ids) > 1 else eos_ids[0]
    return out


def export_hf(model: Transformer, out: str | Path, tokenizer: Optional[Tokenizer] = None) -> Path:
    """Write `model` (and `tokenizer`) as an HF checkpoint folder at `out` (created; files in it
    are overwritten). Returns the folder.

    Raises:
        ValueError: `out` exists and is not a folder, or the model's shape has no HF family.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} exists and is not a folder")
    cfg = model.cfg
    eos = tuple(tokenizer.eos_ids) if tokenizer is not None else ()
    config = hf_config(cfg, eos)
    tensors = {}
    for name, t in model.state_dict().items():
        if name.startswith("rope_") or (cfg.tie_embeddings and name == "lm_head.weight"):
            continue  # RoPE tables are rebuilt from the config; a tied head is the embedding
        tensors[hf_name(name)] = t.detach().to("cpu", torch.float32).contiguous().clone()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if tokenizer is not None:
        shutil.copyfile(tokenizer.path, out / "tokenizer.json")
        eos_token = tokenizer._tok.id_to_token(eos[0]) if eos else None
        (out / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos_token,
             "model_max_length": cfg.max_seq_len, "clean_up_tokenization_spaces": False}, indent=2) + "\n")
        (out / "generation_config.json").write_text(json.dumps(
            {"eos_token_id": config.get("eos_token_id"), "do_sample": False}, indent=2) + "\n")
    return out
