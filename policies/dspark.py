"""dspark: DSpark's confidence-scheduled verification, with the draft's depth priced in.

Each step maximises the predicted throughput Theta = tau / (draft time + target time), admitting
(sequence, position) slots in order of survival with an early stop (policies/allocation.py;
DESIGN.md "Allocation"):

- plan: budgets L_r from the controller's history-based priors (`plan_kernel`): each draft depth D
  prices its D sequential passes, and the best D wins. A free draft (a model-free drafter, its
  passes priced 0) is made to K wherever the plan drafts, `keep_drafting` never asked (no pass to
  stop after): `verify` decides on its features. A batch that saturates the compute knee gets 0
  everywhere: speculation switches itself off. Live, a plan that drafts for sequences whose
  draft caches lag also pays their catch-up (`DraftLag`). With `dynamic`, the plan's depth becomes
  a ceiling (K for every sequence it drafts for) and `keep_drafting` stops each sequence.
- keep_drafting: after pass j, draft j + 1 for the sequences (best first) whose expected next
  tokens, s_{r,j} times c-hat_{r,j+1} (the prior blended with the last confidence, since
  confidences run in streaks), raise Theta once the pass is paid (`keep_kernel`).
- verify: the drafted positions' calibrated survivals, allocated by the same rule. The passes
  already drafted stay in Theta's denominator: sunk, but leaving them out would raise the bar and
  prune slots that pay. Their count is this policy's own (the plan's depth, cut where
  `keep_drafting` stopped every sequence), from confidences only, never from a drafted token.

Whether a step drafts dynamically, asks `verify`, or probes the cost model is measured on the
policy's own steps, not predicted (policies/dspark_gates.py); so is whether speculating pays at
all against not speculating (the rail, policies/dspark_rail.py). In a closing run, only the
sequences that decide when it ends draft, where the cost model prices a verified token at least
what a decoded one costs (policies/dspark_closing.py). After plans that draft
nothing, the next steps go plain unplanned for a doubling while (policies/dspark_spell.py). With
`jump`, a step that verifies any draft pays a jump over a plain one (a ragged pass), measured on
the run's steps (policies/dspark_jump.py): plans price it, and a model-free draft is verified only
where it pays for it.

The controller asks `verify` causally, once per position j with columns 1..j; each answer is the
allocation of the columns shown, and equals a fresh instance's (`VerifyColumns` checks before it
reuses the step's earlier work). A step is priced once (`StepPrices`).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from specdepth.policies.base import (ChooseContext, DepthPolicy, DraftContext, PlanContext, StepCost, StepOutcome,
                                    VerifyContext)
from specdepth.policies.allocation import unit
from specdepth.policies.dspark_choose import choose_free
from specdepth.policies.dspark_closing import Pace, decode_bound, plain_rows
from specdepth.policies.dspark_gates import SelfMeasure
from specdepth.policies.dspark_prices import CATCH_UP_STEPS, CATCH_UP_USUAL, DraftLag, StepPrices
from specdepth.policies.dspark_jump import Jump, near, pays
from specdepth.policies.dspark_rail import Rail
from specdepth.policies.dspark_spell import Spell
from specdepth.policies.kernels import keep_kernel, plan_kernel, raised
from specdepth.policies.verify_columns import VerifyColumns


def _free_draft(cost: StepCost) -> bool:
    """Whether `cost` prices a model-free drafter's step (`FreeDraftCost`: no draft pass, proposing
    learned as `drafting_s`)."""
    return hasattr(cost, "drafting_s")


class DSpark(DepthPolicy):
    """Ours: calibrated survivals, global sort with early stop, draft depth priced, context-aware cost.

    Params:
        margin: a slot is admitted only if it raises predicted throughput by more than this fraction
            (0: any gain).
        price_draft: include the draft's passes in the pre-draft budget (False: an ablation).
        context_aware: pass the batch's context tokens to the cost model (False: an ablation).
        dynamic: stop each sequence's drafting by `keep_drafting` (False: the plan's budgets).
        streak: weight of the last confidence (vs the prior) in the next position's c-hat.
        lookahead: draft passes `keep_drafting` looks ahead (1: does the next pass pay; h: do
            the next h, for some h <= lookahead).
        weigh_asks: with `dynamic`, draft dynamically only while doing so has measured a gain over
            drafting the plan's budgets (the ask gate, policies/dspark_gates.py).
        probe: now and then draft nothing where drafting is predicted to gain little, and one
            position where the plan drafts nothing, so a learning cost model sees the steps it
            would otherwise never take (probes and tries).
        weigh_verify: skip `verify` while asking it has cost more time than it saved (the verify
            gate).
        follow_plan: where drafting dynamically has not paid, draft the plan's budgets (False:
            stop at one position, an ablation). Drafters that run passes only: a model-free draft
            is always drafted to the plan's budgets.
        catch_up: price the draft's catch-up on the tokens committed since a sequence last drafted
            into a plan that drafts after a spell without (`DraftLag`).
        rail: draft nothing where the run's own speculating steps measure slower than its plain
            ones (policies/dspark_rail.py; live only).
        closing: in a closing run, step plain the sequences expected to finish by the slowest
            one anyway, where a verified token costs what a decoded one does
            (policies/dspark_closing.py).
        spell: after plans that draft nothing, skip planning for a doubling number of steps
            (policies/dspark_spell.py; live only).
        jump: price the jump in a step's time from plain to verifying a draft, as measured on the
            run's steps (policies/dspark_jump.py; live only). Off by default: no gain measured
            beyond the noise, and a refused draft teaches the calibration nothing (where the jump
            was large, prose at batch 1 stalled plain).
    """

    name: ClassVar[str] = "dspark"
    params: ClassVar[dict[str, object]] = {"margin": 0.0, "price_draft": True, "context_aware": True,
                                           "dynamic": True, "streak": 0.5, "lookahead": 1, "weigh_asks": True,
                                           "probe": True, "weigh_verify": True, "follow_plan": True,
                                           "catch_up": True, "rail": True, "closing": True, "spell": True,
                                           "jump": False}

    def __init__(self, margin: float = 0.0, price_draft: bool = True, context_aware: bool = True,
                 dynamic: bool = True, streak: float = 0.5, lookahead: int = 1, weigh_asks: bool = True,
                 probe: bool = True, weigh_verify: bool = True, follow_plan: bool = True,
                 catch_up: bool = True, rail: bool = True, closing: bool = True, spell: bool = True,
                 jump: bool = False) -> None:
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"{self.name}: margin must be in [0, 1), got {margin}")
        self.margin = float(margin)
        self.price_draft = bool(price_draft)
        self.context_aware = bool(context_aware)
        self.dynamic = bool(dynamic)
        self.streak = float(streak)  # weight of the last confidence (vs the prior) in c-hat_{r,j+1}
        if int(lookahead) < 1:
            raise ValueError(f"{self.name}: lookahead must be >= 1, got {lookahead}")
        self.lookahead = int(lookahead)  # draft passes keep_drafting looks ahead
        self.weigh_asks = bool(weigh_asks)
        self.probe = bool(probe)
        self.weigh_verify = bool(weigh_verify)
        self.follow_plan = bool(follow_plan)
        self.catch_up = bool(catch_up)
        self.rail = bool(rail)
        self.closing = bool(closing)
        self.spell = bool(spell)
        self.jump = bool(jump)
        self._closing_plain: tuple[int, np.ndarray] = (-1, np.zeros(0, bool))  # (step, (B,) rows stepped plain)
        self._closes_at: tuple[int, bool] = (-1, False)  # (step, whether it plans as a closing run)
        self._pace = Pace()  # each sequence's tokens a step while allowed to draft (for closing runs)
        self._rail = Rail()  # speculating against plain steps, as measured (live only)
        self._spell = Spell()  # plans skipped while the plan keeps drafting nothing (live only)
        self._jump = Jump()  # a step's extra time for verifying any draft, over a plain step (live only)
        self._measure = SelfMeasure(self.weigh_asks)  # the gates' measures and this step's choices
        self._draft_lag = DraftLag()  # tokens each draft cache lacks (live only)
        self._cost_learns = False  # the last plan's `PlanContext.cost_learns`
        self._plan_ctx: PlanContext | None = None  # this step's plan context, for keep_drafting
        self._plan_key: tuple[int, int, int] | None = None  # its prices' key
        # Per-step verify state; `VerifyColumns` checks that each call continues the last.
        self._step = -1
        self._cost: StepCost | None = None
        self._depth = 0  # the most positions a step has had (sizes the step-time table; no effect on answers)
        self._passes = (-1, 0)  # (step, draft passes) as far as this policy knows (see verify)
        self._prices: StepPrices | None = None  # this step's step-time table
        self._alloc: VerifyColumns | None = None
        self._plain_step = -1  # the last step the rail planned plain (a hybrid's free drafts dropped too)

    def _context_tokens(self, context_lens: np.ndarray) -> int:
        return int(context_lens.sum()) if self.context_aware else 0

    def _prices_for(self, step: int, cost: StepCost, context: int, n: int, max_depth: int) -> StepPrices:
        p = self._prices
        if p is None or not p.fits(step, cost, context, n, max_depth):
            p = self._prices = StepPrices(step, cost, context, n, max_depth)
        return p

    # ---- plan ----------------------------------------------------------------------------------------

    def plan(self, ctx: PlanContext) -> np.ndarray:
        B, K = ctx.batch_size, ctx.max_depth
        m = self._measure
        free = _free_draft(ctx.cost)  # a model-free drafter: no draft pass, nothing for keep_drafting to stop
        if self.rail and ctx.cost_learns and not self._rail.speculates(B, lambda: self._plain_goodput(ctx),
                                                                       quick=not free):
            # measured: speculating is slower here (or a plain step to compare): nothing to plan
            return self._plain(ctx)
        if self._in_spell(ctx):  # the last plans drafted nothing: nor does this one
            return self._plain(ctx)
        prices = self._prices_for(ctx.step, ctx.cost, self._context_tokens(ctx.context_lens), B, K)
        budgets, deepest = self._budgets(ctx, prices)
        if deepest > 0 and prices.draft_all == 0.0:  # a free draft (model-free drafter): draft to K, verify decides
            budgets, deepest = raised(budgets, K), K
        closing = self._closes(ctx, prices.target)
        if closing and deepest > 0:  # only the sequences on the run's critical path draft
            plain = plain_rows(ctx.closing, ctx.prior_survival, budgets, self._pace.rate(ctx.seq_ids))
            budgets[plain] = 0
            deepest = int(budgets.max(initial=0))
            self._closing_plain = (ctx.step, plain)
        bucket = m.bucket(B)
        wanted = deepest > 0  # the allocation's answer, before a probe or a try
        tried = False  # a plan of nothing drafted one deep: drafted as it is, nothing asked
        if self.probe and ctx.cost_learns:
            if deepest > 0 and m.probes_now(bucket, ctx, budgets, int(deepest), prices, self.price_draft):
                budgets[:], deepest = 0, 0
            elif deepest == 0 and not closing:
                rows = m.try_rows(bucket, ctx, prices, self._draft_lag, free)
                if rows is not None:
                    budgets[rows & (np.asarray(ctx.prior_conf)[:, 0] > 0)] = 1
                    deepest, tried = int(budgets.max(initial=0)), True
        weigh_verify = self.weigh_verify and ctx.cost_learns
        if deepest > 0 and free:  # drafted to the budgets, `keep_drafting` never asked (the ask gate's
            m.fixed_step = ctx.step  # measure would weigh a step against itself)
            if weigh_verify and (tried or not m.asks_verify(bucket.verify_fixed)):
                m.skip_verify_step = ctx.step
        elif self.dynamic and deepest > 0 and not tried and m.asks_keep_drafting(bucket, ctx.step):
            m.fixed_budgets = budgets if self.follow_plan else np.minimum(budgets, 1)  # the measure's other arm
            budgets, deepest = raised(budgets, K), K  # (B,) K where the plan drafts
            if weigh_verify and not m.asks_verify(bucket.verify_dynamic):
                m.skip_verify_step = ctx.step
        elif deepest > 0:  # drafted to the budgets, `keep_drafting` not asked
            if self.dynamic and not self.follow_plan:
                np.minimum(budgets, 1, out=budgets)
                deepest = 1
            m.fixed_step = ctx.step
            # a try verifies what it drafted, unasked: it is there to be measured as drafted
            if weigh_verify and (tried or not m.asks_verify(bucket.verify_fixed)):
                m.skip_verify_step = ctx.step
        self._plan_ctx, self._plan_key, self._cost_learns = ctx, prices.key, ctx.cost_learns
        self._passes = (ctx.step, int(deepest))
        m.last_ids = ctx.seq_ids
        if self.spell and ctx.cost_learns:
            self._spell.planned(ctx, wanted or tried)
        return budgets

    def _in_spell(self, ctx: PlanContext) -> bool:
        """Whether this step goes plain unplanned (policies/dspark_spell.py): live, within a spell,
        and no try due, or the due one held (the skipped plans count toward the tries' spacing; a
        closing run makes none)."""
        if not (self.spell and ctx.cost_learns and self._spell.holds(ctx)):
            return False
        closing = self._closes(ctx)
        if self.probe and not closing and self._measure.bucket(ctx.batch_size).tries.count_unless_due():
            return False
        self._spell.skipped += 1
        return True

    def _closes(self, ctx: PlanContext, table: np.ndarray | None = None) -> bool:
        """Whether this step plans as a closing run (policies/dspark_closing.py): the run is closing,
        and its step prices a verified token at least what a decoded one costs at half the batch
        (`decode_bound`); where verifying is cheaper, a sequence's accepted drafts save more in
        the later, smaller steps than they cost now. Decided once a step (`table`: the step's
        prices, where made)."""
        if not (self.closing and ctx.closing is not None):
            return False
        if self._closes_at[0] != ctx.step:
            self._closes_at = (ctx.step, decode_bound(ctx.cost, ctx.batch_size, self._context_tokens(ctx.context_lens),
                                                      table))
        return self._closes_at[1]

    def _plain(self, ctx: PlanContext) -> np.ndarray:
        """A step that drafts nothing, unplanned (the rail, or a plain spell)."""
        self._plan_ctx, self._plan_key, self._cost_learns = ctx, None, ctx.cost_learns
        self._passes, self._measure.last_ids = (ctx.step, 0), ctx.seq_ids
        self._plain_step = ctx.step
        return np.zeros(ctx.batch_size, np.int64)

    def _plain_goodput(self, ctx: PlanContext) -> float:
        """Tokens/s of a step that drafts nothing, as the cost model predicts it (the rail's reference
        until plain steps are measured)."""
        B = ctx.batch_size
        t = float(ctx.cost.target_time(B, self._context_tokens(ctx.context_lens)))  # the step's overhead included
        return B / t if t > 0 else 0.0

    def _budgets(self, ctx: PlanContext, prices: StepPrices) -> tuple[np.ndarray, int]:
        """(B,) budgets by the allocation rule on the priors, and the deepest. Live, a plan that drafts
        pays a model-free drafter's proposing once (`FreeDraftCost.drafting_s`), and a drafting plan
        whose sequences' draft caches lag is priced again with 1 / CATCH_UP_STEPS of their catch-up."""
        prior, times = np.asarray(ctx.prior_conf, np.float64), prices.target[ctx.batch_size:]
        pass_time = prices.draft_all if self.price_draft else 0.0
        # a model-free draft's proposing, as measured live: paid once by a plan that drafts at all
        free = ctx.cost.drafting_s(ctx.batch_size) if self.price_draft and ctx.cost_learns \
            and _free_draft(ctx.cost) else 0.0
        free += self._jump_s(ctx.batch_size, ctx.cost_learns, ctx.cost, prices.context)  # and the jump to verifying at all
        budgets, deepest = plan_kernel(prior, times, pass_time, self.margin, 0, free)
        if deepest > 0 and self.catch_up and ctx.cost_learns and self._draft_lag.most > CATCH_UP_USUAL:
            first = self._draft_lag.catch_up_s(ctx, budgets > 0, prices.context) / CATCH_UP_STEPS
            if first > 0.0:  # a plan that drafts nothing pays none
                budgets, deepest = plan_kernel(prior, times, pass_time, self.margin, 0, free + first)
        return budgets, deepest

    def _jump_s(self, batch_size: int, cost_learns: bool, cost: StepCost, context: int) -> float:
        """Seconds a step pays for verifying any draft over a plain step, as measured, the cost
        model's profiled jump until then (0: not priced)."""
        if not (self.jump and self.price_draft and cost_learns):
            return 0.0
        prior = cost.jump_s(batch_size, context) if hasattr(cost, "jump_s") else None
        return self._jump.seconds(batch_size, prior)

    def verifies(self, step: int) -> bool:
        return step == self._plain_step or step != self._measure.skip_verify_step

    def drafts_dynamically(self, step: int) -> bool:
        return step != self._measure.fixed_step

    def proposes_free(self, step: int) -> bool:
        return step != self._plain_step  # a plain step (the rail, a spell) checks no free draft: none proposed

    def observe(self, out: StepOutcome) -> None:
        # a step planned plain is the rail's plain side even where a hybrid proposed free drafts
        # (verify checks none of them): else the rail never measured a plain step there
        speculated = out.step != self._plain_step and bool(np.any(out.drafted > 0))
        self._rail.observe(out.step, out.batch_size, speculated, int(np.sum(out.accepted)) + out.batch_size,
                           out.prev_step_s)
        if self.closing:
            self._pace.observe(out.seq_ids, out.budgets, out.accepted, out.finished)
        pc = self._plan_ctx
        lags = pc is None or not _free_draft(pc.cost)  # a model-free drafter has no draft cache to lag
        if self.catch_up and self._cost_learns and lags:
            self._draft_lag.track(out)
        if self.jump and self._cost_learns:
            self._jump.observe(out.step, out.batch_size, *self._priced(out), out.prev_step_s)
        if self.jump and self.spell and self._cost_learns and pc is not None and pc.step == out.step \
                and np.any(out.drafted > 0) and not np.any(out.verified > 0):
            self._spell.verified_nothing(pc)
        self._measure.observe(out, self._prices, self._plan_ctx, self._cost_learns)

    def _priced(self, out: StepOutcome) -> tuple[int, float]:
        """(N, the price of the step's N tokens and, where it drafted, of proposing), for the
        jump's measure; price -1 where the step does not teach it (more than near plain, or not
        planned here)."""
        pc, B = self._plan_ctx, out.batch_size
        n = B + int(np.sum(out.verified))
        if pc is None or pc.step != out.step or not near(B, n) or n == B and self._jump.plain_known(B, out.step):
            return n, -1.0
        p = self._prices
        if p is not None and p.key == self._plan_key and p.cost is pc.cost and n < p.target.size:
            price = float(p.target[n])  # the plan's table
        else:
            price = float(pc.cost.target_time(n, self._context_tokens(pc.context_lens)))
        if n > B and _free_draft(pc.cost):
            price += pc.cost.drafting_s(B)  # priced apart (`_budgets`): not the jump's
        return n, price

    # ---- choose_drafter (the hybrid drafter) ----------------------------------------------------------

    def choose_drafter(self, ctx: ChooseContext) -> np.ndarray:
        """Keep the model-free draft unless drafting some sequences with the model is predicted
        to raise Theta more (policies/dspark_choose.py). Where the rail planned plain, every
        sequence keeps its free draft, and `verify` checks none of it."""
        B = len(ctx.seq_ids)
        pc = self._plan_ctx
        if ctx.step == self._plain_step or pc is None or pc.step != ctx.step or not np.any(ctx.budgets > 0):
            keep = np.ones(B, bool)
        else:
            p = self._prices_for(ctx.step, pc.cost, self._context_tokens(pc.context_lens), B, pc.max_depth)
            keep = choose_free(np.asarray(ctx.survival, np.float64), np.asarray(pc.prior_survival, np.float64),
                               np.asarray(ctx.budgets, np.int64), p.target[B:],
                               p.draft_all if self.price_draft else 0.0)
        if not np.any(~keep & (ctx.budgets > 0)) and self._passes[0] == ctx.step:
            self._passes = (ctx.step, 0)  # no draft pass runs: none is sunk in verify's prices
        return keep

    # ---- keep_drafting -------------------------------------------------------------------------------

    def keep_drafting(self, ctx: DraftContext) -> np.ndarray:
        """Draft position j + 1 for the sequences whose expected gain pays for another pass."""
        B, j = ctx.conf.shape
        pc = self._plan_ctx
        if not self.dynamic or pc is None or pc.step != ctx.step or j >= pc.max_depth or B == 0:
            return np.ones(B, bool)
        p = self._prices
        if p is None or p.key != self._plan_key or p.cost is not pc.cost:  # else: the plan's prices
            p = self._prices_for(ctx.step, pc.cost, self._context_tokens(pc.context_lens), B, pc.max_depth)
        keep, _, kept = keep_kernel(np.asarray(ctx.conf, np.float64), np.asarray(ctx.drafted, np.int64),
                                    np.asarray(ctx.budgets, np.int64), np.asarray(pc.prior_conf, np.float64),
                                    self.streak, p.target, p.pass_one, p.draft_all, self.margin, self.lookahead)
        if not kept and self._passes[0] == ctx.step:
            self._passes = (ctx.step, min(self._passes[1], j))  # drafting ends after pass j
        return keep

    # ---- verify --------------------------------------------------------------------------------------

    def _start(self, ctx: VerifyContext, j: int) -> VerifyColumns:
        """The step's verify allocator, priced afresh: target times plus the passes already drafted."""
        n = len(ctx.seq_ids)
        pc, cost = self._plan_ctx, ctx.cost
        if pc is not None and pc.step == ctx.step and pc.context_lens is ctx.context_lens:
            context = self._plan_key[1]  # the plan's sum over the same array
        else:
            context = self._context_tokens(ctx.context_lens)
        self._step, self._cost = ctx.step, cost
        self._depth = max(self._depth, j)  # a table too short for a step grows (`VerifyColumns`)
        passes = self._passes[1] if self._passes[0] == ctx.step else 0  # no plan this step: unknown
        p = self._prices_for(ctx.step, cost, context, n, max(self._depth, passes))
        sunk = passes * p.draft_all + self._whole_jump_s(ctx)  # (see the module docstring)
        times, more = p.target[n:], (lambda k: p.target_at(n + k))  # each + sunk, where read
        a = self._alloc
        if a is not None and a.n_seq == n and a.margin == self.margin:
            a.reset(times, more, sunk)
        else:
            a = self._alloc = VerifyColumns(n, times, self.margin, more, sunk)
        return a

    def verify(self, ctx: VerifyContext) -> np.ndarray:
        n, j = ctx.conf.shape
        if n == 0 or j == 0 or ctx.step == self._plain_step:  # plain: a hybrid's free drafts go unchecked
            return np.zeros(n, np.int64)
        conf, drafted = np.asarray(ctx.conf, np.float64), np.asarray(ctx.drafted, np.int64)
        if self._closing_plain[0] == ctx.step and len(self._closing_plain[1]) == n:  # a hybrid's free drafts
            conf = np.where(self._closing_plain[1][:, None], 0.0, conf)  # of rows stepped plain: nothing to admit
        lens = np.asarray(ctx.context_lens, np.int64)
        a = self._alloc
        ans = None
        if a is not None and ctx.step == self._step and ctx.cost is self._cost:
            ans = a.answer(conf, drafted, lens)  # None: not a continuation of this step's calls
        if ans is None:
            a = self._start(ctx, j)
            ans = a.answer(conf, drafted, lens)
        self._depth = max(self._depth, a.j)
        ans = ans.copy()
        jump = self._whole_jump_s(ctx)
        if jump > 0.0 and ans.any() and not self._pays_jump(ctx, conf, ans, jump):
            ans[:] = 0  # what it would admit does not pay for verifying at all
        return ans

    def _whole_jump_s(self, ctx: VerifyContext) -> float:
        """The jump, where `verify` is asked once for a model-free draft's every column: its
        columns are functions of the prefix, so weighing them all together stays lossless."""
        if not _free_draft(ctx.cost):
            return 0.0
        return self._jump_s(len(ctx.seq_ids), self._cost_learns, ctx.cost, self._context_tokens(ctx.context_lens))

    def _pays_jump(self, ctx: VerifyContext, conf: np.ndarray, lengths: np.ndarray, jump: float) -> bool:
        """Whether verifying `lengths` (B,) of the draft, its expected tokens against its time with
        the jump, beats the plain step."""
        n, j = conf.shape
        survival = np.cumprod(unit(conf), axis=1)  # (B, j)
        tau = n + float(survival[np.arange(j)[None, :] < lengths[:, None]].sum())
        p = self._prices
        N = n + int(lengths.sum())
        if p is not None and p.key[0] == ctx.step and p.key[2] == n and p.cost is ctx.cost and N < p.target.size:
            t_plain, t_spec = float(p.target[n]), float(p.target[N])
        else:
            context = self._context_tokens(ctx.context_lens)
            t_plain, t_spec = (float(ctx.cost.target_time(x, context)) for x in (n, N))
        return pays(tau, n, t_spec + jump, t_plain)
