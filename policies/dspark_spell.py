"""dspark's plain spells: where the plan keeps drafting nothing, stop asking it every step.

A batch past the compute knee plans nothing step after step, and each plan (priors, step prices,
the allocation) costs ~0.3 ms of host time at batch 16 to 64 on the CPU pair, 3% of a plain step
that `off` does not pay. After a plan that drafts nothing, the next 1, 2, 4, ... SPELL_MAX steps
are plain without a plan; a plan that drafts ends the spell (with dspark's `jump`, unless `verify`
then admits none of its draft: the step was plain after all). A spell also ends where the batch
changes (a sequence joins or leaves), or the run starts closing: those are what make a plan
change its mind between steps.

A skipped plan counts as a plan of nothing for the tries' spacing (policies/dspark_gates.py), and
a due try ends the spell, unless it is held: waiting for a newcomer, or on a catch-up that costs
more than a step (`Spacing.count_unless_due`). Only where the cost model learns (live): a replay
plans every step, and stays exact.
"""

from __future__ import annotations

import numpy as np

from specdepth.policies.base import PlanContext

SPELL_MAX = 16  # steps without a plan, at most, between two plans that draft nothing


class Spell:
    def __init__(self) -> None:
        self.until = -1  # the first step that plans again
        self.length = 0  # the current spell's length (0: none)
        self.before = 0  # the length before the last plan that drafted ended it
        self.closing = False  # whether the run was closing at the last plan
        self.ids = np.zeros(0, np.int64)  # (B,) the batch at the last plan
        self.skipped = 0  # plans skipped, over the run (counted by the policy)

    def holds(self, ctx: PlanContext) -> bool:
        """Whether `ctx`'s step is plain without a plan."""
        return self.length > 0 and ctx.step < self.until and (ctx.closing is not None) == self.closing \
            and np.array_equal(ctx.seq_ids, self.ids)

    def planned(self, ctx: PlanContext, drafts: bool) -> None:
        """A plan was made at `ctx`'s step; `drafts`: it drafts for some sequence."""
        self.before = self.length
        self.length = 0 if drafts else min(max(2 * self.length, 1), SPELL_MAX)
        self.until = ctx.step + 1 + self.length
        self.closing, self.ids = ctx.closing is not None, ctx.seq_ids

    def verified_nothing(self, ctx: PlanContext) -> None:
        """The plan at `ctx`'s step drafted, and verify admitted none of it: as a plan of nothing."""
        self.length = self.before
        self.planned(ctx, False)
