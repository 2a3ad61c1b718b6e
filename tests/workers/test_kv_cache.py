"""KV correctness: the ragged one-call forward gives the same logits as running each sequence
alone (full causal recompute, no cache), across random prefill / forward / rollback programs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdepth.workers.kv_cache import KVCache
from specdepth import workers
import specdepth.workers.model
import specdepth.workers.padding
from specdepth.workers.model import ModelConfig, Transformer, attention_parts

CFG = ModelConfig(vocab_size=50, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=64)
MODEL = Transformer(CFG)
MODEL.init_weights(0)
MODEL.eval()

# an op: (sequence index, action, new tokens or rollback amount)
# (restart: the sequence leaves, its slot is released, moving another sequence's keys into its row,
# and a new sequence takes a slot with these tokens as its prompt)
op = st.tuples(st.integers(0, 3), st.sampled_from(["forward", "rollback", "restart"]),
               st.lists(st.integers(0, CFG.vocab_size - 1), min_size=1, max_size=9))


@pytest.fixture(params=[(0.0, 0.0), (1e9, 0.0), (1e9, 1e9)], ids=["two-parts", "padded", "all-padded"])
def pad_limit(request, monkeypatch):
    """Every way a ragged batch runs: its attention split in two parts, or padded (per-token layers
    on the packed valid tokens either way), or every layer padded (`PAD_ALL`)."""
    monkeypatch.setattr(workers.model, "PAD_LIMIT", request.param[0])
    monkeypatch.setattr(workers.padding, "PAD_ALL", request.param[1])
    return request.param


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=st.lists(st.lists(st.integers(0, 49), min_size=1, max_size=12), min_size=4, max_size=4),
       program=st.lists(st.lists(op, min_size=1, max_size=4), min_size=1, max_size=6),
       slot_order=st.permutations(list(range(6))))
def test_ragged_forward_matches_each_sequence_alone(pad_limit, prompts, program, slot_order):
    cache = KVCache(CFG.n_layers, 6, CFG.n_kv_heads, CFG.hd, CFG.max_seq_len, torch.float32, "cpu")
    for s in range(6):  # allocate in a shuffled order so slots are not always consecutive
        cache.allocate()
    slots = [slot_order[i] for i in range(4)]
    seqs = [[] for _ in range(4)]
    with torch.no_grad():
        steps = [[(i, "forward", p) for i, p in enumerate(prompts)]] + program
        for ops in steps:
            fwd = {}
            for i, act, toks in ops:
                if act == "rollback":  # drop the last len(toks) positions, keep at least one
                    keep = max(1, len(seqs[i]) - len(toks))
                    if seqs[i]:  # (not a new sequence before its prompt)
                        cache.truncate(slots[i], keep)
                        seqs[i] = seqs[i][:keep]
                elif act == "restart":
                    cache.release(slots[i])
                    slots[i], seqs[i] = cache.allocate(), []
                    fwd[i] = toks
                elif len(seqs[i]) + len(toks) <= CFG.max_seq_len:
                    fwd[i] = toks  # one entry per sequence per call (the last wins)
            if not fwd:
                continue
            idx = sorted(fwd)
            T = max(len(fwd[i]) for i in idx)
            x = torch.zeros((len(idx), T), dtype=torch.long)
            for r, i in enumerate(idx):
                x[r, : len(fwd[i])] = torch.tensor(fwd[i])
            n = torch.tensor([len(fwd[i]) for i in idx])
            out = MODEL(cache, torch.tensor([slots[i] for i in idx]), x, n)  # (b, T, V)
            for r, i in enumerate(idx):
                seqs[i] += fwd[i]
                ref = MODEL.forward_train(torch.tensor([seqs[i]]))[0, -len(fwd[i]):]
                assert (out[r, : len(fwd[i])] - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("n_new", [[3, 3, 3], [1, 3, 2], [1, 1, 1], [4]], ids=["full", "ragged", "one", "single"])
def test_last_token_logits_are_the_full_logits_last_rows(n_new, pad_limit):
    """`last=True` (a draft pass: only each sequence's next-token distribution is read) gives the
    rows of the full logits at each sequence's last new token, and advances the cache the same,
    with the batch's slots out of their rows' order (the first slot's release moved the last)."""
    B, T = len(n_new), max(n_new)
    gen = torch.Generator().manual_seed(len(n_new) * 10 + T)
    prefix = torch.randint(0, CFG.vocab_size, (B, 5), generator=gen)
    x = torch.randint(0, CFG.vocab_size, (B, T), generator=gen)
    n = torch.tensor(n_new)
    outs, lens = [], []
    with torch.no_grad():
        for last in (False, True):
            cache = KVCache(CFG.n_layers, B + 1, CFG.n_kv_heads, CFG.hd, CFG.max_seq_len, torch.float32, "cpu")
            slots = [cache.allocate() for _ in range(B + 1)]
            cache.release(slots.pop(0))
            slots = torch.tensor(slots)
            MODEL(cache, slots, prefix, torch.full((B,), 5), logits=False)
            outs.append(MODEL(cache, slots, x, n, last=last))
            lens.append(cache.lengths_t(slots).tolist())
    full, last = outs
    assert last.shape == (B, CFG.vocab_size)
    assert (full[torch.arange(B), n - 1] - last).abs().max().item() <= 1e-5
    assert lens[0] == lens[1] == [5 + k for k in n_new]


@pytest.mark.parametrize("n_new", [[3, 3, 3], [1, 3, 2]], ids=["full", "ragged"])
def test_attention_takes_the_kernel_s_output_in_any_memory_layout(n_new, monkeypatch):
    """A CUDA attention kernel may return its (B, H, T, D) output stored as (B, T, H, D): the
    model must not assume a layout (the first run on a GPU raised "view size is not compatible
    with input tensor's size and stride" there). The same values in the other layout give the
    same logits."""
    B, T = len(n_new), max(n_new)
    gen = torch.Generator().manual_seed(7)
    prefix = torch.randint(0, CFG.vocab_size, (B, 5), generator=gen)
    x = torch.randint(0, CFG.vocab_size, (B, T), generator=gen)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def run() -> torch.Tensor:
        with torch.no_grad():
            cache = KVCache(CFG.n_layers, B, CFG.n_kv_heads, CFG.hd, CFG.max_seq_len, torch.float32, "cpu")
            slots = torch.tensor([cache.allocate() for _ in range(B)])
            MODEL(cache, slots, prefix, torch.full((B,), 5), logits=False)
            return MODEL(cache, slots, x, torch.tensor(n_new))

    plain = run()

    def other_layout(*args, **kwargs) -> torch.Tensor:
        y = sdpa(*args, **kwargs)  # (B, H, T, D)
        return y.transpose(1, 2).contiguous().transpose(1, 2)  # same values, stored (B, T, H, D)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", other_layout)
    assert torch.equal(run(), plain)


def _parts(n_new: list[int]) -> int:
    """How many attention parts a ragged batch of these new-token counts runs in (context 100 each)."""
    B = len(n_new)
    _, parts = attention_parts(np.full(B, 100), np.array(n_new), 2, lambda s: torch.from_numpy(s), np.arange(B))
    return len(parts)


def test_attention_pads_a_batch_where_many_rows_are_long_and_splits_one_long_row_among_many_of_one() -> None:
    assert _parts([9] + [1] * 15) == 2  # 144 padded queries against 24 split: split
    assert _parts([2] + [1] * 15) == 2  # one long row: the split, however little it pads (PAD_LIMIT)
    assert _parts([3] * 8 + [1] * 8) == 1  # 48 against 32: within PAD_LIMIT
    # 8 of 14 rows longer than 1: 126 padded queries against 78 split, within PAD_LIMIT x WIDE
    assert _parts([9, 3, 4, 2, 5, 2, 3, 6, 1, 1, 1, 1, 1, 1]) == 1
    assert _parts([9, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]) == 2  # 2 of 14 long: the plain limit, split


def test_slots_in_use_hold_the_first_rows_and_keep_their_keys_through_releases() -> None:
    """Whatever the order of allocations and releases, the slots in use sit in rows 0..used-1 (a
    batch of all of them reads its keys as a view) and each keeps its own keys."""
    cache = KVCache(2, 8, 1, 2, 6, torch.float32, "cpu")
    rng = np.random.default_rng(0)
    live: list[int] = []
    for _ in range(200):
        if live and (len(live) == 8 or rng.random() < 0.45):
            cache.release(live.pop(int(rng.integers(len(live)))))
        else:
            s = cache.allocate()
            n = int(rng.integers(1, 6))
            cache.k[:, cache.row[s], :, :n] = float(s)  # this slot's keys: its id
            cache.v[:, cache.row[s], :, :n] = -float(s)
            cache.lengths[s] = n
            live.append(s)
        assert sorted(cache.rows(np.array(live, np.int64)).tolist()) == list(range(len(live)))
        for s in live:
            n = int(cache.lengths[s])
            assert (cache.k[:, cache.row[s], :, :n] == s).all() and (cache.v[:, cache.row[s], :, :n] == -s).all()
    full = np.sort(cache.rows(np.array(live, np.int64)))
    assert isinstance(KVCache.slot_index(full), slice)
