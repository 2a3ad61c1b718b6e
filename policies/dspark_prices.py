"""What a step costs, as dspark prices it: the step's time table and the draft's catch-up.

`StepPrices` prices a step once, shared by plan, keep_drafting and verify: the cost model is fixed
within a step (the controller refines it in `observe`). `DraftLag` follows how far each sequence's
draft cache has fallen behind, so that a plan drafting after a spell without drafts pays the first
pass's catch-up on the tokens committed since.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from specdepth.policies.base import PlanContext, StepCost, StepOutcome

CATCH_UP_USUAL = 2  # draft-cache lag (tokens) of a sequence that drafted last step: priced in every pass
# a catch-up past it buys every later drafting step the usual lag, so a plan is priced 1 / this of it
CATCH_UP_STEPS = 16


class StepPrices:
    """One step's target times by step tokens and its draft pass, from the cost model. The numbers
    are the cost model's own, element for element, so sharing them changes no answer.

    Args:
        step: the step priced.
        cost: the step's cost model.
        context: KV tokens in the batch.
        n: sequences in the batch (B).
        max_depth: the deepest draft the table must cover (B (max_depth + 1) step tokens).
    """

    def __init__(self, step: int, cost: StepCost, context: int, n: int, max_depth: int) -> None:
        self.key = (step, context, n)  # with the cost model's identity, what a step may reuse
        self.cost, self.context = cost, context
        size = n * (max_depth + 1) + 1
        both = getattr(cost, "step_prices", None)  # CostModel's faster form (same numbers), if it has one
        if both is not None:
            self.target, self.draft_all = both(size, context, n)  # (N,) by N, and a draft pass
        else:
            self.target = np.asarray(cost.target_time(np.arange(size), context), np.float64)
            self.draft_all = float(cost.draft_time(n, context))

    def fits(self, step: int, cost: StepCost, context: int, n: int, max_depth: int) -> bool:
        """Whether these prices serve a step with these arguments."""
        return self.cost is cost and self.key == (step, context, n) and self.target.size > n * (max_depth + 1)

    @cached_property
    def pass_one(self) -> float:
        """A draft pass of one row (keep_drafting prices a pass of k rows on the line from it to
        `draft_all`; most steps never ask it)."""
        if self.key[2] == 1:  # the one row is the whole batch: draft_all is draft_time(1), the same number
            return self.draft_all
        return float(self.cost.draft_time(1, self.context))

    def target_at(self, n_tokens: np.ndarray) -> np.ndarray:
        """cost.target_time(n_tokens), from the table where it reaches."""
        if n_tokens.size and int(n_tokens.max()) < self.target.size:
            return self.target[n_tokens]
        return np.asarray(self.cost.target_time(n_tokens, self.context), np.float64)


class DraftLag:
    """Tokens each sequence's draft cache lacks, followed from the steps' outcomes alone.

    A sequence's first draft pass of a step feeds its draft cache every token committed since it
    last drafted (`PairRunner._draft`): one or two after a step that drafted (what the learned pass
    price holds), one more for each step without. Only live: a replay models no draft cache.
    """

    def __init__(self) -> None:
        self.ids = np.zeros(0, np.int64)  # (B',) the last observed step's sequences
        self.lag = np.zeros(0, np.int64)  # (B',) the tokens each one's draft cache lacks now
        self.most = 0  # the largest (a newcomer's is 1: a plan needs no look below CATCH_UP_USUAL)

    def of(self, seq_ids: np.ndarray) -> np.ndarray:
        """(B,) tokens each sequence's draft cache lacks, as of the last step observed (1 for a
        sequence not seen: its draft cache holds the prompt but its last token)."""
        known, lag = self.ids, self.lag
        if known.size == seq_ids.size and (known == seq_ids).all():
            return lag
        out = np.ones(len(seq_ids), np.int64)
        if known.size:
            order = np.argsort(known)
            pos = np.minimum(np.searchsorted(known, seq_ids, sorter=order), known.size - 1)
            hit = known[order[pos]] == seq_ids
            out[hit] = lag[order[pos[hit]]]
        return out

    def track(self, out: StepOutcome) -> None:
        """The lag after a step: a sequence that drafted d positions fed its cache all it lacked and
        its first d - 1 drafts, then kept the accepted ones, so it lacks the token the target added
        (and the last draft, if every draft was accepted); one that did not draft lacks one more."""
        before = self.of(out.seq_ids)
        d, a = np.asarray(out.drafted, np.int64), np.asarray(out.accepted, np.int64)
        self.lag = np.where(d > 0, 1 + (a >= d), before + 1)
        self.ids = np.asarray(out.seq_ids, np.int64)
        self.most = int(self.lag.max(initial=0))

    def catch_up_s(self, ctx: PlanContext, rows: np.ndarray, context: int) -> float:
        """Seconds of catch-up a step drafting for `rows` (B,) bool adds: a draft pass over
        rows x worst-lag tokens, priced by the cost model as a pass over that many rows, less the
        usual pass; 0 while no lag is past CATCH_UP_USUAL."""
        worst = int(self.of(ctx.seq_ids)[rows].max(initial=0))
        if worst <= CATCH_UP_USUAL:
            return 0.0
        n = int(rows.sum())
        return max(float(ctx.cost.draft_time(n * worst, context)) - float(ctx.cost.draft_time(n, context)), 0.0)
