"""bandit: UCB1 over k in {1, 2, 3, 4} with goodput rewards normalised by their running max."""

from __future__ import annotations

import pytest

from specdepth.policies.bandit import Bandit, parse_depths
from specdepth.policies.testing import make_outcome, make_plan_ctx

# relative goodput of arms k = 1, 2, 3, 4: k = 3 is best
REWARD = {1: 0.5, 2: 0.6, 3: 1.0, 4: 0.7}


def run(p: Bandit, steps: int, scale: float = 100.0) -> list[int]:
    """Pull `steps` times; a step of arm k emits 10 tokens in 10 / (scale * REWARD[k]) seconds."""
    pulled = []
    for _ in range(steps):
        k = int(p.plan(make_plan_ctx(2))[0])
        pulled.append(k)
        p.observe(make_outcome(accepted=[4, 4], verified=[k, k], step_time_s=10 / (scale * REWARD[k])))
    return pulled


def test_pulls_each_arm_once_then_exploits_then_explores() -> None:
    # pull 5: every arm has n = 1, so the best mean wins (k = 3).
    # pull 6 (t = 5): k=3: 1.0 + sqrt(2 ln 5 / 2) = 2.269; k=4: 0.7 + sqrt(2 ln 5) = 2.494 -> k = 4.
    assert run(Bandit(), 6) == [1, 2, 3, 4, 3, 4]


def test_exploits_the_best_arm_most() -> None:
    pulled = run(Bandit(), 300)
    counts = {k: pulled.count(k) for k in REWARD}
    assert max(counts, key=counts.get) == 3
    assert all(counts[k] >= 2 for k in REWARD)  # UCB keeps exploring, a little
    assert run(Bandit(c=0.0), 10)[4:] == [3] * 6  # no exploration bonus: pure exploitation


def test_reward_scale_does_not_change_decisions() -> None:
    # normalised by the running max, so tokens/s in any unit gives the same pulls
    assert run(Bandit(), 50, scale=1.0) == run(Bandit(), 50, scale=1e6)


def test_arms_capped_by_max_depth_and_parsed() -> None:
    p = Bandit(arms="2/6")
    assert p.plan(make_plan_ctx(3, max_depth=4)).tolist() == [2, 2, 2]
    p.observe(make_outcome(accepted=[1, 1, 1], verified=[2, 2, 2]))
    assert p.plan(make_plan_ctx(3, max_depth=4)).tolist() == [4, 4, 4]  # arm 6, capped
    assert parse_depths("1/2/3/4", "bandit") == (1, 2, 3, 4)
    with pytest.raises(ValueError):
        parse_depths("1/1", "bandit")
    with pytest.raises(ValueError):
        Bandit(arms="a/b")


def test_observe_without_plan_is_ignored() -> None:
    p = Bandit()
    p.observe(make_outcome(accepted=[1], verified=[1]))
    assert int(p.plan(make_plan_ctx(1))[0]) == 1  # still pulling arm 1 first
