"""Load Hugging Face Llama, Qwen2 and Qwen3 checkpoints into `workers.model.Transformer`.

A checkpoint is a local directory as `save_pretrained` writes it: `config.json` plus either
`model.safetensors` or shards listed in `model.safetensors.index.json`. Nothing is downloaded
(transformers is not even imported) and nothing is unpickled (`.bin` checkpoints are refused).
Anything the model cannot represent exactly — another architecture, a RoPE variant we do not
implement, biases on o_proj or the MLP, sliding-window attention — fails with a ValueError before a
tensor is read, so a loaded model always matches the transformers forward.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import torch
from safetensors import safe_open

from specdepth.workers.model import ModelConfig, Transformer, rope_tables
from specdepth.workers.tokenizer import EOT, Tokenizer


@dataclass(frozen=True)
class Family:
    """What distinguishes one supported `model_type` from the others."""

    architecture: str  # the `architectures` entry of its causal-LM class
    qkv_bias: bool  # q/k/v projections carry biases (Qwen2 always does; o_proj never)
    qk_norm: bool  # per-head RMSNorm on q and k before RoPE (Qwen3)


FAMILIES: dict[str, Family] = {
    "llama": Family("LlamaForCausalLM", qkv_bias=False, qk_norm=False),
    "qwen2": Family("Qwen2ForCausalLM", qkv_bias=True, qk_norm=False),
    "qwen3": Family("Qwen3ForCausalLM", qkv_bias=False, qk_norm=True),
}
ROPE_TYPES = ("default", "linear", "llama3")  # what `rope_tables` implements
DEFAULT_MAX_SEQ_LEN = 4096  # cap on max_position_embeddings: sizes the RoPE tables, not the KV cache

# Our parameter names -> HF names; per-layer names are relative to "layers.{i}." / "model.layers.{i}.".
_TOP_NAMES = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
              "lm_head.weight": "lm_head.weight"}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.wq.weight": "self_attn.q_proj.weight", "attn.wq.bias": "self_attn.q_proj.bias",
    "attn.wk.weight": "self_attn.k_proj.weight", "attn.wk.bias": "self_attn.k_proj.bias",
    "attn.wv.weight": "self_attn.v_proj.weight", "attn.wv.bias": "self_attn.v_proj.bias",
    "attn.wo.weight": "self_attn.o_proj.weight",
    "attn.q_norm.weight": "self_attn.q_norm.weight", "attn.k_norm.weight": "self_attn.k_norm.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.w_gate.weight": "mlp.gate_proj.weight", "mlp.w_up.weight": "mlp.up_proj.weight",
    "mlp.w_down.weight": "mlp.down_proj.weight",
}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # a buffer some older checkpoints saved; we recompute it


def hf_name(name: str) -> str:
    """The HF tensor name of one of our parameter names (e.g. layers.3.attn.wq.weight)."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    _, i, rest = name.split(".", 2)
    return f"model.layers.{i}.{_LAYER_NAMES[rest]}"


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def _existing_dir(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"no checkpoint directory at {path} (local paths only; nothing is downloaded)")
    return path


