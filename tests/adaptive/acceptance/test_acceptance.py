"""Acceptance learning: calibration on synthetic data, the observation rule, per-sequence history,
pooling across replicas, determinism and causality."""

from __future__ import annotations

import numpy as np
import pytest

from specdepth.adaptive.acceptance import kernels_reference as ref_np
from specdepth.adaptive.acceptance.model import (CAT, EPS, H_EDGES, Z_EDGES, AcceptanceConfig, AcceptanceModel,
                                           calibration_error)
from specdepth.adaptive.acceptance.config import IDENTITY, _clip, _logit, _sigmoid, refit_interval
from specdepth.adaptive.acceptance.kernels import calibrate_kernel, fit_position_kernel, last_category


def synthetic_step(rng: np.random.Generator, ids: np.ndarray, J: int = 6, power: float = 2.0,
                   boost: np.ndarray | None = None):
    """One step in which every sequence verifies J positions; true c_j = top1_j ** power
    (times `boost` per sequence, clipped)."""
    B = len(ids)
    top1 = rng.beta(3.0, 1.2, size=(B, J)).clip(0.02, 0.999)
    entropy = (1 - top1) * 3.0 * rng.uniform(0.5, 1.5, size=(B, J))
    p = top1 ** power
    if boost is not None:
        p = np.clip(p * boost[:, None], 0, 1)
    ok = rng.random((B, J)) < p  # (B, J) accepted given its prefix
    accepted = np.where(ok.all(1), J, np.argmin(ok, 1))
    return top1, entropy, np.full(B, J), accepted


