"""Cost models: exactness, roofline shape, profiled table monotonicity and bounded refinement, specs."""

from __future__ import annotations

import copy
import math
import time

import numpy as np
import pytest
import torch

from specdepth.adaptive.cost_model import (CostModel, FixedCost, ProfiledCost, RooflineCost, load_cost, parse_cost,
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


def test_one_slow_step_moves_prediction_at_most_a_few_percent():
    c = make_profiled()
    bound = (1 + c.max_step * (1 - c.speed_share)) * (1 + c.speed_max_step)  # the cells', then the speed's
    before = c.target_time(np.arange(1, 129), 1000)
    c.observe(16, 1000, 100 * c.target_time(16, 1000), 8, 2, 100 * 2 * c.draft_time(8, 1000))
    after = c.target_time(np.arange(1, 129), 1000)
    assert np.all(after / before <= bound + 1e-9) and np.all(after >= before)
    assert after[15] / before[15] > 1.05  # the speed follows the machine fast
    for _ in range(6):  # ... and back: steps at the table's own time undo the outlier
        c.observe(16, 1000, before[15], 8, 2, 2 * c.draft_time(8, 1000) / np.exp(c.speed_logcorr))
    assert c.target_time(16, 1000) / before[15] < 1.02
    after = c.target_time(np.arange(1, 129), 1000)
    c.observe(16, 1000, 1e-3 * c.target_time(16, 1000), 8, 2, 0.0)  # absurdly fast: bounded too
    assert np.all(c.target_time(np.arange(1, 129), 1000) / after >= 1 / bound - 1e-9)


def test_consistent_observations_converge():
    c = make_profiled()
    truth, draft_truth = 1.3 * c.target_time(24, 2000), 1.25 * c.draft_time(8, 2000)
    for _ in range(200):
        c.observe(24, 2000, truth, 8, 2, 2 * draft_truth)  # two draft passes
    assert c.target_time(24, 2000) == pytest.approx(truth, rel=0.01)
    assert c.draft_time(8, 2000) == pytest.approx(draft_truth, rel=0.01)


def test_frozen_does_not_learn():
    c = make_profiled(frozen=True)
    before = c.target_time(16, 1000)
    c.observe(16, 1000, 10 * before, 8, 1, 1.0)
    assert c.target_time(16, 1000) == before


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
    from specdepth.adaptive.cost_model import profile
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
    back = CostModel.from_json(c.to_json())
    assert back.target_time(37, 100) == c.target_time(37, 100)
    assert back.target_time(37, 100, 8) == c.target_time(37, 100, 8)


def test_fast_monotone_refresh_keeps_order_and_bounds():
    from specdepth.adaptive.cost_model import _monotone_fast
    rng = np.random.default_rng(0)
    base = np.cumsum(np.cumsum(rng.uniform(0.1, 1.0, (4, 10)), axis=1), axis=0)  # monotone both ways
    np.testing.assert_array_equal(_monotone_fast(base), base)  # already monotone: unchanged
    for _ in range(50):
        dented = base * np.exp(rng.uniform(-0.03, 0.03, base.shape))
        out = _monotone_fast(dented)
        assert (np.diff(out, axis=0) >= 0).all() and (np.diff(out, axis=1) >= 0).all()
        np.testing.assert_allclose(_monotone_fast(2.0 * dented), 2.0 * out)  # scale-equivariant
        assert np.all(_monotone_fast(dented * 1.03) >= out) and np.all(_monotone_fast(dented * 1.03) <= 1.03 * out + 1e-12)


def test_a_slower_machine_moves_every_prediction_together():
    """Evidence at one (N, batch) that both models run 1.3x slower lifts predictions everywhere
    through the shared speed, so the draft/target ratio and the knee's place stay as profiled."""
    c = make_profiled()
    n = np.array([1, 8, 64, 128])
    before_t, before_d = c.target_time(n, 500), np.array([c.draft_time(b, 500) for b in (1, 8, 32)])
    for _ in range(300):
        c.observe(8, 500, 1.3 * before_t[1], 8, 1, 1.3 * before_d[1])
    ratio_t = c.target_time(n, 500) / before_t
    ratio_d = np.array([c.draft_time(b, 500) for b in (1, 8, 32)]) / before_d
    assert c.target_time(8, 500) == pytest.approx(1.3 * before_t[1], rel=0.01)
    assert np.all(ratio_t > 1.15) and np.all(ratio_d > 1.15)  # unobserved cells follow the speed
    assert c.speed_logcorr > 0.6 * math.log(1.3)


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
                for rows in (1, 3, 8, 64, 300, 1000):  # on, between and past the batch grid
                    target, draft = c.step_prices(size, ctx, rows, b)
                    assert target.tobytes() == want.tobytes() and draft == c.draft_time(rows, ctx)
                    view = c.at_batch(b)
                    target, draft = view.step_prices(size, ctx, rows)
                    assert target.tobytes() == view.target_by_n(size, ctx).tobytes()
                    assert draft == view.draft_time(rows, ctx)
            c.observe(24, 2000, 1.3 * c.target_time(24, 2000), 8, 2, 0.002, overhead_s=1e-3, batch_size=8)


def test_profiled_learns_the_step_overhead_apart_from_the_pass():
    c = make_profiled()
    pass_s = 1.3 * (c.target_time(24, 2000) - c.step_overhead_s)
    for _ in range(300):  # every step also spends 2 ms outside the passes
        c.observe(24, 2000, pass_s, 8, 2, 2 * c.draft_time(8, 2000), overhead_s=2e-3)
    assert c.step_overhead_s == pytest.approx(2e-3, rel=0.01)
    assert c.target_time(24, 2000) == pytest.approx(pass_s + 2e-3, rel=0.01)  # the pass learned apart
    c.observe(24, 2000, pass_s, 8, 2, 2 * c.draft_time(8, 2000), overhead_s=5.0)  # a 5 s pause
    assert c.step_overhead_s < 2e-3 * 1.2  # counted as at most 2x + 1 ms, at a tenth of the way
    assert make_profiled().to_dict()["step_overhead_s"] == 0.0
    assert CostModel.from_dict(c.to_dict()).step_overhead_s == c.step_overhead_s


def test_profiled_learns_what_each_draft_pass_costs_outside_the_passes():
    c = make_profiled()
    pure = c.draft_time(8, 2000)
    rng = np.random.default_rng(0)
    for _ in range(400):  # 1 ms every step, 0.5 ms more per draft pass, +-0.2 ms of noise
        p = int(rng.integers(0, 5))
        c.observe(24, 2000, c.target_time(24, 2000) - c.step_overhead_s, 8, 0, 0.0,
                  overhead_s=1e-3 + 5e-4 * p + rng.uniform(-2e-4, 2e-4), overhead_passes=p)
    assert c.step_overhead_s == pytest.approx(1e-3, rel=0.15)
    assert c.pass_overhead_s == pytest.approx(5e-4, rel=0.15)
    assert c.draft_time(8, 2000) == pytest.approx(pure + c.pass_overhead_s)  # a pass's price includes it
    back = CostModel.from_dict(c.to_dict())
    assert (back.step_overhead_s, back.pass_overhead_s) == (c.step_overhead_s, c.pass_overhead_s)
    slope = c.pass_overhead_s
    for _ in range(400):  # a run that stops drafting: what a pass costs is not forgotten
        c.observe(24, 2000, c.target_time(24, 2000) - c.step_overhead_s, 8, 0, 0.0,
                  overhead_s=1e-3 + rng.uniform(-2e-4, 2e-4))
    assert c.pass_overhead_s == pytest.approx(slope, rel=0.2) and c.step_overhead_s == pytest.approx(1e-3, rel=0.15)


def test_a_first_step_s_one_off_overhead_does_not_price_every_step():
    """An engine's first step pays allocations and first calls (0.53 s at batch 64 on the bundled
    pair, against ~3 ms after). Taken at face value it made every step look 0.5 s dearer for
    tens of steps, next to which deep drafts looked free."""
    c = make_profiled()
    c.observe(24, 2000, c.target_time(24, 2000), 8, 0, 0.0, overhead_s=0.53, overhead_passes=0)
    assert c.step_overhead_s <= 1e-3 + 1e-12
    for _ in range(8):  # the real overhead, 3 ms, is reached within a few steps
        c.observe(24, 2000, c.target_time(24, 2000) - c.step_overhead_s, 8, 0, 0.0, overhead_s=3e-3)
    assert c.step_overhead_s == pytest.approx(3e-3, rel=0.1)


def test_profiled_learns_the_engine_s_draft_pass_quickly():
    """The engine's draft pass (catch-up tokens, features) took 3x the profiled forward at batch
    64 on the bundled pair; a policy that drafts now and then gives few observations, so the
    draft's price must converge within tens of drafting steps, not hundreds."""
    c = make_profiled()
    pure, target = c.draft_time(8, 2000), c.target_time(24, 2000)  # the target runs as profiled
    rng = np.random.default_rng(0)
    for _ in range(30):
        c.observe(24, 2000, target, 8, 2, 2 * 3 * pure * rng.uniform(0.9, 1.1))
    assert c.draft_time(8, 2000) == pytest.approx(3 * pure, rel=0.1)
    assert c.target_time(24, 2000) == pytest.approx(make_profiled().target_time(24, 2000), rel=0.1)  # the target's stays
    back = CostModel.from_dict(c.to_dict())
    assert back.draft_time(8, 2000) == pytest.approx(c.draft_time(8, 2000))


def test_the_draft_ratio_s_evidence_ages_with_the_steps_not_the_drafting_steps():
    """A drafting step after many that drafted nothing weighs ~as much as the ratio's memory has
    forgotten: a policy that stopped drafting on a pass priced too dear corrects the price from
    the odd pass it drafts to check (dspark's `_trying`), instead of lr / 2 of the error at a time."""
    c = make_profiled()
    pure = c.draft_time(8, 2000)
    for _ in range(100):  # the engine's pass took 1.5x the profile's
        c.observe(24, 2000, c.target_time(24, 2000), 8, 2, 2 * 1.5 * pure)
    assert c.draft_time(8, 2000) == pytest.approx(1.5 * pure, rel=0.01)

    def weight(gap: int) -> float:
        """The share of its error a drafting step at the profile's time corrects, after `gap` steps without drafting."""
        m = copy.deepcopy(c)
        for _ in range(gap):
            m.observe(9, 2000, m.target_time(9, 2000), 8, 0, 0.0)
        r0, err = m.draft_ratio_logcorr, math.log(pure / m._pass_time(8, 2000))
        m.observe(24, 2000, m.target_time(24, 2000), 8, 2, 2 * pure)
        return (m.draft_ratio_logcorr - r0) / err

    assert weight(0) == pytest.approx(0.05, abs=0.002)  # steady drafting: lr / 2 (memory 2 / lr steps)
    assert weight(16) == pytest.approx(0.107, abs=0.005)
    assert weight(64) > 0.55  # counted in drafting steps alone: 0.05 again
    assert weight(1000) > 0.999


def test_an_engine_s_first_drafting_step_does_not_price_every_draft_pass():
    """The first drafting step pays one-off first calls (`specdepth generate`: 2.77 ms against 0.76
    priced): it moves the draft ratio at most 2x, and is not evidence for the draft's cells or the
    shared speed; the passes after it bring the ratio to the engine's true one."""
    c = make_profiled()
    pure, target, speed = c.draft_time(1, 200), c.target_time(2, 200), c.speed_logcorr
    c.observe(2, 200, target, 1, 1, 3.6 * pure)
    assert c.draft_time(1, 200) == pytest.approx(2.0 * pure)
    assert c.speed_logcorr == speed and not c.draft_logcorr.any()
    for _ in range(20):  # then the engine's pass, 1.4x the profile's
        c.observe(2, 200, target, 1, 1, 1.4 * pure)
    assert c.draft_time(1, 200) == pytest.approx(1.4 * pure, rel=0.03)


def test_compiled_refresh_and_rows_are_the_numpy_statements():
    from specdepth.adaptive.cost_kernels import monotone_kernel, row_kernel
    from specdepth.adaptive.cost_model import _FAR, _monotone_fast, _row
    rng = np.random.default_rng(1)
    for shape in ((4, 14), (1, 8), (3, 1), (1, 1)):
        t = np.cumsum(rng.uniform(0.1, 1.0, shape), axis=1) * rng.uniform(0.7, 1.3, shape)  # dented
        np.testing.assert_array_equal(monotone_kernel(t), _monotone_fast(t))
        ctx_grid = np.cumsum(rng.uniform(100, 1000, shape[0]))
        x_grid = np.cumsum(rng.uniform(1, 8, shape[1]))
        x_ext = np.append(x_grid, _FAR) if shape[1] > 1 else np.array([0.0, _FAR])
        for ctx in (0.0, ctx_grid[0], ctx_grid.mean(), ctx_grid[-1], 3 * ctx_grid[-1]):
            np.testing.assert_array_equal(row_kernel(t, ctx_grid, x_ext, float(ctx), _FAR), _row(t, ctx_grid, x_ext, ctx))
    # the refresh: both corrected tables in one call, and the model's interpolators follow them
    from specdepth.adaptive.cost_kernels import refresh_kernel
    c = make_profiled()
    for step in range(40):  # corrections on both tables
        c.observe(int(rng.integers(1, 200)), int(rng.integers(0, 8000)), float(rng.uniform(5e-3, 0.05)),
                  int(rng.integers(1, 64)), int(rng.integers(1, 4)), float(rng.uniform(1e-3, 0.02)), None)
    t, d = refresh_kernel(c.base_target, c.target_logcorr, c.base_draft, c.draft_logcorr)
    np.testing.assert_allclose(t, _monotone_fast(c.base_target * np.exp(c.target_logcorr)), rtol=1e-13)
    np.testing.assert_allclose(d, _monotone_fast(c.base_draft * np.exp(c.draft_logcorr)), rtol=1e-13)
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


def test_the_step_overhead_line_is_kept_per_batch_size_bucket():
    """Time outside the passes grows with the batch. Steps of 8 passes at batch 32 (no spread in
    the passes) then steps of 0 or 1 pass at batch 64 fitted, in one line, a slope near 0; each
    bucket of batch sizes now has its own line, which starts from the one in use."""
    c = make_profiled()
    args = (24, 2000, c.target_time(24, 2000), 8, 0, 0.0)
    for _ in range(60):  # batch 32: 8 passes every step, 3 ms outside them
        c.observe(*args, overhead_s=3e-3, overhead_passes=8, batch_size=32)
    line32 = (c.step_overhead_s, c.pass_overhead_s)
    assert c.step_overhead_s + 8 * c.pass_overhead_s == pytest.approx(3e-3, rel=0.01)
    rng = np.random.default_rng(1)
    for i in range(200):  # batch 64: 2 ms, plus 1.2 ms when it drafts (one pass), one step in 16 without
        p = int(i % 16 != 0)
        c.observe(*args, overhead_s=2e-3 + 1.2e-3 * p + rng.uniform(-1e-4, 1e-4), overhead_passes=p, batch_size=64)
    assert c.pass_overhead_s == pytest.approx(1.2e-3, rel=0.15) and c.step_overhead_s == pytest.approx(2e-3, rel=0.1)
    line64 = (c.step_overhead_s, c.pass_overhead_s)
    c.observe(*args, overhead_s=3e-3, overhead_passes=8, batch_size=33)  # same bucket as 32: its line comes back
    assert c.step_overhead_s + 8 * c.pass_overhead_s == pytest.approx(3e-3, rel=0.01)
    assert c.pass_overhead_s == pytest.approx(line32[1], abs=1e-12)
    back = CostModel.from_dict(c.to_dict())
    back.observe(*args, overhead_s=line64[0] + line64[1], overhead_passes=1, batch_size=100)
    c.observe(*args, overhead_s=line64[0] + line64[1], overhead_passes=1, batch_size=100)
    assert (back.step_overhead_s, back.pass_overhead_s) == (c.step_overhead_s, c.pass_overhead_s)
    assert c.pass_overhead_s == pytest.approx(line64[1], rel=0.05)
