"""The compiled passes (workers/compiled.py) compute what the eager forward computes.

Ragged batches through one small bucket: same logits (to rounding), same argmax, same cache
lengths and the same keys in the cache; a shape outside the buckets runs eagerly; two models of
one shape keep their own weights (frozen constants are never shared); a failing compiler falls
back to eager with one warning.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from specdepth.workers import compiled as compiled_mod
from specdepth.workers.compiled import buckets, compile_pair, compiled
from specdepth.workers.kv_cache import KVCache

from tests.pairs import tiny_pair

BATCHES, WIDTHS = (4,), (4,)


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(seed=5)


def _cache(model, slots: int = 4, max_len: int = 96) -> KVCache:
    cfg = model.cfg
    return KVCache(cfg.n_layers, slots, cfg.n_kv_heads, cfg.hd, max_len, torch.float32, model.device)


def _compare(model, fast, passes: int, rng: np.random.Generator) -> None:
    """Random ragged passes through `fast` and the eager model over two caches kept in step."""
    c_fast, c_eager = _cache(model), _cache(model)
    with torch.inference_mode():
        for _ in range(passes):
            B, T = int(rng.integers(1, 5)), int(rng.integers(1, 5))
            slots = torch.tensor(np.sort(rng.choice(4, B, replace=False)))
            n_new = torch.tensor(rng.integers(1, T + 1, B))
            n_new[0] = T
            tokens = torch.tensor(rng.integers(0, model.cfg.vocab_size, (B, T)))
            last = bool(rng.integers(0, 2))
            a = fast(c_fast, slots, tokens, n_new, last=last)
            b = model(c_eager, slots, tokens, n_new, last=last)
            valid = torch.ones(B, dtype=torch.bool) if last else torch.arange(T)[None, :] < n_new[:, None]
            torch.testing.assert_close(a[valid], b[valid], rtol=1e-4, atol=1e-4)
            assert (a[valid].argmax(-1) == b[valid].argmax(-1)).all()
            assert (c_fast.lengths == c_eager.lengths).all()
            for s in slots.tolist():
                n = int(c_eager.lengths[s])
                torch.testing.assert_close(c_fast.k[:, s, :, :n], c_eager.k[:, s, :, :n], rtol=1e-4, atol=1e-4)
            if c_eager.lengths.max() > 80:  # start over before the context runs out
                c_fast.lengths[:] = c_eager.lengths[:] = 0


def test_compiled_forward_matches_eager_on_ragged_batches(pair):
    target, _ = pair
    fast = compiled(target, BATCHES, WIDTHS)
    _compare(target, fast, 12, np.random.default_rng(0))
    assert fast.compiled_calls == 12


def test_models_of_one_shape_keep_their_own_weights(pair):
    target, _ = pair
    other, _ = tiny_pair(seed=6)
    _compare(other, compiled(other, BATCHES, WIDTHS), 4, np.random.default_rng(1))
    _compare(target, compiled(target, BATCHES, WIDTHS), 4, np.random.default_rng(2))


def test_a_shape_outside_the_buckets_runs_eagerly(pair):
    target, _ = pair
    fast = compiled(target, BATCHES, WIDTHS)
    before = fast.compiled_calls
    c_fast, c_eager = _cache(target), _cache(target)
    slots, tokens, n = torch.tensor([0, 1]), torch.arange(12).view(2, 6), torch.tensor([6, 3])  # 6 > widest bucket
    with torch.inference_mode():
        a, b = fast(c_fast, slots, tokens, n), target(c_eager, slots, tokens, n)
    assert fast.compiled_calls == before
    assert torch.equal(a, b) and (c_fast.lengths == c_eager.lengths).all()


def test_compile_modes_and_the_eager_fallback(pair, monkeypatch):
    target, draft = pair
    tc, dc = _cache(target), _cache(draft)
    t, d, summary = compile_pair(target, draft, tc, dc, "off", 3)
    assert t is target and d is draft and summary == "compiled passes: off"
    with pytest.raises(ValueError, match="auto"):
        compile_pair(target, draft, tc, dc, "fast", 3)

    def broken(*args, **kwargs):
        raise RuntimeError("no working C compiler")

    monkeypatch.setattr(compiled_mod.CompiledModel, "warm_up", broken)
    with pytest.warns(RuntimeWarning, match="running eagerly") as caught:
        t, d, summary = compile_pair(target, draft, tc, dc, "on", 3, bucket_sizes=(BATCHES, WIDTHS))
    assert len(caught) == 1 and t is target and d is draft
    assert summary.startswith("compiled passes: off") and "no working C compiler" in summary


def test_buckets():
    assert buckets(1) == (1,)
    assert buckets(6) == (1, 2, 4, 6)
    assert buckets(16) == (1, 2, 4, 8, 16)