def feed(model: AcceptanceModel, rng: np.random.Generator, steps: int, id0: int = 0, B: int = 64,
         **kw) -> None:
    for s in range(steps):
        ids = id0 + np.arange(B) + B * (s // 20)  # a new cohort of requests every 20 steps
        model.observe(ids, *synthetic_step(rng, ids, **kw))


def test_fresh_model_is_identity():
    m = AcceptanceModel()
    top1 = np.array([[0.9, 0.5, 0.1, 0.0]])
    np.testing.assert_allclose(m.calibrate([7], top1, np.ones_like(top1)), [[0.9, 0.5, 0.1, 0.0]], atol=1e-6)
    assert np.isnan(m.ece())


def test_learns_calibration_of_squared_top1():
    rng = np.random.default_rng(0)
    m = AcceptanceModel()
    feed(m, rng, 300)
    m.reset_metrics()
    feed(m, rng, 100, id0=10**6)  # evaluate prequentially on fresh requests
    assert m.ece(raw=True) > 0.1  # raw top1 overpredicts survival
    assert m.ece() < 0.03
    assert m.brier() < m.brier(raw=True)


def test_calibration_error_function_matches_definition():
    pred = np.array([0.05, 0.05, 0.95, 0.95])
    assert calibration_error(pred, np.array([0, 0, 1, 1])) == pytest.approx(0.05)
    assert calibration_error(pred, np.array([1, 1, 0, 0])) == pytest.approx(0.95)


@pytest.mark.parametrize("d,a,n_expect,acc_expect", [
    (4, 1, [1, 1, 0, 0], [1, 0, 0, 0]),  # accepted 1, rejected at 2; 3 and 4 not observations
    (3, 3, [1, 1, 1, 0], [1, 1, 1, 0]),  # all verified accepted: no rejection seen
    (4, 0, [1, 0, 0, 0], [0, 0, 0, 0]),  # rejected at 1
    (0, 0, [0, 0, 0, 0], [0, 0, 0, 0]),  # nothing verified
])
def test_observe_counts_only_conditional_observations(d, a, n_expect, acc_expect):
    m = AcceptanceModel()
    top1 = np.full((1, 4), 0.7)
    m.observe([1], top1, np.ones((1, 4)), np.array([d]), np.array([a]))
    np.testing.assert_array_equal(m.cells[:4, :, 0].sum(1), n_expect)
    np.testing.assert_array_equal(m.cells[:4, :, 1].sum(1), acc_expect)
    # calibration pairs: every verified position, survival realised iff i <= a
    assert m.metrics[0, :, 0].sum() == d and m.metrics[0, :, 2].sum() == a


def test_observe_rejects_inconsistent_counts():
    m = AcceptanceModel()
    with pytest.raises(ValueError):
        m.observe([1], np.full((1, 3), 0.5), np.ones((1, 3)), np.array([2]), np.array([3]))
    with pytest.raises(ValueError):
        m.observe([1], np.full((1, 3), 0.5), np.ones((1, 3)), np.array([4]), np.array([0]))


def test_sequence_history_shrinks_toward_its_own_rate():
    rng = np.random.default_rng(1)
    m = AcceptanceModel()
    feed(m, rng, 60)
    top1 = np.full((1, 5), 0.6)
    for _ in range(30):  # sequence 5000 always accepts everything it verifies
        m.observe([5000], top1, np.ones((1, 5)), np.array([5]), np.array([5]))
        m.observe([6000], top1, np.ones((1, 5)), np.array([5]), np.array([0]))  # 6000 never does
    prior = m.prior_conf(np.array([5000, 6000, 99999]), 5)  # 99999: unknown -> global rates
    np.testing.assert_allclose(prior[2], m.plan_rates(5)[0])  # a fresh sequence: state 0
    assert np.all(prior[0] > prior[2]) and np.all(prior[1] < prior[2])
    conf = m.calibrate([5000, 6000, 99999], np.full((3, 5), 0.6), np.ones((3, 5)))
    assert np.all(conf[0] > conf[2]) and np.all(conf[1] < conf[2])
    m.forget([5000, 6000])
    np.testing.assert_allclose(m.prior_conf(np.array([5000, 6000]), 5), prior[[2, 2]])


def test_planning_rates_are_optimistic_until_the_data_is_in():
    """A fresh model plans with an optimistic rate, so a policy that would otherwise never draft
    gets observations; with plenty of data the bonus vanishes (DSpark at C = 64 was stuck at off
    in replay from a 0.5 start before this)."""
    m = AcceptanceModel()
    assert np.all(m.plan_rates(4)[:, 0] > 0.7) and np.all(m.rates(4) == 0.5)
    assert np.all(m.plan_rates(4)[:, 1:] == 0.5)  # only position 1, the door, is optimistic
    assert np.all(AcceptanceModel(AcceptanceConfig(optimism=0.0)).plan_rates(4) == 0.5)
    rng = np.random.default_rng(0)
    feed(m, rng, 400)
    m.fit()
    bonus = m.plan_rates(4) - m.state_rates[:, :4]
    most = int(np.argmax(m.state_n[:, 0]))  # the state with the most observations
    assert np.all(bonus[:, 0] > 0) and bonus[most].max() < 0.01, bonus


def test_merge_equals_one_model_fed_both_streams():
    cfg = AcceptanceConfig(refit_every=10**9, first_refit=10**9, cat_refresh=10**9)  # no refit mid-stream (see merge's docstring)
    a, b, both = AcceptanceModel(cfg), AcceptanceModel(cfg), AcceptanceModel(cfg)
    for model, seed_ids in ((a, 0), (b, 10**5)):
        for m, rng in ((model, np.random.default_rng(seed_ids)), (both, np.random.default_rng(seed_ids))):
            feed(m, rng, 40, id0=seed_ids, B=16)
    a.merge(b.state_dict())
    both.fit()
    np.testing.assert_allclose(a.cells, both.cells)
    np.testing.assert_allclose(a.weights, both.weights)
    ids = np.array([0, 5, 10**5 + 3, 777])
    top1 = np.random.default_rng(9).uniform(0.1, 0.99, size=(4, 6))
    np.testing.assert_allclose(a.calibrate(ids, top1, 1 - top1), both.calibrate(ids, top1, 1 - top1))
    np.testing.assert_allclose(a.prior_conf(ids, 6), both.prior_conf(ids, 6))
    assert a.ece() == pytest.approx(both.ece()) and a.brier() == pytest.approx(both.brier())


def test_state_dict_round_trip_and_determinism():
    m1, m2 = AcceptanceModel(), AcceptanceModel()
    feed(m1, np.random.default_rng(3), 30)
    feed(m2, np.random.default_rng(3), 30)
    back = AcceptanceModel()
    back.load_state_dict(m1.state_dict())
    ids, top1 = np.arange(64), np.random.default_rng(4).uniform(0.05, 1, size=(64, 6))
    for other in (m2, back):
        np.testing.assert_array_equal(m1.calibrate(ids, top1, 1 - top1), other.calibrate(ids, top1, 1 - top1))
        np.testing.assert_array_equal(m1.prior_conf(ids, 8), other.prior_conf(ids, 8))
    with pytest.raises(ValueError):
        AcceptanceModel(AcceptanceConfig(max_positions=4)).merge(m1.state_dict())


def test_calibrate_kernel_matches_the_numpy_formula():
    rng = np.random.default_rng(3)
    for B, J in ((1, 1), (1, 8), (16, 3), (64, 9)):
        top1 = rng.uniform(0, 1, (B, J))
        top1[rng.random((B, J)) < 0.2] = 0.0  # padding past a drafted length
        top1[0, 0] = 1.0  # clipped to 1 - EPS
        entropy = rng.uniform(-0.1, 5, (B, J))  # negative entropy is read as 0
        w = rng.normal(0, 3, (J, 4))
        shift = rng.normal(0, 2, B)
        first = rng.normal(0, 1, B)
        z = ref_np.linear(top1, entropy, w) + shift[:, None]
        z[:, 0] += first
        ref = np.where(top1 > 0, _sigmoid(z), 0.0)
        got = calibrate_kernel(top1, entropy, w, shift, first, EPS)
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-15)
        assert ((got == 0) == (top1 == 0)).all()
        # strided views (a policy's first j columns) give the same numbers
        np.testing.assert_allclose(calibrate_kernel(top1[:, :1], entropy[:, :1], w[:1], shift, first, EPS),
                                   ref[:, :1], rtol=1e-12, atol=1e-15)


