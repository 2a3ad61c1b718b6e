"""dspark's plain spells by hand: after plans of nothing it stops planning for 1, 2, 4, ...
SPELL_MAX steps, live only; a drafting plan, a new batch, a closing run or a due try plans again."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from specdepth.policies.dspark import DSpark
from specdepth.policies.dspark_gates import PROBE_EVERY
from specdepth.policies.dspark_spell import SPELL_MAX
from specdepth.policies.testing import LinearCost, make_plan_ctx

SATURATED = LinearCost(target_s=0.020, draft_s=0.030)  # a draft pass dearer than the step: plans nothing


def planned_steps(policy: DSpark, steps: int, learns: bool = True, ids_at=lambda step: [0, 1, 2, 3],
                  closing_from: int | None = None) -> list[int]:
    """The steps whose plan read the priors (were planned), of `steps` plain ones."""
    out = []
    for step in range(steps):
        ids = np.asarray(ids_at(step), np.int64)
        read = []
        prior = np.full((len(ids), 8), 0.8)
        ctx = replace(make_plan_ctx(len(ids), step=step, seq_ids=ids, cost=SATURATED), cost_learns=learns,
                      priors=lambda prior=prior: read.append(1) or prior,
                      closing=None if closing_from is None or step < closing_from else np.full(len(ids), 50))
        assert not policy.plan(ctx).any()
        if read:
            out.append(step)
    return out


def test_plans_of_nothing_space_out_to_spell_max_live_only():
    first = planned_steps(DSpark(probe=False), 80)
    gaps = np.diff(first).tolist()
    assert first[:6] == [0, 2, 5, 10, 19, 36] and gaps[4:] == [SPELL_MAX + 1] * len(gaps[4:])
    assert planned_steps(DSpark(probe=False), 40, learns=False) == list(range(40))  # a replay plans every step
    assert planned_steps(DSpark(probe=False, spell=False), 40) == list(range(40))  # the ablation


def test_a_new_batch_or_a_closing_run_plans_at_once():
    changed = planned_steps(DSpark(probe=False), 40, ids_at=lambda step: [0, 1, 2, 3 + step // 13])
    assert 13 in changed and 26 in changed and 39 in changed  # a newcomer: planned the step it joins
    closing = planned_steps(DSpark(probe=False), 40, closing_from=23)
    assert 23 in closing and 23 not in planned_steps(DSpark(probe=False), 40)
    # a closing run makes no tries: nothing due ends its spells (with probes and tries on)
    assert len(planned_steps(DSpark(), 80, closing_from=0)) == len(planned_steps(DSpark(probe=False), 80)) < 12


def test_a_spell_counts_toward_tries_and_a_due_try_ends_it():
    """A plan of nothing tries one position now and then (policies/dspark_gates.py): the steps of
    a spell count as plans of nothing, so the try comes at the same step as without spells (the
    same batch throughout: due at PROBE_EVERY - 1, held PROBE_EVERY plans for a newcomer)."""
    def first_try(policy: DSpark) -> tuple[int, int]:
        for step in range(4 * PROBE_EVERY):
            ctx = replace(make_plan_ctx(4, step=step, prior_conf=0.8, cost=SATURATED), cost_learns=True)
            if policy.plan(ctx).any():
                return step, policy._spell.skipped
        return -1, policy._spell.skipped

    spelled, plain = first_try(DSpark()), first_try(DSpark(spell=False))
    assert spelled[0] == plain[0] == 2 * PROBE_EVERY - 1
    assert spelled[1] > 0 and plain[1] == 0  # the spells skipped plans on the way
