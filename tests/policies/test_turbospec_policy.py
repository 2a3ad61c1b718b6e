"""turbospec: alpha EMA, goodput argmax with k = 0 favoured, recomputed every 20 plans."""

from __future__ import annotations

import pytest

from specdepth.policies.testing import LinearCost, make_outcome, make_plan_ctx
from specdepth.policies.turbospec import TurboSpec, expected_emitted


def test_expected_emitted_matches_leviathan() -> None:
    assert expected_emitted(0.5, 0) == 1.0
    assert expected_emitted(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_emitted(1.0, 3) == 4.0


def test_alpha_ema_numbers() -> None:
    p = TurboSpec()
    assert p.alpha == 0.7
    # rates 2/4 and 0/2; the third sequence verified nothing and is left out: mean 0.25.
    p.observe(make_outcome(accepted=[2, 0, 0], verified=[4, 2, 0]))
    assert p.alpha == pytest.approx(0.85 * 0.7 + 0.15 * 0.25)  # 0.6325
    p.observe(make_outcome(accepted=[3], verified=[3]))
    assert p.alpha == pytest.approx(0.85 * 0.6325 + 0.15 * 1.0)  # 0.687625
    p.observe(make_outcome(accepted=[0], verified=[0]))  # nothing verified: unchanged
    assert p.alpha == pytest.approx(0.687625)


def test_k_is_the_goodput_argmax() -> None:
    cost = LinearCost(target_s=0.020, draft_s=0.002, target_per_token_s=0.0005)
    ctx = make_plan_ctx(4, max_depth=8, cost=cost)
    p = TurboSpec(alpha_init=0.7)
    # time(k) = k * 0.002 + 0.020 + 0.0005 * 4 * (k + 1); goodput(k) = 4 * E[emitted](k) / time(k)
    expect = [4 * expected_emitted(0.7, k) / (k * 0.002 + 0.020 + 0.002 * (k + 1)) for k in range(9)]
    expect[0] *= 1.1
    best = max(range(9), key=lambda k: expect[k])
    assert p.scores(ctx) == pytest.approx(expect)
    assert p.plan(ctx).tolist() == [best] * 4
    assert 0 < best < 8


def test_k_zero_is_favoured_by_ten_percent() -> None:
    # k = 1 emits 1.05 tokens per sequence for the same step time as k = 0: +5% < +10%.
    ctx = make_plan_ctx(2, max_depth=1, cost=LinearCost(target_s=0.020, draft_s=0.0))
    assert TurboSpec(alpha_init=0.05).plan(ctx).tolist() == [0, 0]
    assert TurboSpec(alpha_init=0.05, k0_bias=1.0).plan(ctx).tolist() == [1, 1]


def test_saturated_batch_turns_speculation_off() -> None:
    cost = LinearCost(target_s=0.0, draft_s=0.001, target_per_token_s=0.001)  # no free compute
    assert TurboSpec().plan(make_plan_ctx(64, cost=cost)).tolist() == [0] * 64


def test_k_is_recomputed_every_twenty_plans() -> None:
    ctx = make_plan_ctx(1, max_depth=8, cost=LinearCost(target_s=0.020, draft_s=0.001))
    p = TurboSpec(alpha_init=0.95)
    k_high = int(p.plan(ctx)[0])  # plan 1 computes
    for _ in range(10):
        p.observe(make_outcome(accepted=[0], verified=[4]))  # alpha collapses
    k_low = int(TurboSpec(alpha_init=p.alpha).plan(ctx)[0])
    assert k_low < k_high
    for _ in range(19):  # plans 2..20 reuse the cached k
        assert int(p.plan(ctx)[0]) == k_high
    assert int(p.plan(ctx)[0]) == k_low  # plan 21 recomputes