def ragged_model(rng: np.random.Generator, config: AcceptanceConfig | None = None) -> AcceptanceModel:
    """A model that has observed 60 ragged steps of 12 of 40 known sequences (ids 0..39)."""
    m = AcceptanceModel(config) if config else AcceptanceModel()
    for _ in range(60):
        ids = rng.choice(40, 12, replace=False)
        top1 = rng.uniform(0.05, 1, (12, 8))
        d = rng.integers(0, 9, 12)
        a = np.minimum(d, rng.integers(0, 9, 12))
        top1[np.arange(8)[None, :] >= d[:, None]] = 0.0
        m.observe(ids, top1, 1 - top1, d, a)
    return m


def test_prior_conf_kernel_matches_the_numpy_formula():
    """`prior_conf` (compiled) against its numpy statement, on a model that has observed ragged
    steps of known sequences, with sequences it has never seen among them."""
    rng = np.random.default_rng(8)
    m = ragged_model(rng)
    ids = np.concatenate([rng.choice(40, 30, replace=False), [1000, 1001]])  # two never seen
    for K in (1, 8, 12):
        rows = m._rows(ids)
        state = np.where(rows >= 0, m.seq_stats[np.maximum(rows, 0), CAT], 0).astype(np.int64)
        ref = _sigmoid(_logit(m.plan_rates(K))[state] + ref_np.seq_shift(m, rows, (4, 5))[:, None])
        got = m.prior_conf(ids, K)
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-15)
        assert got.shape == (len(ids), K) and len(np.unique(state)) > 2  # several states met


def test_calibrate_matches_its_numpy_statement():
    """`calibrate` (the shifts and the confidences compiled) against numpy: the per-sequence shift
    `kernels_reference.seq_shift(m, rows, (2, 3))`, the category shift `cat_shift`, weights per
    column up to the last position with its own regression, on a model that has observed ragged
    steps; sequences never seen among them; repeated calls (the shifts cached within a step) give
    the same numbers."""
    rng = np.random.default_rng(11)
    m = ragged_model(rng, AcceptanceConfig(max_positions=4))
    ids = np.concatenate([rng.choice(40, 30, replace=False), [1000, 1001]])  # two never seen
    rows = m._rows(ids)
    for J in (1, 4, 7):
        top1 = rng.uniform(0, 1, (len(ids), J))
        top1[rng.random(top1.shape) < 0.2] = 0.0
        entropy = rng.uniform(0, 4, top1.shape)
        z = ref_np.linear(top1, entropy, m.weights[m._pos(J)]) + ref_np.seq_shift(m, rows, (2, 3))[:, None]
        z[:, 0] += ref_np.cat_shift(m, rows)
        ref = np.where(top1 > 0, _sigmoid(z), 0.0)
        got = m.calibrate(ids, top1, entropy)
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-15)
        np.testing.assert_array_equal(m.calibrate(ids, top1, entropy), got)
    assert (ref_np.cat_shift(m, rows) != 0).any() and (ref_np.seq_shift(m, rows, (2, 3)) != 0).any()


