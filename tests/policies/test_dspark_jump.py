"""dspark's jump, by hand: the extra time of a step that verifies any draft over a plain one,
measured on the run's steps; a model-free draft verified only where it pays for it, and a plan
whose draft verify refused counted as a plan of nothing for the spells."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest

from specdepth.policies.dspark import DSpark
from specdepth.policies.dspark_jump import JUMP_EVIDENCE, PRIOR_STEPS, Jump
from specdepth.policies.testing import LinearCost, make_outcome, make_plan_ctx, make_verify_ctx

B = 16


@dataclass(frozen=True)
class FreeLinearCost(LinearCost):
    """A model-free drafter's cost (`FreeDraftCost`'s interface): no draft pass, proposing free."""

    def drafting_s(self, batch_size: int) -> float:
        return 0.0


COST = FreeLinearCost(target_s=0.010, draft_s=0.0, target_per_token_s=0.0001)  # 0.1 ms a step token


def feed(jump: Jump, steps: list[tuple[int, float, float]], batch: int = B) -> None:
    """Steps (N, priced seconds, whole seconds), in order; each is learned at the next one."""
    for step, (n, priced, _) in enumerate(steps + [(batch, 0.0, 0.0)]):
        prev = steps[step - 1][2] if step > 0 else 0.0
        jump.observe(step, batch, n, priced, prev)


def test_the_jump_is_the_near_steps_residual_over_the_plain_steps():
    jump = Jump()
    plain, near = (B, 0.0116, 0.0126), (B + 2, 0.0118, 0.0148)  # residuals 1.0 ms and 3.0 ms
    feed(jump, [plain] * JUMP_EVIDENCE + [near] * (JUMP_EVIDENCE - 1))
    assert jump.seconds(B) == 0.0  # not priced before both sides have their evidence
    feed(jump, [plain] * JUMP_EVIDENCE + [near] * JUMP_EVIDENCE)
    assert abs(jump.seconds(B) - 0.002) < 1e-9
    assert jump.seconds(B // 2) == jump.seconds(4 * B) == 0.0  # per batch-size bucket
    far = Jump()  # steps far from plain (priced < 0) teach nothing
    feed(far, [plain] * JUMP_EVIDENCE + [(4 * B, -1.0, 0.030)] * 8)
    assert far.seconds(B) == 0.0


@dataclass(frozen=True)
class ProfiledJumpCost(FreeLinearCost):
    """A model-free drafter's cost whose profile knows the jump (`CostModel.jump_s`)."""

    jump: float = 0.002

    def jump_s(self, batch_size: int, context_tokens: int = 0) -> float:
        return self.jump


def test_the_profiled_jump_prices_the_first_steps_and_then_weighs_as_prior_steps():
    jump = Jump()
    assert jump.seconds(B, 0.004) == 0.004 and jump.seconds(B) == 0.0  # nothing measured: the profile's
    plain, near = (B, 0.0116, 0.0126), (B + 2, 0.0118, 0.0148)  # measured: 2 ms
    feed(jump, [plain] * JUMP_EVIDENCE + [near] * JUMP_EVIDENCE)
    n = JUMP_EVIDENCE
    assert jump.seconds(B, 0.004) == pytest.approx((PRIOR_STEPS * 0.004 + n * 0.002) / (PRIOR_STEPS + n))
    assert jump.seconds(B) == pytest.approx(0.002)  # no profile: as measured


def test_a_profiled_jump_refuses_a_small_model_free_draft_from_the_first_step():
    one = [[0.6]] + [[]] * (B - 1)
    assert not verified(DSpark(jump=True), one, cost=ProfiledJumpCost()).any()  # nothing measured yet
    assert verified(DSpark(jump=True), one, cost=ProfiledJumpCost(jump=0.0)).tolist() == [1] + [0] * (B - 1)
    assert verified(DSpark(jump=True), [[0.9] * 8] * B, cost=ProfiledJumpCost()).tolist() == [8] * B


def primed(policy: DSpark, seconds: float = 0.002) -> DSpark:
    feed(policy._jump, [(B, 0.0116, 0.0116)] * JUMP_EVIDENCE + [(B + 1, 0.0117, 0.0117 + seconds)] * JUMP_EVIDENCE)
    assert abs(policy._jump.seconds(B) - seconds) < 1e-9
    return policy


def verified(policy: DSpark, conf: list[list[float]], cost=COST, step: int = 5) -> np.ndarray:
    """The verify lengths of a draft with these confidences, asked once after a live plan."""
    ctx = replace(make_plan_ctx(B, step=step, prior_conf=0.95, cost=cost), cost_learns=True)
    assert policy.plan(ctx).any()
    return policy.verify(make_verify_ctx(conf, cost=cost, step=step))


def test_a_model_free_draft_is_verified_only_where_it_pays_for_the_jump():
    one = [[0.6]] + [[]] * (B - 1)  # one row, one position at 0.6: worth a plain 0.1 ms token, not a 2 ms jump
    deep = [[0.9] * 8] * B  # every row eight deep: worth it
    assert verified(DSpark(jump=True), one).tolist() == [1] + [0] * (B - 1)  # no jump measured yet
    assert not verified(primed(DSpark(jump=True)), one).any()
    assert verified(primed(DSpark(jump=True)), deep).tolist() == [8] * B
    assert verified(primed(DSpark(jump=False)), one)[0] == 1  # the ablation
    # a model's draft is asked column by column: its later columns must not decide its first
    assert verified(primed(DSpark(jump=True)), one, cost=LinearCost(0.010, 0.0, 0.0001)).tolist()[0] == 1


def test_a_draft_verify_refused_is_a_plan_of_nothing_for_the_spells():
    """Plans that draft, and whose drafts verify admits none of: planned at 0, 2, 5, 10, ...
    as plans of nothing are; where some of it is verified, every step plans."""
    def planned(refused: bool, jump: bool = True) -> list[int]:
        policy, out = DSpark(probe=False, jump=jump), []
        for step in range(24):
            ctx = replace(make_plan_ctx(4, step=step, prior_conf=0.95, cost=COST), cost_learns=True)
            budgets = policy.plan(ctx)
            if budgets.any():
                out.append(step)
            drafted = np.minimum(budgets, 2)
            ver = np.zeros(4, np.int64) if refused else drafted
            policy.observe(make_outcome(np.zeros(4, np.int64), ver, step=step, budgets=budgets, drafted=drafted))
        return out

    assert planned(refused=True)[:4] == [0, 2, 5, 10]
    assert planned(refused=False) == list(range(24))
    assert planned(refused=True, jump=False) == list(range(24))  # the default: no jump, no such spell
