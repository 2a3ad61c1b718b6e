"""workers.hf_loader against transformers' own forward, on tiny random checkpoints (no download)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402
from tokenizers import Tokenizer as HFTokenizer, models, pre_tokenizers  # noqa: E402

from tests.workers.hf_fixtures import (_BASE, FAMILIES, EOS_ID, LLAMA3_ROPE, VOCAB, make_hf_model,  # noqa: E402
                                       make_hf_pair, save_checkpoint)
from specdepth.workers.hf_loader import (check_same_vocab, config_from_hf, load_hf_model, load_hf_tokenizer)  # noqa: E402
from specdepth.workers.kv_cache import KVCache  # noqa: E402
from specdepth.workers.model import ModelConfig  # noqa: E402

TOL = 1e-4
# (family, sharded): every family once, sharding exercised on two of them
CASES = [("llama", False), ("llama3", True), ("qwen2", False), ("qwen3", True)]


@pytest.fixture(scope="module", params=CASES, ids=[f"{f}-{'sharded' if s else 'single'}" for f, s in CASES])
def checkpoint(request, tmp_path_factory):
    family, sharded = request.param
    hf = make_hf_model(family, seed=len(family))
    path = save_checkpoint(hf, tmp_path_factory.mktemp(family), sharded=sharded)
    assert (path / "model.safetensors.index.json").exists() == sharded
    return hf, path


def hf_logits(hf, seq: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=torch.tensor([seq])).logits[0].float()  # (T, V)


class Session:
    """Our model over a KV cache, mirrored by plain token lists that HF re-reads in full."""

    def __init__(self, model, hf, n_slots: int = 4, max_len: int = 64) -> None:
        cfg = model.cfg
        self.model, self.hf = model, hf
        self.cache = KVCache(cfg.n_layers, n_slots, cfg.n_kv_heads, cfg.hd, max_len, torch.float32, "cpu")
        self.seqs = {self.cache.allocate(): [] for _ in range(n_slots)}
        self.worst = 0.0

    def append(self, slots: list[int], new: list[list[int]]) -> None:
        """One ragged forward: slots[b] appends new[b]; compare every new row with HF."""
        T = max(map(len, new))
        tokens = torch.tensor([n + [0] * (T - len(n)) for n in new])  # (B, T) right-padded
        n_new = torch.tensor([len(n) for n in new])
        with torch.no_grad():
            out = self.model(self.cache, torch.tensor(slots), tokens, n_new)  # (B, T, V)
        for b, s in enumerate(slots):
            self.seqs[s] += new[b]
            ref = hf_logits(self.hf, self.seqs[s])[-len(new[b]):]
            self.worst = max(self.worst, (out[b, :len(new[b])] - ref).abs().max().item())

    def truncate(self, slot: int, drop: int) -> None:
        self.seqs[slot] = self.seqs[slot][:len(self.seqs[slot]) - drop]
        self.cache.truncate(slot, len(self.seqs[slot]))


def test_prefill_matches_transformers(checkpoint):
    hf, path = checkpoint
    model = load_hf_model(path)
    g = torch.Generator().manual_seed(0)
    sess = Session(model, hf)
    lengths = [5, 11, 1, 7]  # one ragged call, consecutive slots (the cache's slice read path)
    sess.append([0, 1, 2, 3], [torch.randint(VOCAB, (n,), generator=g).tolist() for n in lengths])
    assert sess.worst <= TOL


def test_ragged_verification_after_rollback_matches_transformers(checkpoint):
    hf, path = checkpoint
    model = load_hf_model(path)
    g = torch.Generator().manual_seed(1)
    rand = lambda n: torch.randint(VOCAB, (n,), generator=g).tolist()  # noqa: E731
    sess = Session(model, hf)
    sess.append([0, 1, 2, 3], [rand(n) for n in (6, 3, 9, 2)])
    sess.append([2, 0, 3], [rand(n) for n in (4, 2, 5)])  # drafts; non-consecutive slots
    for slot, drop in [(2, 3), (0, 2), (3, 5), (1, 2)]:  # reject some, all, or eat into the prompt
        sess.truncate(slot, drop)
    sess.append([1, 3, 0, 2], [rand(n) for n in (3, 1, 4, 2)])  # different tokens over stale KV
    for _ in range(3):  # more random verify-and-rollback rounds over a shuffled subset
        slots = torch.randperm(4, generator=g)[:3].tolist()
        counts = torch.randint(1, 6, (3,), generator=g).tolist()
        sess.append(slots, [rand(n) for n in counts])
        for s, n in zip(slots, counts):
            sess.truncate(s, int(torch.randint(0, n + 1, (1,), generator=g)))
    sess.append([0, 1, 2, 3], [rand(n) for n in (1, 5, 2, 3)])
    assert sess.worst <= TOL


def test_comparison_detects_missing_rope_scaling(tmp_path):
    """Negative control: the llama3 checkpoint read without its RoPE scaling is visibly wrong."""
    hf = make_hf_model("llama3", seed=3)
    save_checkpoint(hf, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": LLAMA3_ROPE["rope_theta"]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    sess = Session(load_hf_model(tmp_path), hf)
    sess.append([0], [torch.arange(24).tolist()])
    assert sess.worst > 100 * TOL


def test_loaded_config_dtype_and_tying(checkpoint):
    hf, path = checkpoint
    model = load_hf_model(path, max_seq_len=32)
    hc = hf.config
    assert model.cfg.max_seq_len == 32 and load_hf_model(path).cfg.max_seq_len == 256
    assert model.cfg.hd == (getattr(hc, "head_dim", None) or 8) and model.cfg.qkv_bias == (hc.model_type == "qwen2")
    assert model.embed.weight.dtype == torch.float32
    assert (model.lm_head.weight is model.embed.weight) == hc.tie_word_embeddings
    bf = load_hf_model(path, dtype=torch.bfloat16)
    assert {p.dtype for p in bf.parameters()} == {torch.bfloat16}


def test_transformers4_style_config_reads_the_same():
    """Older configs keep rope_theta at top level and scaling under rope_scaling (with "type")."""
    new = {**_BASE, "model_type": "llama", "hidden_act": "silu", "rope_parameters": LLAMA3_ROPE}
    scaling = {("type" if k == "rope_type" else k): v for k, v in LLAMA3_ROPE.items() if k != "rope_theta"}
    old = {**_BASE, "model_type": "llama", "rope_theta": LLAMA3_ROPE["rope_theta"], "rope_scaling": scaling}
    assert config_from_hf(old) == config_from_hf(new)
    assert config_from_hf(new).rope_scaling["rope_type"] == "llama3"


@pytest.mark.parametrize("edit, message", [
    ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "unsupported model_type 'gpt2'"),
    ({"architectures": ["LlamaForSequenceClassification"]}, "architectures"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "rope_type 'yarn'"),
    ({"attention_bias": True}, "attention_bias"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True},
     "use_sliding_window"),
])
def test_unsupported_checkpoint_is_refused(tmp_path, edit, message):
    FAMILIES["llama"][0](**_BASE, architectures=["LlamaForCausalLM"]).save_pretrained(tmp_path)
    cfg = {**json.loads((tmp_path / "config.json").read_text()), **edit}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=message):
        load_hf_model(tmp_path)  # refused from config.json alone: there are no weights here


@pytest.mark.parametrize("sharded", [False, True])
@pytest.mark.parametrize("dropped", ["model.layers.1.mlp.up_proj.weight", "lm_head.weight"])
def test_missing_tensor_is_named(tmp_path, sharded, dropped):
    save_checkpoint(make_hf_model("llama"), tmp_path, sharded=sharded)
    index = tmp_path / "model.safetensors.index.json"
    shard = tmp_path / (json.loads(index.read_text())["weight_map"][dropped] if sharded else "model.safetensors")
    tensors = load_file(shard)
    del tensors[dropped]
    save_file(tensors, shard, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"missing tensors \[{dropped}\]"):
        load_hf_model(tmp_path)


def test_unexpected_tensor_is_named(tmp_path):
    save_checkpoint(make_hf_model("llama"), tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["model.layers.0.self_attn.o_proj.bias"] = torch.zeros(_BASE["hidden_size"])
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"unexpected tensors \[model.layers.0.self_attn.o_proj.bias\]"):
        load_hf_model(tmp_path)


def test_wrong_shape_is_named(tmp_path):
    save_checkpoint(make_hf_model("qwen3"), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 40}))
    with pytest.raises(ValueError, match=r"wrong shapes \[.*model.layers.0.mlp.down_proj.weight \(32, 48\) "
                                         r"\(expected \(32, 40\)\)"):
        load_hf_model(tmp_path)


def test_nonexistent_or_weightless_path_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_hf_model(tmp_path / "Qwen/Qwen2.5-0.5B")  # looks like a hub id: still never downloaded
    with pytest.raises(FileNotFoundError):
        load_hf_tokenizer(tmp_path / "nowhere")
    FAMILIES["llama"][0](**_BASE).save_pretrained(tmp_path)  # config.json only
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_hf_model(tmp_path)


# ---- tokenizers and vocabularies ------------------------------------------------------------

WORDS = ["<unk>", "<eos>", "<|endoftext|>", "a", "b", "c", "<|im_end|>"]


def write_tokenizer(path: Path, words: list[str]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    tok = HFTokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))
    return path


@pytest.mark.parametrize("files, eos", [
    ({"config.json": {"eos_token_id": 1}, "generation_config.json": {"eos_token_id": [6, 1]}}, (6, 1)),
    ({"config.json": {"eos_token_id": [1, 6]}}, (1, 6)),
    ({"config.json": {"eos_token_id": 6}, "generation_config.json": {}}, (6,)),
    ({"tokenizer_config.json": {"eos_token": {"content": "<eos>"}}}, (1,)),
    ({}, (2,)),  # <|endoftext|>
])
def test_tokenizer_eos_ids(tmp_path, files, eos):
    write_tokenizer(tmp_path, WORDS)
    for name, content in files.items():
        (tmp_path / name).write_text(json.dumps(content))
    tok = load_hf_tokenizer(tmp_path)
    assert tok.eos_ids == eos and tok.encode("a c b") == [3, 5, 4]


def test_same_vocab_tokenizers(tmp_path):
    same = load_hf_tokenizer(write_tokenizer(tmp_path / "same", WORDS))
    check_same_vocab(same, load_hf_tokenizer(write_tokenizer(tmp_path / "t", WORDS)))
    swapped = load_hf_tokenizer(write_tokenizer(tmp_path / "swapped", WORDS[:3] + ["b", "a"] + WORDS[5:]))
    with pytest.raises(ValueError, match="2 tokens to different ids"):
        check_same_vocab(swapped, same)
    longer = load_hf_tokenizer(write_tokenizer(tmp_path / "longer", WORDS + ["d"]))
    with pytest.raises(ValueError, match="differ in size: draft 8, target 7"):
        check_same_vocab(longer, same)
    with pytest.raises(TypeError):
        check_same_vocab(same, ModelConfig(vocab_size=len(WORDS)))


def test_hf_pair_shares_vocab_and_mismatch_is_refused(tmp_path):
    pair = make_hf_pair(tmp_path)
    draft, target = load_hf_model(pair.draft_path), load_hf_model(pair.target_path)
    check_same_vocab(draft, target)
    assert target.cfg.qkv_bias and not draft.cfg.qkv_bias
    other = load_hf_model(save_checkpoint(make_hf_model("llama", vocab_size=VOCAB + 32), tmp_path / "big"))
    with pytest.raises(ValueError, match=f"draft {VOCAB + 32}, target {VOCAB}"):
        check_same_vocab(other, target)
    ids = torch.randint(VOCAB, (4, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # the pair agrees often, not always (greedy next tokens)
        agree = (pair.draft(ids).logits.argmax(-1) == pair.target(ids).logits.argmax(-1)).float().mean()
    assert 0.3 < agree < 0.95
    assert pair.target.generation_config.eos_token_id == EOS_ID
