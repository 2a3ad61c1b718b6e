"""Tiny random Hugging Face checkpoints (Llama, Llama-3 RoPE, Qwen2, Qwen3) for tests.

Built from a config with random weights and saved with `save_pretrained`: no download, well under
a second each. transformers is a test-only dependency and is imported only here and in tests.
HF's own init (std 0.02, unit norms, zero biases) makes nearly constant logits and leaves norm and
bias mappings untested, so `randomize_` redraws every parameter at a scale where attention and
logits are O(1) and every q/k norm, bias and norm weight differs from its neighbours.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (LlamaConfig, LlamaForCausalLM, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

VOCAB = 96
EOS_ID = 1  # every fixture model's eos_token_id (also written to generation_config.json)
PAD_ID = 0
# Llama-3 scaling with a short "pretraining" length so that, at head_dim 8 and theta 1e4, the four
# frequencies fall in all three regions (kept, interpolated, divided by factor).
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}

_BASE = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=48, max_position_embeddings=256,
             rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
# family -> (config class, model class, what the variant sets beyond _BASE)
FAMILIES: dict[str, tuple[type, type, dict]] = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "llama3": (LlamaConfig, LlamaForCausalLM, {"rope_parameters": LLAMA3_ROPE}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {"tie_word_embeddings": True}),  # + q/k/v biases
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"head_dim": 16}),  # head_dim != hidden / heads; q/k norms
}


def randomize_(model: torch.nn.Module, seed: int, std: float = 0.2) -> None:
    """Redraw all parameters: norms ~ 1 + 0.3 N(0, 1), everything else (biases too) ~ std N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied weights appear once
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.3 * noise if name.endswith("norm.weight") else std * noise)


def make_hf_model(family: str, seed: int = 0, **overrides) -> PreTrainedModel:
    """A tiny random fp32 model of one of FAMILIES, in eval mode; overrides go to the config."""
    config_cls, model_cls, extra = FAMILIES[family]
    model = model_cls(config_cls(**{**_BASE, **extra, **overrides}))
    randomize_(model, seed)
    return model.eval()


def save_checkpoint(model: PreTrainedModel, path: Path, sharded: bool = False) -> Path:
    """save_pretrained into `path`; sharded=True splits it into several ~40 kB safetensors shards."""
    model.save_pretrained(path, max_shard_size="40kB" if sharded else "1GB")
    return path


@dataclass
class HFPair:
    """A draft/target pair saved as HF checkpoints that share a vocabulary (no tokenizer files)."""

    draft_path: Path
    target_path: Path
    draft: PreTrainedModel  # LlamaForCausalLM
    target: PreTrainedModel  # Qwen2ForCausalLM


def make_hf_pair(root: Path, seed: int = 0, noise: float = 0.15, sharpen: float = 4.0) -> HFPair:
    """A Qwen2 target (sharded checkpoint) and a Llama draft that agrees with it often, not always.

    A model with `randomize_`d layers is chaotic, so the target is tamed: embeddings x6 (the
    residual stream mostly carries the token through the pre-norm layers) and q/k/v biases x0.1
    (the Llama draft has none). The draft carries the target's weights, with relative noise
    `noise` on every layer matrix: greedy next tokens agree ~60% of the time on random input, so
    accepts, partial accepts and rollbacks all occur. The LM head is scaled by `sharpen` (peaked
    distributions, for sampling). Both use EOS_ID as eos and PAD_ID as pad.
    """
    target = make_hf_model("qwen2", seed, tie_word_embeddings=False)
    with torch.no_grad():
        target.lm_head.weight.mul_(sharpen)
        target.model.embed_tokens.weight.mul_(6.0)
        for name, p in target.named_parameters():
            if name.endswith("bias"):
                p.mul_(0.1)
    draft = make_hf_model("llama", seed + 1)
    g = torch.Generator().manual_seed(seed + 2)
    src = target.state_dict()
    with torch.no_grad():
        for name, p in draft.named_parameters():
            w = src[name]
            if w.dim() == 2 and ".layers." in name:
                w = w + torch.randn(w.shape, generator=g) * w.std() * noise
            p.copy_(w)
    pair = HFPair(root / "draft", root / "target", draft.eval(), target.eval())
    save_checkpoint(pair.draft, pair.draft_path)
    save_checkpoint(pair.target, pair.target_path, sharded=True)
    return pair