def _rope(hf: dict[str, Any]) -> tuple[float, Optional[dict], list[str]]:
    """(rope_theta, rope_scaling for ModelConfig, problems). transformers 5 writes `rope_parameters`
    (theta inside it); older configs write top-level `rope_theta` and `rope_scaling`."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", None) or hf.get("rope_theta") or 10000.0)
    kind = params.pop("rope_type", params.pop("type", "default"))
    problems = []
    if any(isinstance(v, dict) for v in params.values()):
        problems.append("per-layer-type rope_parameters")
    elif kind not in ROPE_TYPES:
        problems.append(f"rope_type {kind!r} (supported: {', '.join(ROPE_TYPES)})")
    if float(params.get("partial_rotary_factor", hf.get("partial_rotary_factor") or 1.0)) != 1.0:
        problems.append("partial_rotary_factor != 1")
    if problems or kind == "default":
        return theta, None, problems
    if kind == "llama3":  # as transformers does: the pretraining length defaults to max_position_embeddings
        params.setdefault("original_max_position_embeddings",
                          hf.get("original_max_position_embeddings") or hf["max_position_embeddings"])
    return theta, {"rope_type": kind, **params}, problems


def config_from_hf(hf: dict[str, Any], max_seq_len: int = DEFAULT_MAX_SEQ_LEN) -> ModelConfig:
    """Map a parsed config.json onto ModelConfig.

    Args:
        hf: the checkpoint's config.json as a dict.
        max_seq_len: upper bound on positions; the result uses min(this, max_position_embeddings).
    Returns:
        The ModelConfig of a model whose forward matches transformers'.
    Raises:
        ValueError: unsupported model_type or architecture, or a feature the model lacks (all listed).
    """
    model_type = hf.get("model_type")
    if model_type not in FAMILIES:
        raise ValueError(f"unsupported model_type {model_type!r} (architectures {hf.get('architectures')}); "
                         f"supported: {', '.join(sorted(FAMILIES))}")
    fam = FAMILIES[model_type]
    theta, scaling, problems = _rope(hf)
    if hf.get("architectures") not in (None, [fam.architecture]):
        problems.append(f"architectures {hf['architectures']} (expected [{fam.architecture!r}])")
    if hf.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {hf['hidden_act']!r} (expected 'silu')")
    if hf.get("attention_bias"):  # Llama/Qwen3: would put a bias on o_proj too
        problems.append("attention_bias=true")
    if hf.get("mlp_bias"):
        problems.append("mlp_bias=true")
    if hf.get("use_sliding_window"):
        problems.append("use_sliding_window=true")
    if hf.get("per_layer_config"):  # transformers 5 heterogeneous layers
        problems.append("per_layer_config")
    if problems:
        raise ValueError(f"unsupported {model_type} checkpoint: {'; '.join(problems)}")
    n_heads = hf["num_attention_heads"]
    return ModelConfig(
        vocab_size=hf["vocab_size"], dim=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
        n_heads=n_heads, n_kv_heads=hf.get("num_key_value_heads") or n_heads,
        ffn_dim=hf["intermediate_size"],
        max_seq_len=min(max_seq_len, hf.get("max_position_embeddings") or max_seq_len),
        rope_theta=theta, norm_eps=hf["rms_norm_eps"],
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),  # all three classes default to False
        qkv_bias=fam.qkv_bias, qk_norm=fam.qk_norm,
        head_dim=hf.get("head_dim") or 0, rope_scaling=scaling)


def _checkpoint_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint: one file, or the shards its index names."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        files = [path / f for f in sorted(set(_read_json(index)["weight_map"].values()))]
        absent = [f.name for f in files if not f.exists()]
        if absent:
            raise FileNotFoundError(f"{index} names shards that are not there: {absent}")
        return files
    if (path / "model.safetensors").exists():
        return [path / "model.safetensors"]
    raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {path} "
                            "(pickled .bin checkpoints are not loaded)")


def _listing(names: list[str], limit: int = 20) -> str:
    more = f" ... and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _read_tensors(files: list[Path], cfg: ModelConfig, shapes: dict[str, tuple[int, ...]],
                  device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Our-named tensors from the checkpoint, checked for presence and shape before any is read."""
    wanted = {hf_name(n): n for n in shapes if not (cfg.tie_embeddings and n == "lm_head.weight")}
    found: dict[str, tuple[int, ...]] = {}  # HF name -> shape, from the headers only
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            found.update({k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()})
    missing = sorted(set(wanted) - set(found))
    unexpected = sorted(k for k in set(found) - set(wanted)  # a tied model may still store lm_head
                        if not (k.endswith(_IGNORED_SUFFIXES) or k == "lm_head.weight"))
    bad_shape = [f"{k} {found[k]} (expected {shapes[n]})" for k, n in wanted.items()
                 if k in found and found[k] != shapes[n]]
    problems = [f"{what} [{_listing(names)}]" for what, names in
                [("missing tensors", missing), ("unexpected tensors", unexpected), ("wrong shapes", bad_shape)]
                if names]
    if problems:
        raise ValueError(f"checkpoint {files[0].parent} does not match its config.json: {'; '.join(problems)}")
    tensors = {}
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for k in fh.keys():
                if k in wanted:
                    tensors[wanted[k]] = fh.get_tensor(k).to(device=device, dtype=dtype)
    return tensors


