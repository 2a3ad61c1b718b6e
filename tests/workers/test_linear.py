"""The small-batch CPU linear (`workers/linear.py`): the same function as nn.Linear on every path,
repacked when its weight changes, and out of the way of training."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specdepth import workers
import specdepth.workers.linear
from specdepth.workers.kv_cache import KVCache
from specdepth.workers.linear import Linear
from specdepth.workers.model import ModelConfig, Transformer

needs_onednn = pytest.mark.skipif(not workers.linear.available(), reason="this torch build has no oneDNN linear")


@pytest.fixture(autouse=True)
def packed_where_allowed(monkeypatch):
    """These tests check the packed path itself: forced wherever a layer may take it (whether it
    pays on this machine is `linear_choice`'s, tested in test_linear_choice.py)."""
    monkeypatch.setenv("SPECDEPTH_LINEAR", "packed")


def _layer(n_in: int = 384, n_out: int = 1024, bias: bool = False) -> Linear:
    torch.manual_seed(0)
    return Linear(n_in, n_out, bias=bias)


@needs_onednn
@pytest.mark.parametrize("shape", [(1, 384), (2, 384), (4, 384), (3, 5, 384), (64, 384), (65, 384), (200, 384)])
@pytest.mark.parametrize("bias", [False, True])
def test_every_path_computes_the_same_linear(shape, bias):
    lin = _layer(bias=bias)
    x = torch.randn(shape)
    with torch.inference_mode():
        y = lin(x)
    assert y.shape == (*shape[:-1], 1024)
    torch.testing.assert_close(y, F.linear(x, lin.weight, lin.bias), rtol=1e-4, atol=1e-4)


@needs_onednn
def test_few_rows_take_the_packed_path_and_one_row_does_not():
    lin = _layer()
    with torch.inference_mode():
        lin(torch.randn(1, 384))
        assert lin._packed is None  # a matrix-vector product: the default path
        lin(torch.randn(4, 384))
        assert lin._packed is not None
    small = _layer(384, 384)  # 147k weights: below MIN_WEIGHT
    with torch.inference_mode():
        small(torch.randn(4, 384))
    assert small._packed is None


@needs_onednn
def test_a_weight_too_large_to_copy_keeps_the_default_path(monkeypatch):
    monkeypatch.setattr(workers.linear, "MAX_WEIGHT", 384 * 1024 - 1)
    lin, x = _layer(), torch.randn(4, 384)
    with torch.inference_mode():
        y = lin(x)
    assert lin._packed is None
    torch.testing.assert_close(y, F.linear(x, lin.weight), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_a_changed_weight_is_packed_again():
    lin, x = _layer(), torch.randn(4, 384)
    with torch.inference_mode():
        before = lin(x)
    with torch.no_grad():
        lin.weight.mul_(2.0)  # in place: same storage, new version
    with torch.inference_mode():
        after = lin(x)
    torch.testing.assert_close(after, 2.0 * before, rtol=1e-4, atol=1e-4)
    lin.weight = torch.nn.Parameter(torch.randn(1024, 384))  # a new tensor (a load, a .to())
    with torch.inference_mode():
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight), rtol=1e-4, atol=1e-4)


@needs_onednn
def test_a_layer_that_has_packed_copies_pickles_and_moves():
    """The packed weight is an opaque oneDNN tensor: copies and pickles leave it behind, and a
    dtype round trip packs again from the converted weight."""
    import copy
    import pickle
    lin, x = _layer(), torch.randn(4, 384)
    with torch.inference_mode():
        want = lin(x)
    for other in (copy.deepcopy(lin), pickle.loads(pickle.dumps(lin))):
        assert other._packed is None
        with torch.inference_mode():
            torch.testing.assert_close(other(x), want, rtol=1e-4, atol=1e-4)
    lin.half().float()  # the weight rounded to fp16 and back, in place
    assert lin._packed is None
    with torch.inference_mode():
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight), rtol=1e-4, atol=1e-4)


def test_training_takes_the_default_path_and_gets_gradients():
    lin = _layer()
    x = torch.randn(4, 384, requires_grad=True)
    lin(x).sum().backward()
    assert lin._packed is None
    assert lin.weight.grad is not None and x.grad is not None


@needs_onednn
def test_a_model_decoding_through_the_packed_path_matches_its_training_forward(monkeypatch):
    """Every linear of a small model on the packed path (the threshold lowered), a prefill and
    passes of 1..5 tokens per sequence, against the full causal recompute."""
    monkeypatch.setattr(workers.linear, "MIN_WEIGHT", 0)
    cfg = ModelConfig(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=64)
    model = Transformer(cfg)
    model.init_weights(1)
    gen = torch.Generator().manual_seed(2)
    seqs = torch.randint(0, cfg.vocab_size, (3, 20), generator=gen)  # (B, 20)
    cache = KVCache(cfg.n_layers, 3, cfg.n_kv_heads, cfg.hd, cfg.max_seq_len, torch.float32, "cpu")
    slots = torch.tensor([cache.allocate() for _ in range(3)])
    with torch.inference_mode():
        model(cache, slots, seqs[:, :5], torch.full((3,), 5), logits=False)
        done = 5
        for t in (1, 2, 3, 4, 5):
            out = model(cache, slots, seqs[:, done:done + t], torch.full((3,), t))  # (B, t, V)
            ref = model.forward_train(seqs[:, :done + t])[:, done:]  # (B, t, V)
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
            done += t
    assert model.layers[0].mlp.w_up._packed is not None


def test_warm_up_calls_each_linear_shape_once_at_every_row_count(monkeypatch):
    """`warm_up` builds every kernel a pass may need: each distinct (weight shape, bias) at each of
    1..SMALL_M_MAX rows, one layer per shape, and never with autograd on."""
    cfg = ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, max_seq_len=16)
    model = Transformer(cfg)
    calls: dict[tuple, set[int]] = {}
    layers: dict[tuple, set[int]] = {}
    forward = Linear.forward

    def spy(self, x):
        assert not torch.is_grad_enabled()
        key = (tuple(self.weight.shape), self.bias is None)
        calls.setdefault(key, set()).add(x.shape[0])
        layers.setdefault(key, set()).add(id(self))
        return forward(self, x)

    monkeypatch.setattr(Linear, "forward", spy)
    workers.linear.warm_up(model, model, max_rows=5)
    shapes = {(tuple(m.weight.shape), m.bias is None) for m in model.modules() if isinstance(m, Linear)}
    assert set(calls) == shapes and len(shapes) >= 4  # wq, wk/wv, w_gate/w_up, w_down, lm_head
    assert all(rows == {1, 2, 3, 4, 5} for rows in calls.values())
    assert all(len(ids) == 1 for ids in layers.values())
