"""Cost models: exactness, roofline shape, profiled tables and their compiled pricing, specs (online
refinement: test_cost_learning.py)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from specdepth.adaptive.cost import kernels_reference as ref_np
from specdepth.adaptive.cost.model import (CostModel, FixedCost, ProfiledCost, RooflineCost, load_cost, parse_cost,
                                           shape_for)
from specdepth.policies.base import StepCost


# ---- fixed -----------------------------------------------------------------------------------
def test_fixed_is_exact_whatever_the_tokens():
    c = FixedCost(target_ms=10, draft_ms=0.5)
    assert c.target_time(1) == 0.010 and isinstance(c.target_time(7), float)
    np.testing.assert_array_equal(c.target_time(np.array([1, 64, 4096]), context_tokens=10**6), [0.01] * 3)
    assert c.draft_time(1) == c.draft_time(256, 10**6) == 0.0005
    assert c.knee(max_tokens=512) == 512  # never bends
    c.observe(4, 0, 1.0, 1, 3, 1.0)  # no-op
    assert c.target_time(4) == 0.010
    assert isinstance(c, StepCost)


def test_fixed_rejects_nonpositive():
    with pytest.raises(ValueError):
        FixedCost(target_ms=0)


# ---- roofline --------------------------------------------------------------------------------
def test_roofline_flat_then_linear():
    c = RooflineCost(gpu="h200", target_b=27, draft_b=1)
    t = c.target_time(np.array([1, 2, 8, 32, 64]))
    np.testing.assert_allclose(t, t[0])  # memory-bound: extra step tokens are free
    t1k, t2k, t4k = c.target_time(1024), c.target_time(2048), c.target_time(4096)
    assert t4k - t2k == pytest.approx(2 * (t2k - t1k))  # compute-bound: linear in N
    assert 0.012 < t[0] < 0.020  # 54 GB of bf16 weights at ~3.9 TB/s plus 1 ms
    assert c.draft_time(1) < t[0] / 10


@pytest.mark.parametrize("gpu", ["h100", "h200", "a100"])
def test_roofline_knee_in_sane_range(gpu):
    c = parse_cost(gpu)
    assert 100 <= c.knee() <= 400
    assert c.knee(context_tokens=64 * 4096) > c.knee()  # KV reads widen the flat part
    assert c.target_time(1, 64 * 4096) > c.target_time(1)


def test_roofline_sizes_and_kv():
    assert shape_for(27).kv_bytes_per_token(2) == 2 * 46 * 16 * 128 * 2
    small, big = parse_cost("h200"), parse_cost("h200:target_b=70,draft_b=1")
    assert big.target_time(1) > 2 * small.target_time(1)
    assert parse_cost("a100").target_time(1) > parse_cost("h100").target_time(1) > small.target_time(1)
    assert parse_cost("h200:target_kv_bytes=1e6").target_time(1, 10**5) > small.target_time(1, 10**5)


# ---- profiled --------------------------------------------------------------------------------
def make_profiled(**kw) -> ProfiledCost:
    tokens = np.array([1, 2, 4, 8, 16, 32, 64, 128])
    ctx = np.array([0, 1000, 4000])
    flat = np.maximum(10.0, 0.2 * tokens)[None, :] + 0.001 * ctx[:, None]  # ms: knee near 50
    noise = np.array([1.0, 1.1, 0.95, 1.0, 1.2, 0.9, 1.0, 1.05])  # non-monotone measurement noise
    target = flat * noise * 1e-3
    draft = (1.0 + 0.01 * np.array([1, 8, 64]))[None, :] * np.ones((3, 1)) * 1e-3
    return ProfiledCost(tokens, ctx, target, [1, 8, 64], draft, **kw)


def test_profiled_is_monotone_and_interpolates():
    c = make_profiled()
    n = np.arange(1, 400)
    for ctx in (0, 500, 1000, 2500, 9000):
        t = c.target_time(n, ctx)
        assert np.all(np.diff(t) >= -1e-15)
    for k in n[::7]:
        assert c.target_time(int(k), 1000) >= c.target_time(int(k), 0)
    t = c.target_time(np.array([128, 628, 1128]))
    assert t[2] - t[1] == pytest.approx(t[1] - t[0]) and t[1] > t[0]  # linear beyond the grid
    np.testing.assert_allclose(c.target_time(c.token_grid, 4000), c.target_table[2])  # exact on the grid
    assert 8 <= c.knee() <= 128
    assert c.draft_time(8) == pytest.approx(1.08e-3)


@pytest.mark.parametrize("model", [FixedCost(3, 0.2), RooflineCost(gpu="a100", target_b=70, compute_eff=0.6),
                                   make_profiled()])
def test_json_round_trip(model, tmp_path):
    model.observe(16, 1000, 0.05, 8, 2, 0.004)  # corrections must survive the trip
    back = CostModel.from_json(model.to_json())
    assert type(back) is type(model)
    n = np.arange(1, 300)
    for ctx in (0, 1500):
        np.testing.assert_array_equal(back.target_time(n, ctx), model.target_time(n, ctx))
        assert back.draft_time(5, ctx) == model.draft_time(5, ctx)
    path = tmp_path / "cost.json"
    path.write_text(model.to_json())
    np.testing.assert_array_equal(parse_cost(str(path)).target_time(n), model.target_time(n))


# ---- specs -----------------------------------------------------------------------------------
def test_parse_cost_specs():
    assert parse_cost("fixed:target_ms=10,draft_ms=0.5") == FixedCost(10, 0.5)
    assert parse_cost("h200") == RooflineCost(gpu="h200")
    assert parse_cost("h200:target_b=70,draft_b=1") == RooflineCost(gpu="h200", target_b=70, draft_b=1)
    assert parse_cost("roofline:gpu=h100,memory_eff=0.8").gpu == "h100"


@pytest.mark.parametrize("spec", ["h300", "fixed:target_ms=abc", "h200:foo=1", "fixed:target_ms=-1",
                                  "h200:gpu=a100", "fixed:target_ms", "missing-profile.json"])
def test_parse_cost_errors_name_the_spec(spec):
    with pytest.raises(ValueError, match=spec.split(":")[0]):
        parse_cost(spec)


def test_bad_json_file_is_named(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"format": "specdepth-cost-v1", "kind": "warp"}')
    with pytest.raises(ValueError, match="bad.json"):
        load_cost(path)


# ---- profiling a real (tiny) model -------------------------------------------------------------
@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # the CPU is shared; oversubscribed threads make timings useless
    yield
    torch.set_num_threads(n)


def test_profile_quick_on_tiny_model(one_thread):
    from specdepth.adaptive.cost.model import profile
    from specdepth.workers.model import ModelConfig, Transformer
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=512)
    target, draft = Transformer(cfg).eval(), Transformer(cfg).eval()
    t0 = time.perf_counter()
    c = profile(target, draft, "cpu", quick=True)
    assert time.perf_counter() - t0 < 10
    assert c.target_table.shape == (len(c.ctx_grid), len(c.token_grid))
    assert np.all(c.target_table > 0) and np.all(np.diff(c.target_table, axis=1) >= 0)
    assert c.meta["target_params"] == target.num_params()
    assert c.target_time(1) > 0 and c.draft_time(4) > 0
    assert c.base_decode.shape == (len(c.ctx_grid), len(c.batch_grid)) and np.all(c.base_decode > 0)
    assert c.base_near.shape == c.base_decode.shape and np.all(c.base_near > 0)  # the near shape, timed
    assert c.jump_s(8, 100) >= 0.0 and c.jump_s(1, 100) == 0.0
    back = CostModel.from_json(c.to_json())
    assert back.target_time(37, 100) == c.target_time(37, 100)
    assert back.target_time(37, 100, 8) == c.target_time(37, 100, 8)
    assert back.jump_s(8, 100) == c.jump_s(8, 100)


def test_fast_monotone_refresh_keeps_order_and_bounds():
    rng = np.random.default_rng(0)
    base = np.cumsum(np.cumsum(rng.uniform(0.1, 1.0, (4, 10)), axis=1), axis=0)  # monotone both ways
    np.testing.assert_array_equal(ref_np.monotone_fast(base), base)  # already monotone: unchanged
    for _ in range(50):
        dented = base * np.exp(rng.uniform(-0.03, 0.03, base.shape))
        out = ref_np.monotone_fast(dented)
        assert (np.diff(out, axis=0) >= 0).all() and (np.diff(out, axis=1) >= 0).all()
        np.testing.assert_allclose(ref_np.monotone_fast(2.0 * dented), 2.0 * out)  # scale-equivariant
        assert np.all(ref_np.monotone_fast(dented * 1.03) >= out) and np.all(ref_np.monotone_fast(dented * 1.03) <= 1.03 * out + 1e-12)


@pytest.mark.parametrize("model", [FixedCost(), RooflineCost(), RooflineCost(gpu="a100", target_b=70, draft_b=3),
                                   load_cost("experiments/profiles/cpu-bundled.json")],
                         ids=lambda m: m.kind)
def test_target_by_n_is_target_time_bit_for_bit(model):
    for size, ctx in ((1, 0), (577, 12_345), (2305, 10**7), (577, 99)):
        want = np.asarray(model.target_time(np.arange(size), ctx), np.float64)
        for _ in range(2):  # a second call reads what the first cached
            got = model.target_by_n(size, ctx)
            assert got.dtype == np.float64 and got.tobytes() == want.tobytes()
            target, draft = model.step_prices(size, ctx, 7)
            assert target.tobytes() == want.tobytes() and draft == model.draft_time(7, ctx)


def test_profiled_target_by_n_is_target_time_bit_for_bit_in_every_step_shape():
    """ProfiledCost's compiled table: on and off its grids, beyond its last point, with the decode
    shape's offset at batch sizes on, between and past the batch grid, after online corrections."""
    plain = make_profiled(step_overhead_s=3e-4)
    decode = plain.target_table[:, [0, 3, 6]] * np.array([1.0, 0.9, 0.8])
    one_point = ProfiledCost([4], [0], [[1e-3]], [1], [[1e-4]], decode_s=[[9e-4]])
    for c in (plain, make_profiled(decode_s=decode, step_overhead_s=3e-4), make_profiled(decode_s=decode), one_point):
        for step in range(3):
            for size, ctx, b in ((1, 0, 0), (9, 0, 1), (37, 500, 4), (577, 1000, 8), (600, 12_345, 64),
                                 (2305, 10**7, 300), (130, 999.5, 3)):
                want = np.asarray(c.target_time(np.arange(size), ctx, b), np.float64)
                assert c.target_by_n(size, ctx, b).tobytes() == want.tobytes()
                for n in {0, min(1, size - 1), size // 2, size - 1}:  # one size at a time (the compiled scalar path)
                    for one in (n, np.int64(n), float(n)):
                        got = c.target_time(one, ctx, b)
                        assert type(got) is float and got.hex() == float(want[n]).hex()
                half = c.target_time(2.5, ctx, b)  # between grid points
                assert half.hex() == float(c.target_time(np.array([2.5]), ctx, b)[0]).hex()
                for rows in (1, 3, 8, 64, 300, 1000):  # on, between and past the batch grid
                    target, draft = c.step_prices(size, ctx, rows, b)
                    assert target.tobytes() == want.tobytes() and draft == c.draft_time(rows, ctx)
                    view = c.at_batch(b)
                    target, draft = view.step_prices(size, ctx, rows)
                    assert target.tobytes() == view.target_by_n(size, ctx).tobytes()
                    assert draft == view.draft_time(rows, ctx)
            c.observe(24, 2000, 1.3 * c.target_time(24, 2000), 8, 2, 0.002, overhead_s=1e-3, batch_size=8)


def test_compiled_refresh_and_rows_are_the_numpy_statements():
    from specdepth.adaptive.cost.kernels import monotone_kernel, row_kernel
    from specdepth.adaptive.cost.profiled import _FAR
    rng = np.random.default_rng(1)
    for shape in ((4, 14), (1, 8), (3, 1), (1, 1)):
        t = np.cumsum(rng.uniform(0.1, 1.0, shape), axis=1) * rng.uniform(0.7, 1.3, shape)  # dented
        np.testing.assert_array_equal(monotone_kernel(t), ref_np.monotone_fast(t))
        ctx_grid = np.cumsum(rng.uniform(100, 1000, shape[0]))
        x_grid = np.cumsum(rng.uniform(1, 8, shape[1]))
        x_ext = np.append(x_grid, _FAR) if shape[1] > 1 else np.array([0.0, _FAR])
        for ctx in (0.0, ctx_grid[0], ctx_grid.mean(), ctx_grid[-1], 3 * ctx_grid[-1]):
            np.testing.assert_array_equal(row_kernel(t, ctx_grid, x_ext, float(ctx), _FAR), ref_np.row(t, ctx_grid, x_ext, ctx))
    # the refresh: both corrected tables in one call, and the model's interpolators follow them
    from specdepth.adaptive.cost.kernels import refresh_kernel
    c = make_profiled()
    for step in range(40):  # corrections on both tables
        c.observe(int(rng.integers(1, 200)), int(rng.integers(0, 8000)), float(rng.uniform(5e-3, 0.05)),
                  int(rng.integers(1, 64)), int(rng.integers(1, 4)), float(rng.uniform(1e-3, 0.02)), None)
    t, d = refresh_kernel(c.base_target, c.target_logcorr, c.base_draft, c.draft_logcorr)
    np.testing.assert_allclose(t, ref_np.monotone_fast(c.base_target * np.exp(c.target_logcorr)), rtol=1e-13)
    np.testing.assert_allclose(d, ref_np.monotone_fast(c.base_draft * np.exp(c.draft_logcorr)), rtol=1e-13)
    assert (c.target_logcorr != 0).any() and (c.draft_logcorr != 0).any()
    c.target_time(57, 2500)
    c.observe(57, 2500, 0.03, 8, 1, 0.004, None)  # a row cached at 2500, then the tables corrected
    fresh = ProfiledCost.from_dict(c.to_dict())  # built from the same corrections, interpolators new
    for n, ctx in ((3, 0), (57, 2500), (190, 7999), (500, 12000)):
        assert c.target_time(n, ctx) == fresh.target_time(n, ctx) and c.draft_time(n % 64 + 1, ctx) == fresh.draft_time(n % 64 + 1, ctx)


def test_a_decode_table_prices_each_step_in_its_own_shape():
    """The target's table times N tokens as N / 4 sequences of 4; a step of B sequences without
    drafts is B x 1. With a decode table the step's batch size prices every N of that step as the
    table plus the decode shape's measured offset at N = B."""
    plain = make_profiled()
    decode = plain.target_table[:, [0, 3, 6]] * np.array([1.0, 0.9, 0.8])  # (3 ctx, batch 1, 8, 64): B x 1 is cheaper
    c = make_profiled(decode_s=decode)
    n = np.arange(64, 9 * 64 + 1)
    offset = decode[1, 2] - plain.target_table[1, 6]  # at B = 64, on the grid's context 1000
    np.testing.assert_allclose(c.target_time(n, 1000, 64), plain.target_time(n, 1000) + offset)
    assert c.target_time(64, 1000, 64) == pytest.approx(decode[1, 2])  # the step without drafts: as measured
    np.testing.assert_array_equal(c.target_time(n, 1000), plain.target_time(n, 1000))  # no batch: the table
    view = c.at_batch(64)  # what a policy sees: StepCost's signature, bound to the step's batch
    assert isinstance(view, StepCost)
    np.testing.assert_array_equal(view.target_time(n, 1000), c.target_time(n, 1000, 64))
    np.testing.assert_array_equal(view.target_by_n(600, 1000), c.target_time(np.arange(600), 1000, 64))
    assert view.draft_time(8, 1000) == c.draft_time(8, 1000) and view.step_overhead_s == c.step_overhead_s
    assert plain.at_batch(64) is plain and FixedCost().at_batch(64) == FixedCost()  # nothing to bind
    import pickle  # a policy holding the view travels to Ray replicas
    back_view = pickle.loads(pickle.dumps(view))
    np.testing.assert_array_equal(back_view.target_time(n, 1000), view.target_time(n, 1000))
    back = CostModel.from_json(c.to_json())  # the decode table travels; a JSON without one still loads
    np.testing.assert_array_equal(back.target_time(n, 1000, 64), c.target_time(n, 1000, 64))
    assert "decode_s" not in plain.to_dict()
    with pytest.raises(ValueError, match="decode_s"):
        make_profiled(decode_s=decode[:, :2])


def test_a_near_table_prices_the_jump_to_a_ragged_pass():
    """The pass at B sequences, one of two tokens, over the decode shape at B, less what the table
    already prices from N = B to B + 1: what verifying one drafted token costs beyond its token.
    None without a near table (unknown), 0 at batch 1, never below 0."""
    plain = make_profiled()
    decode = plain.target_table[:, [0, 3, 6]] * np.array([1.0, 0.9, 0.8])  # (3 ctx, batch 1, 8, 64)
    near = decode + np.array([[0.0, 2e-3, 1e-3]])  # 2 ms more at batch 8, 1 ms at 64
    c = make_profiled(decode_s=decode, near_s=near)
    table = plain.target_table[1]  # context 1000, the tokens grid 1, 2, 4, 8, 16, 32, 64, 128
    priced_8 = (table[4] - table[3]) / 8  # N = 8 -> 9: an eighth of the 8 -> 16 cell
    over = near[1] - c.base_decode[1]  # the near shape over the decode table as kept (made monotone)
    assert c.jump_s(8, 1000) == pytest.approx(over[1] - priced_8) and over[1] - priced_8 > 1e-3
    assert c.jump_s(64, 1000) == pytest.approx(over[2] - (table[7] - table[6]) / 64)
    assert c.jump_s(1, 1000) == 0.0
    assert make_profiled(decode_s=decode).jump_s(8, 1000) is None and FixedCost().jump_s(8) is None
    assert make_profiled(decode_s=decode, near_s=decode * 0.5).jump_s(8, 1000) == 0.0  # cheaper: no jump
    assert CostModel.from_json(c.to_json()).jump_s(8, 1000) == c.jump_s(8, 1000)
    from specdepth.adaptive.cost.free_draft import FreeDraftCost
    assert FreeDraftCost(c).at_batch(8).jump_s(8, 1000) == c.jump_s(8, 1000)  # what a policy asks
    with pytest.raises(ValueError, match="near_s"):
        make_profiled(decode_s=decode, near_s=near[:, :2])