def load_hf_model(path: str | Path, device: str | torch.device = "cpu", dtype: Optional[torch.dtype] = None,
                  max_seq_len: int = DEFAULT_MAX_SEQ_LEN) -> Transformer:
    """Load a local HF Llama / Qwen2 / Qwen3 checkpoint (single-file or sharded safetensors).

    Args:
        path: checkpoint directory (config.json + safetensors); never a hub id.
        device: where the weights go.
        dtype: weight dtype; default bf16 on CUDA, fp32 elsewhere.
        max_seq_len: cap on the model's max_position_embeddings (RoPE table length).
    Returns:
        The model in eval mode.
    Raises:
        FileNotFoundError: no such directory, no config.json, or no safetensors weights.
        ValueError: unsupported architecture or feature; missing, unexpected or misshapen tensors.
    """
    path = _existing_dir(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"no config.json in {path}")
    cfg = config_from_hf(_read_json(path / "config.json"), max_seq_len)
    files = _checkpoint_files(path)
    device = torch.device(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    with torch.device("meta"):  # no memory and no random init for weights about to be replaced
        model = Transformer(cfg)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    tensors = _read_tensors(files, cfg, shapes, device, dtype)
    if cfg.tie_embeddings:
        tensors["lm_head.weight"] = tensors["embed.weight"]
    model.load_state_dict(tensors, strict=True, assign=True)
    if cfg.tie_embeddings:  # assign=True made two Parameters; keep one, as Transformer.__init__ does
        model.lm_head.weight = model.embed.weight
    # the RoPE buffers are not in the state dict: rebuild them (still on meta) as __init__ does
    cos, sin = rope_tables(cfg, cfg.max_seq_len + 1)
    model.rope_cos, model.rope_sin = cos.to(device, dtype), sin.to(device, dtype)
    return model.eval()


def hf_eos_ids(path: str | Path) -> Optional[tuple[int, ...]]:
    """EOS ids as `generate` would use them: generation_config.json first, then config.json.

    Returns:
        The ids (eos_token_id may be an int or a list), or None when neither file names one.
    """
    path = _existing_dir(path)
    for name in ("generation_config.json", "config.json"):
        eos = _read_json(path / name).get("eos_token_id")
        if eos is not None:
            return tuple(int(i) for i in (eos if isinstance(eos, list) else [eos]))
    return None


def load_hf_tokenizer(path: str | Path) -> Tokenizer:
    """The checkpoint's tokenizer.json, with the model's EOS ids.

    EOS ids come from generation_config.json / config.json (see `hf_eos_ids`); failing those, from
    the eos_token string of tokenizer_config.json; failing that, `<|endoftext|>`.

    Raises:
        FileNotFoundError: no such directory or no tokenizer.json in it.
    """
    path = _existing_dir(path)
    eos = _read_json(path / "tokenizer_config.json").get("eos_token") or EOT
    eos = eos["content"] if isinstance(eos, dict) else eos
    return Tokenizer(path, eos_tokens=(eos,), eos_ids=hf_eos_ids(path))


VocabHolder = Union[Tokenizer, Transformer, ModelConfig]


def _vocab_size(x: VocabHolder) -> int:
    return x.cfg.vocab_size if isinstance(x, Transformer) else x.vocab_size


def check_same_vocab(draft: VocabHolder, target: VocabHolder) -> None:
    """Check that a draft and a target share one vocabulary (draft ids index the target's logits).

    Args:
        draft, target: two tokenizers (same size and the same token -> id map), or two models or
            model configs (same vocab_size, i.e. embedding rows).
    Raises:
        TypeError: a tokenizer compared with a model (embedding rows may exceed tokenizer size).
        ValueError: the vocabularies differ; the message says how.
    """
    if isinstance(draft, Tokenizer) != isinstance(target, Tokenizer):
        raise TypeError("compare two tokenizers or two models, not a tokenizer with a model")
    dn, tn = _vocab_size(draft), _vocab_size(target)
    if dn != tn:
        raise ValueError(f"draft and target vocabularies differ in size: draft {dn}, target {tn}")
    if isinstance(draft, Tokenizer):
        dv, tv = draft.vocab(), target.vocab()
        diff = sorted(t for t in dv.keys() | tv.keys() if dv.get(t) != tv.get(t))
        if diff:
            examples = ", ".join(f"{t!r}: draft {dv.get(t)} target {tv.get(t)}" for t in diff[:5])
            raise ValueError(f"draft and target tokenizers map {len(diff)} tokens to different ids "
                             f"(e.g. {examples})")


TOKENIZER_PARTS = ("model", "added_tokens", "normalizer", "pre_tokenizer", "post_processor", "decoder")


def check_same_tokenizer(draft_dir: str | Path, target_dir: str | Path) -> None:
    """Check that two checkpoints carry the same tokenizer: their tokenizer.json files agree in
    every part that maps text to ids and back (vocabulary, merges, added tokens, normalizer,
    pre-tokenizer, post-processor, decoder). Sizes alone are not enough: two tokenizers of one size
    may number their tokens differently.

    Raises:
        FileNotFoundError: a folder without tokenizer.json.
        ValueError: naming the parts that differ.
    """
    parts = []
    for d in (draft_dir, target_dir):
        path = _existing_dir(d) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {d}: cannot check that draft and target share one")
        parts.append(_read_json(path))
    diff = [k for k in TOKENIZER_PARTS if parts[0].get(k) != parts[1].get(k)]
    if diff:
        raise ValueError(f"draft ({draft_dir}) and target ({target_dir}) tokenizers differ in their "
                         f"{', '.join(diff)}: a draft must use the target's tokenizer")


def shared_rows(tokenizer: Tokenizer, target_rows: int, draft_rows: int) -> int:
    """The embedding rows a draft and a target of one tokenizer share: their smaller count, as
    padded checkpoints (Qwen2.5-0.5B's 151,936 rows against 7B's 152,064) differ only past the
    tokenizer's own ids.

    Raises:
        ValueError: a model with fewer rows than the tokenizer has ids.
    """
    n = tokenizer.vocab_size
    for name, rows in (("target", target_rows), ("draft", draft_rows)):
        if rows < n:
            raise ValueError(f"the {name} has {rows} embedding rows, fewer than its tokenizer's {n} ids")
    return min(target_rows, draft_rows)