def reference_observe(m: AcceptanceModel, seq_ids, top1, entropy, d, a) -> None:
    """`AcceptanceModel.observe` written with numpy array calls (the implementation before its
    compiled kernel): the test's independent statement of the tallies."""
    B, J = top1.shape
    m._age_idle(seq_ids, d == 0)
    if not d.any():
        return
    i = np.arange(1, J + 1)[None, :]
    tested, y = i <= d[:, None], (i <= a[:, None]).astype(np.float64)
    counted = tested & (i <= a[:, None] + 1)
    for k, c in enumerate((m.calibrate(seq_ids, top1, entropy), _clip(top1, 0.0, 1.0))):
        s, r = np.cumprod(c, axis=1)[tested], y[tested]
        b = np.minimum((s * m.config.ece_bins).astype(np.int64), m.config.ece_bins - 1)
        np.add.at(m.metrics[k], b, np.stack([np.ones_like(s), s, r], 1))
        m.brier_sum[k] += ((s - r) ** 2).sum()
    g_conf = m._global_conf(top1, entropy)
    first_base = _sigmoid(ref_np.linear(top1[:, :1], entropy[:, :1], m.weights[:1])[:, 0] + m._seq_shift(seq_ids, (2, 3)))
    rows = [m._row_for(int(x)) for x in seq_ids]
    cat = m.seq_stats[rows, CAT].astype(np.int64)  # also the planning state
    g_rate = m.base_rates(J)[0][cat]
    w = counted.astype(np.float64)
    upd = np.stack([(w * y).sum(1), (w * (1 - y)).sum(1), (w * g_conf).sum(1), (w * (1 - g_conf)).sum(1),
                    (w * g_rate).sum(1), (w * (1 - g_rate)).sum(1)], 1)
    np.add.at(m.seq_stats[:, :CAT], rows, upd)
    m._shift_cache.clear()
    posj = np.broadcast_to(m._pos(J)[None, :], (B, J))
    np.add.at(m.state_counts, (np.broadcast_to(cat[:, None], (B, J))[counted], posj[counted]),
              np.stack([np.ones(int(counted.sum())), y[counted]], axis=1))
    first = d > 0  # position 1 verified: always a conditional observation
    np.add.at(m.cat_stats, cat[first], np.stack([np.ones(int(first.sum())), y[first, 0], first_base[first]], 1))
    m.seq_stats[rows, CAT] = [last_category(int(dd), int(aa)) if dd > 0 else c for dd, aa, c in zip(d, a, cat)]
    t, h = _clip(top1[counted], EPS, 1 - EPS), entropy[counted]
    cell = np.digitize(_logit(top1[counted]), Z_EDGES) * (len(H_EDGES) + 1) + np.digitize(h, H_EDGES)
    feats = np.stack([np.ones_like(t), y[counted], np.log(t), -np.log1p(-t), np.maximum(h, 0.0)], 1)
    np.add.at(m.cells, (posj[counted], cell), feats)
    m.since_fit += int(counted.sum())
    m.since_cat += int(counted.sum())
    if m.since_cat >= m.config.cat_refresh:
        m._refresh()
    if m.since_fit >= refit_interval(m.config, m.state_n.sum(0).max(initial=0)):
        m.fit()


