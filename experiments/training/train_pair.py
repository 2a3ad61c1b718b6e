"""Train the bundled draft/target pair on the standard library's sources.

    python -m specdepth.experiments.training.train_pair --work /tmp/pair --out workers/bundled

Stages (each resumable from its checkpoint in --work, each skipped when already finished):
1. tokenizer: byte-level BPE on the train split; 2. target: next-token cross-entropy;
3. draft: distilled from the target (KL from the target's distribution to the draft's), which is
what raises acceptance. Deterministic given --seed. Checkpoints are safetensors (model and AdamW
moments) plus a JSON step counter: nothing is pickled. Finally writes fp16/bf16 weights, the
tokenizer, the held-out prompt set and training stats to --out.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from specdepth.experiments.training.corpus import HELDOUT_MODULES, cut_prompts, read_text, split_files
from specdepth.workers.model import ModelConfig, Transformer
from specdepth.workers.tokenizer import EOT, Tokenizer
from specdepth.workers.weights import save_model

TARGET_CFG = ModelConfig(vocab_size=4096, dim=384, n_layers=6, n_heads=6, n_kv_heads=2, ffn_dim=1024)
DRAFT_CFG = ModelConfig(vocab_size=4096, dim=192, n_layers=2, n_heads=6, n_kv_heads=2, ffn_dim=512)


@dataclass(frozen=True)
class StageConfig:
    steps: int
    lr: float
    batch: int = 16
    seq_len: int = 256
    warmup: int = 100
    eval_every: int = 200
    ckpt_every: int = 50


def train_tokenizer(files: list[Path], out: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer as HFTok, decoders, models, pre_tokenizers, trainers
    tok = HFTok(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((read_text(p) for p in files), trainer=trainer)
    tok.save(str(out))


def encode_files(tok: Tokenizer, files: list[Path]) -> np.ndarray:
    eot = tok.eos_ids[0]
    ids: list[int] = []
    for p in files:
        ids.extend(tok.encode(read_text(p)))
        ids.append(eot)
    return np.asarray(ids, dtype=np.int16 if tok.vocab_size < 32768 else np.int32)


def batch_at(data: np.ndarray, rng: np.random.Generator, batch: int, seq_len: int) -> torch.Tensor:
    starts = rng.integers(0, len(data) - seq_len - 1, size=batch)
    return torch.from_numpy(np.stack([data[s:s + seq_len + 1] for s in starts]).astype(np.int64))


def lr_at(step: int, sc: StageConfig) -> float:
    if step < sc.warmup:
        return sc.lr * (step + 1) / sc.warmup
    frac = (step - sc.warmup) / max(1, sc.steps - sc.warmup)
    return sc.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def save_ckpt(path: Path, model: Transformer, opt: torch.optim.AdamW, step: int, extra: dict) -> None:
    tensors = {f"model.{k}": v.detach().clone() for k, v in model.state_dict().items()
               if k != "lm_head.weight"}
    for i, p in enumerate(model.parameters()):
        st = opt.state.get(p, {})
        if "exp_avg" in st:
            tensors[f"opt.{i}.exp_avg"] = st["exp_avg"]
            tensors[f"opt.{i}.exp_avg_sq"] = st["exp_avg_sq"]
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp))
    tmp.rename(path)
    path.with_suffix(".json").write_text(json.dumps({"step": step, **extra}))


def load_ckpt(path: Path, model: Transformer, opt: torch.optim.AdamW) -> dict:
    tensors = load_file(str(path))
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")}, strict=False)
    info = json.loads(path.with_suffix(".json").read_text())
    for i, p in enumerate(model.parameters()):
        if f"opt.{i}.exp_avg" in tensors:
            opt.state[p] = {"step": torch.tensor(float(info["step"])),
                            "exp_avg": tensors[f"opt.{i}.exp_avg"],
                            "exp_avg_sq": tensors[f"opt.{i}.exp_avg_sq"]}
    return info


@torch.no_grad()
def heldout_loss(model: Transformer, data: np.ndarray, sc: StageConfig, n_batches: int = 8) -> float:
    rng = np.random.default_rng(1234)
    model.eval()
    losses = []
    for _ in range(n_batches):
        b = batch_at(data, rng, sc.batch, sc.seq_len)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model.forward_train(b[:, :-1]).float()
        losses.append(F.cross_entropy(logits.flatten(0, 1), b[:, 1:].flatten()).item())
    model.train()
    return float(np.mean(losses))


def train_stage(name: str, model: Transformer, sc: StageConfig, train: np.ndarray, held: np.ndarray,
                work: Path, seed: int, teacher: Transformer | None = None) -> dict:
    """Train `model` for sc.steps (resuming from work/name.safetensors); return stats."""
    ckpt = work / f"{name}.safetensors"
    opt = torch.optim.AdamW(model.parameters(), lr=sc.lr, betas=(0.9, 0.95), weight_decay=0.1)
    info = {"step": 0, "seconds": 0.0}
    if ckpt.exists():
        info = load_ckpt(ckpt, model, opt)
        print(f"[{name}] resumed at step {info['step']}", flush=True)
    if info["step"] >= sc.steps:
        return info
    rng = np.random.default_rng([seed, info["step"]])  # resumed runs draw the same as a fresh one would not, but stay seeded
    model.train()
    t0, secs0 = time.time(), info["seconds"]
    bar = tqdm(range(info["step"], sc.steps), desc=name, initial=info["step"], total=sc.steps)
    loss_ema = None
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, sc)
        b = batch_at(train, rng, sc.batch, sc.seq_len)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16 matmuls: ~4x fp32 on AVX512-BF16
            logits = model.forward_train(b[:, :-1]).float()  # (B, T, V)
            if teacher is not None:
                with torch.no_grad():
                    p_t = F.log_softmax(teacher.forward_train(b[:, :-1]).float(), -1)  # (B, T, V)
        if teacher is None:
            loss = F.cross_entropy(logits.flatten(0, 1), b[:, 1:].flatten())
        else:
            loss = F.kl_div(F.log_softmax(logits, -1).flatten(0, 1), p_t.flatten(0, 1),
                            log_target=True, reduction="batchmean")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_ema = loss.item() if loss_ema is None else 0.98 * loss_ema + 0.02 * loss.item()
        bar.set_postfix(loss=f"{loss_ema:.3f}", lr=f"{lr_at(step, sc):.1e}")
        done = step + 1
        if done % sc.eval_every == 0 or done == sc.steps:
            hl = heldout_loss(model, held, sc)
            info["heldout_loss"] = hl
            tqdm.write(f"[{name}] step {done}: train loss {loss_ema:.3f}, held-out loss {hl:.3f}")
        if done % sc.ckpt_every == 0 or done == sc.steps:
            info.update(step=done, seconds=secs0 + time.time() - t0, train_loss=loss_ema)
            save_ckpt(ckpt, model, opt, done, {k: v for k, v in info.items() if k != "step"})
    info["heldout_ce"] = heldout_loss(model, held, sc)
    return info


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="checkpoints and caches (not committed)")
    ap.add_argument("--out", type=Path, default=Path("workers/bundled"))
    ap.add_argument("--target-steps", type=int, default=2200)
    ap.add_argument("--draft-steps", type=int, default=2400)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    train_files, held_files = split_files()
    print(f"corpus: {len(train_files)} train files, {len(held_files)} held-out files "
          f"(modules {', '.join(HELDOUT_MODULES)})", flush=True)

    tok_path = args.work / "tokenizer.json"
    if not tok_path.exists():
        t = time.time()
        train_tokenizer(train_files, tok_path, args.vocab)
        print(f"tokenizer trained in {time.time() - t:.0f} s", flush=True)
    tok = Tokenizer(tok_path)
    cache = args.work / "tokens.npz"
    if not cache.exists():
        np.savez(cache, train=encode_files(tok, train_files), held=encode_files(tok, held_files))
    arrays = np.load(cache)
    train, held = arrays["train"], arrays["held"]
    print(f"tokens: {len(train):,} train, {len(held):,} held-out", flush=True)

    target = Transformer(TARGET_CFG)
    target.init_weights(args.seed)
    t_info = train_stage("target", target, StageConfig(args.target_steps, 6e-4), train, held, args.work, args.seed)
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    draft = Transformer(DRAFT_CFG)
    draft.init_weights(args.seed + 1)
    d_info = train_stage("draft", draft, StageConfig(args.draft_steps, 2e-3), train, held, args.work,
                         args.seed + 1, teacher=target)

    save_model(target, args.out / "target.safetensors", torch.bfloat16)
    save_model(draft, args.out / "draft.safetensors", torch.bfloat16)
    (args.out / "tokenizer.json").write_text(tok_path.read_text())
    prompts = cut_prompts(held_files)
    with open(args.out / "prompts.jsonl", "w") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p}) + "\n")
    stats = {"target": {"params": target.num_params(), **t_info}, "draft": {"params": draft.num_params(), **d_info},
             "train_tokens": int(len(train)), "heldout_tokens": int(len(held)), "heldout_modules": list(HELDOUT_MODULES),
             "n_prompts": len(prompts)}
    (args.out / "training.json").write_text(json.dumps(stats, indent=1))
    print(json.dumps(stats, indent=1))


if __name__ == "__main__":
    main()
