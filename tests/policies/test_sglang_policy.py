"""sglang-adaptive: EMA of accepted drafts, warm-up, update interval and hysteresis, per batch size."""

from __future__ import annotations

import pytest

from specdepth.policies.sglang import SglangAdaptive, parse_slots
from specdepth.policies.testing import make_outcome, make_plan_ctx


def feed(p: SglangAdaptive, accepted: int, batches: int, batch_size: int = 2) -> list[int]:
    """Observe `batches` steps where every sequence accepted `accepted`; depth after each."""
    depths = []
    for _ in range(batches):
        p.observe(make_outcome(accepted=[accepted] * batch_size, verified=[7] * batch_size))
        depths.append(int(p.plan(make_plan_ctx(batch_size, max_depth=16))[0]))
    return depths


def test_starts_at_initial_with_neutral_ema() -> None:
    p = SglangAdaptive()
    assert p.plan(make_plan_ctx(2)).tolist() == [3, 3]
    assert p.slot(2).ema == 2.0 and p.slot(2).candidates == [1, 3, 7]


def test_steps_up_only_at_decision_points() -> None:
    p = SglangAdaptive()
    depths = feed(p, accepted=3, batches=15)
    # ema = 3 - 0.8^n passes the rise threshold 3 - 0.5 + 0 = 2.5 at n = 4, but the first decision
    # is after warm-up (10) plus one interval (5): batch 15.
    assert p.slot(2).ema == pytest.approx(3 - 0.8**15)
    assert depths == [3] * 14 + [7]


def test_steps_down_with_hysteresis() -> None:
    p = SglangAdaptive()
    feed(p, accepted=3, batches=15)  # at 7
    depths = feed(p, accepted=1, batches=10)  # batches 16..25
    # at batch 20 ema = 1 + 1.965 * 0.8^5 = 1.64 <= 3 - 0.5 - 0.25: down to 3 (one candidate: the
    # next one down needs ema <= 1 - 0.75); at batch 25 ema = 1.21 stays in [0.25, 2.5]: hold.
    assert depths == [7] * 4 + [3] * 6
    depths = feed(p, accepted=0, batches=20)
    assert depths[-1] == 1


def test_no_change_inside_the_dead_zone() -> None:
    # ema stays at 2: below the rise threshold 3 - 0.5 = 2.5, above the drop threshold 1 - 0.75
    p = SglangAdaptive(warmup=0, interval=1)
    assert feed(p, accepted=2, batches=40) == [3] * 40


def test_batch_size_ranges_keep_their_own_state() -> None:
    p = SglangAdaptive()
    feed(p, accepted=3, batches=15, batch_size=2)  # small-batch slot goes to 7
    assert p.plan(make_plan_ctx(2, max_depth=16)).tolist() == [7, 7]
    big = p.plan(make_plan_ctx(100, max_depth=16))
    assert big.tolist() == [3] * 100  # the [64, 128) slot is untouched
    assert p.slot(100).candidates == [1, 2, 3, 5]  # initial 3 added to 1/2/5, as SGLang does
    assert p.slot(130) is not p.slot(100)


def test_capped_by_max_depth() -> None:
    p = SglangAdaptive()
    feed(p, accepted=3, batches=15)
    assert p.plan(make_plan_ctx(2, max_depth=4)).tolist() == [4, 4]


@pytest.mark.parametrize("slots", ["2:1+3:0:0", "1:1+3:0:0/1:1+2:0:0", "1:1:0:0", "1:1+3:0", "1:a+3:0:0"])
def test_slot_validation(slots: str) -> None:
    with pytest.raises(ValueError, match="sglang-adaptive"):
        parse_slots(slots, initial=1)