def test_observe_kernel_matches_the_numpy_tallies():
    """Two models fed the same ragged steps (some rows verifying nothing, new cohorts, refits), one
    through `observe`, one through the numpy reference: every statistic and prediction agrees."""
    rng = np.random.default_rng(11)
    cfg = AcceptanceConfig(max_positions=4, refit_every=64, cat_refresh=48)
    fast, ref = AcceptanceModel(cfg), AcceptanceModel(cfg)
    for step in range(120):
        B, J = int(rng.integers(1, 9)), int(rng.integers(1, 8))
        ids = rng.choice(24, size=B, replace=False) + 100 * (step // 40)
        top1 = rng.uniform(0.0, 1.0, (B, J))
        top1[0, 0] = 1.0  # clipped
        entropy = rng.uniform(-0.1, 5.0, (B, J))
        d = rng.integers(0, J + 1, B)
        a = np.minimum(d, rng.integers(0, J + 1, B))
        fast.observe(ids, top1, entropy, d, a)
        reference_observe(ref, ids, top1, entropy, d, a)
        if step % 30 == 29:
            fast.forget(ids[:2])
            ref.forget(ids[:2])
    assert fast.since_fit == ref.since_fit and fast.cells[..., 0].sum() > 200
    assert (fast.cat_stats[:, 0] > 0).sum() >= 8
    for name in ("cells", "state_counts", "cat_stats", "cat_shift", "metrics", "brier_sum", "weights", "global_rates",
                 "state_rates"):
        np.testing.assert_allclose(getattr(fast, name), getattr(ref, name), rtol=1e-10, atol=1e-10, err_msg=name)
    ids = np.arange(24)
    np.testing.assert_allclose(fast.seq_stats[fast._rows(ids)], ref.seq_stats[ref._rows(ids)], rtol=1e-10, atol=1e-10)
    top1 = rng.uniform(0.05, 1, (24, 6))
    np.testing.assert_allclose(fast.calibrate(ids, top1, 1 - top1), ref.calibrate(ids, top1, 1 - top1), rtol=1e-9)
    np.testing.assert_allclose(fast.prior_conf(ids, 6), ref.prior_conf(ids, 6), rtol=1e-9)


def test_calibrate_is_causal_per_column():
    m = AcceptanceModel()
    feed(m, np.random.default_rng(5), 30)
    top1 = np.random.default_rng(6).uniform(0.05, 1, size=(8, 6))
    base = m.calibrate(np.arange(8), top1, 1 - top1)
    changed = top1.copy()
    changed[:, 3:] = 0.5  # later columns differ: earlier confidences must not
    np.testing.assert_array_equal(m.calibrate(np.arange(8), changed, 1 - top1)[:, :3], base[:, :3])


def test_an_idle_sequence_drifts_back_toward_the_prior():
    """A sequence whose history stopped its drafting must not be stuck there: each step it verifies
    nothing ages its evidence, so its prior returns toward the global one and it is tried again."""
    rng = np.random.default_rng(2)
    m = AcceptanceModel()
    feed(m, rng, 60)
    m.fit()
    top1 = np.full((1, 4), 0.6)
    for _ in range(6):
        m.observe([77], top1, np.ones((1, 4)), np.array([4]), np.array([0]))  # always rejected
    low = m.prior_conf(np.array([77]), 4)[0, 0]
    fresh = m.prior_conf(np.array([12345]), 4)[0, 0]
    assert low < fresh - 0.05
    for _ in range(15):  # the policy stops drafting it: nothing verified
        m.observe([77], np.zeros((1, 0)), np.zeros((1, 0)), np.array([0]), np.array([0]))
    back = m.prior_conf(np.array([77]), 4)[0, 0]
    assert back > low + 0.5 * (fresh - low)
    assert AcceptanceModel(AcceptanceConfig(idle_decay=1.0)).config.idle_decay == 1.0
    with pytest.raises(ValueError):
        AcceptanceConfig(idle_decay=0.0)


def test_a_sequence_without_a_streak_plans_with_the_population_rate():
    # state 0 (no verified step yet, or none last step) plans with the rate pooled over every state,
    # not a rate of its own that only drafting in state 0 would ever correct (a trap)
    from specdepth.adaptive.acceptance.model import AcceptanceModel
    m = AcceptanceModel()
    m.state_rates[:] = np.linspace(0.2, 0.9, len(m.state_rates))[:, None]
    m.state_n[:] = 100.0
    m.global_rates[:] = 0.7
    r, n = m.base_rates(4)
    assert np.allclose(r[0], 0.7) and np.allclose(r[1:, 0], m.state_rates[1:, 0])
    assert np.allclose(n[0], 100.0 * len(m.state_rates))
    unknown = m.prior_conf(np.array([12345]), 4)[0]
    assert unknown[0] > 0.7 and np.allclose(unknown[1:], 0.7)  # position 1 carries the optimism bonus


def test_position_one_learns_what_the_last_step_says():
    """Synthetic truth: position 1 is half as likely to be accepted after a step with a rejection,
    which the features do not show. The per-category shift (layer 3) calibrates position 1 in both
    cases; with the layer switched off (a huge prior strength) the global fit splits the difference."""
    def run(cat_strength: float) -> dict[bool, np.ndarray]:
        rng = np.random.default_rng(21)
        m = AcceptanceModel(AcceptanceConfig(cat_strength=cat_strength))
        ids, rejected = np.arange(32), np.zeros(32, bool)
        tally = {False: np.zeros(2), True: np.zeros(2)}  # after a rejection? -> sum predicted, sum accepted
        for step in range(400):
            J = int(rng.choice([1, 2, 4]))
            top1 = rng.beta(4.0, 1.5, size=(32, J)).clip(0.02, 0.99)
            p = top1.copy()
            p[:, 0] *= np.where(rejected, 0.5, 1.0)
            ok = rng.random((32, J)) < p
            a = np.where(ok.all(1), J, np.argmin(ok, 1))
            if step >= 300:  # held-out steps: prequential predictions
                c1 = m.calibrate(ids, top1, 1 - top1)[:, 0]
                for r in (False, True):
                    tally[r] += [c1[rejected == r].sum(), ok[rejected == r, 0].sum()]
            m.observe(ids, top1, 1 - top1, np.full(32, J), a)
            rejected = a < J
        return {r: t / (rejected.size * 100) for r, t in tally.items()}
    on, off = run(64.0), run(1e12)
    for r in (False, True):
        gap_on = on[r][0] / on[r][1] - 1  # relative: predicted / realised - 1
        assert abs(gap_on) < 0.06, (r, on[r])
    assert off[True][0] / off[True][1] - 1 > 0.2  # after a rejection: over-predicted without the layer
    assert off[False][0] / off[False][1] - 1 < -0.2


def test_planning_rates_tell_a_short_full_acceptance_from_a_long_one():
    """Synthetic truth: position 1 is accepted 0.9 of the time after a fully accepted step of 8
    and 0.6 after one of 1. A warm-up of 8-deep steps teaches the first; then 1-deep steps arrive
    and, well before the next fit, the planning prior after a full acceptance of 1 is ~0.6 while
    after one of 8 it stays ~0.9 (one "all accepted" state pooled them at the warm-up's rate)."""
    rng = np.random.default_rng(3)
    m = AcceptanceModel()
    top1, ent = np.full((32, 8), 0.7), np.ones((32, 8))

    def step(ids: np.ndarray, depth: int) -> None:
        prev = m.seq_stats[m._rows(ids), CAT] if len(m._seq_row) else np.zeros(len(ids))
        p1 = np.where(prev == last_category(8, 8), 0.9, np.where(prev == last_category(1, 1), 0.6, 0.75))
        ok = rng.random((len(ids), depth)) < np.column_stack([p1] + [np.full(len(ids), 0.8)] * (depth - 1))
        acc = np.where(ok.all(1), depth, ok.argmin(1))
        m.observe(ids, top1[:, :depth], ent[:, :depth], np.full(len(ids), depth), acc)

    ids = np.arange(32)
    for _ in range(300):
        step(ids, 8)
    m.fit()
    fit_at = m.since_fit
    for _ in range(60):
        step(ids, 1)
    assert m.since_fit > fit_at and m.state_n.sum() > 0  # no fit since: the refreshes did it
    rates = m.base_rates(8)[0]
    assert abs(rates[last_category(1, 1), 0] - 0.6) < 0.06, rates[:, 0]
    assert abs(rates[last_category(8, 8), 0] - 0.9) < 0.06, rates[:, 0]
    prior = m.prior_conf(ids, 8)[:, 0]
    after_one = m.seq_stats[m._rows(ids), CAT] == last_category(1, 1)
    assert after_one.any() and prior[after_one].mean() < 0.7


def test_a_state_without_per_category_counts_still_gives_the_global_rates() -> None:
    """An older state (three planning states) loads: its counts pool into state 0, so the global
    rates, which the planning states' totals give, still describe all of its data."""
    rng = np.random.default_rng(5)
    m = AcceptanceModel()
    feed(m, rng, 80)
    m.fit()
    st = m.state_dict()
    st["state_counts"] = np.zeros((3, *st["state_counts"].shape[1:]))
    old = AcceptanceModel()
    old.load_state_dict(st)
    old.fit()
    np.testing.assert_allclose(old.global_rates, m.global_rates, rtol=1e-12)
    np.testing.assert_allclose(old.state_counts.sum(0), m.state_counts.sum(0), rtol=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_fit_position_kernel_matches_its_numpy_statement(seed):
    """The compiled Newton fit gives the numpy statements' weights (to rounding: BLAS and the
    compiled loops sum in their own orders) from the binned statistics of real observations."""
    m = AcceptanceModel(AcceptanceConfig(refit_every=10**9, first_refit=10**9))
    feed(m, np.random.default_rng(seed), 40, J=4)
    cfg = m.config
    for p in range(4):
        prior = m.weights[p - 1] if p else IDENTITY
        for start in (m.weights[p], IDENTITY):
            want = ref_np.fit_position(m.cells[p], prior, start, cfg.ridge, cfg.newton_steps)
            got = fit_position_kernel(m.cells[p], prior, start, cfg.ridge, cfg.newton_steps, EPS)
            assert np.allclose(got, want, rtol=1e-9, atol=1e-12)
    assert np.array_equal(fit_position_kernel(np.zeros_like(m.cells[0]), IDENTITY, IDENTITY, 1.0, 8, EPS)[:2],
                          IDENTITY[:2])  # no data: the prior's pull keeps the identity


def test_warm_up_builds_the_refit_kernel_a_fit_calls(monkeypatch):
    """The warm-up calls the refit kernel with the argument types a fit passes it (the compiled
    signature a run's first refit would otherwise build), and leaves the model as it was."""
    import numba
    import specdepth.adaptive.acceptance.model as model_mod
    seen = []
    real = model_mod.fit_position_kernel
    monkeypatch.setattr(model_mod, "fit_position_kernel",
                        lambda *a: seen.append(tuple(numba.typeof(x) for x in a)) or real(*a))
    m = AcceptanceModel(AcceptanceConfig(refit_every=10**9, first_refit=10**9))
    feed(m, np.random.default_rng(5), 20, J=2)
    before = m.state_dict()
    m.warm_up()
    after = m.state_dict()
    assert len(seen) == 1
    assert all(np.array_equal(after[k], v) if isinstance(v, np.ndarray) else after[k] == v for k, v in before.items())
    m.fit()
    assert len(seen) > 1 and set(seen) == {seen[0]}


def test_a_position_no_draft_reached_takes_its_prior_without_a_fit(monkeypatch):
    """Drafts of at most J positions leave positions J + 1.. without data: their MAP fit is the
    prior (the deepest fitted position's weights), taken as it is; the Newton steps run only
    where there is data."""
    m = AcceptanceModel(AcceptanceConfig(refit_every=10**9, first_refit=10**9))
    feed(m, np.random.default_rng(3), 30, J=3)
    fitted = []
    real = AcceptanceModel._fit_position
    monkeypatch.setattr(AcceptanceModel, "_fit_position",
                        lambda self, cells, prior, w: fitted.append(1) or real(self, cells, prior, w))
    m.fit()
    assert len(fitted) == 3 < m.config.max_positions
    assert np.array_equal(m.weights[3:], np.tile(m.weights[2], (m.config.max_positions - 3, 1)))
    assert not np.array_equal(m.weights[2], m.weights[1])  # the fitted ones moved on their own data
