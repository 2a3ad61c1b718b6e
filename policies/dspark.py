"""dspark: DSpark's confidence-scheduled verification, with the draft's depth priced in.

Each step (DESIGN.md "Allocation"):

- plan: the controller's history-based predictions `ctx.prior_survival` (a global prior shrunk
  toward each sequence's own acceptance history) go through `plan_budgets` (as `plan_kernel`):
  for every draft depth D the D sequential draft passes are part of the step time, slots j <= D
  are admitted by the sorted early-stop rule, and the best D's per-sequence counts are the
  budgets L_r. A batch that already saturates the compute knee gets 0 everywhere: speculation
  switches itself off.
- keep_drafting (dynamic depth): after each draft pass j, the calibrated confidences drafted so far
  give each sequence's survival s_{r,j}; the next position is worth about s_{r,j} * c-hat_{r,j+1}
  (c-hat: the prior for j + 1 blended with the last confidence, which runs in streaks). The next
  pass is drafted for the sequences (best first) that raise the step's predicted throughput
  tau / (draft time + target time) once its cost is paid; otherwise drafting stops. With it, the
  plan's budget is a ceiling (K for every sequence the plan would draft for at all), and deep
  drafts are paid only where the confidences say they will likely be verified. On steps whose
  plan drafts one position, drafting goes on this way only while asking has paid (`_asking`).
- verify: the drafted positions' calibrated confidences give survivals s_{r,j} (running products),
  and the same early-stop allocation picks d_r. The draft passes already run are part of the
  step's time whatever is verified (`extra`): sunk, but still in Theta's denominator. Leaving
  them out would raise the admission bar (tau / T(N) > tau / (draft + T(N))) and prune slots
  that pay (on the CPU pair's replay at C = 64 that cost 3%). The pass count is this policy's
  own: the plan's deepest budget, cut where `keep_drafting` stopped every sequence; it depends
  on confidences only, never on a drafted token.

Both use the context-aware cost (context_tokens = the batch's KV tokens).

The controller asks `verify` causally, once per position j with columns 1..j. Each answer is
`allocate` over the columns shown (survivals = running products of the confidences clipped to
[0, 1], zero past each drafted length). The work of earlier calls in the same step is reused (only
the new column is merged in, see `VerifyColumns`) after checking, value for value, that the
columns the cached answer rests on are the ones shown now, so every answer equals a fresh
instance's. The step times are priced once per step: the cost model (the same object) is assumed
not to change within a step (the controller refines it in `observe`).

The loops run compiled (policies/kernels.py): `plan_kernel` is `plan_budgets` and `VerifyColumns`
is `allocate` column by column, answer for answer (tests/policies/test_kernels.py); in numpy the
same decisions took 230-570 us a step at B = 256, mostly per-call overhead.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from policies.base import DepthPolicy, DraftContext, PlanContext, StepCost, StepOutcome, VerifyContext
from policies.kernels import VerifyColumns, keep_kernel, plan_kernel

ASK_PROBE = 8  # a 1-deep step that would not ask still asks once in this many (see `DSpark._asking`)
ASK_RATE = 0.1  # the running means' weight on a new 1-deep step that asked, after the first 10


class _Prices:
    """One step's step-time table, priced once and shared by plan, keep_drafting and verify (the
    cost model is fixed within a step; the controller refines it in `observe`). The numbers are the
    cost model's own, element for element, so sharing them changes no answer."""

    def __init__(self, step: int, cost: StepCost, context: int, n: int, max_depth: int) -> None:
        self.key = (step, context, n)  # with the cost model's identity (see `DSpark._prices_for`)
        self.cost, self.context = cost, context
        size = n * (max_depth + 1) + 1
        table = getattr(cost, "target_by_n", None)  # CostModel's faster form (same numbers), if it has one
        self.target = table(size, context) if table else np.asarray(cost.target_time(np.arange(size), context),
                                                                    np.float64)  # (N,) by N
        self.draft_one, self.draft_all = float(cost.draft_time(1, context)), float(cost.draft_time(n, context))
        # (n,) a draft pass of k = 1..n rows, linear in k between the two measured ends
        self.pass_k = self.draft_one + (self.draft_all - self.draft_one) * np.arange(n) / max(n - 1, 1)

    def target_at(self, n_tokens: np.ndarray) -> np.ndarray:
        """cost.target_time(n_tokens), from the table where it reaches."""
        if n_tokens.size and int(n_tokens.max()) < self.target.size:
            return self.target[n_tokens]
        return np.asarray(self.cost.target_time(n_tokens, self.context), np.float64)


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
            the next h, for some h <= lookahead). On the replays 8 did no better than 1.
        weigh_asks: with `dynamic`, weigh what asking `keep_drafting` costs against what it
            gains, on the steps whose plan drafts one position (see `_asking`).
    """

    name: ClassVar[str] = "dspark"
    params: ClassVar[dict[str, object]] = {"margin": 0.0, "price_draft": True, "context_aware": True,
                                           "dynamic": True, "streak": 0.5, "lookahead": 1, "weigh_asks": True}

    def __init__(self, margin: float = 0.0, price_draft: bool = True, context_aware: bool = True,
                 dynamic: bool = True, streak: float = 0.5, lookahead: int = 1, weigh_asks: bool = True) -> None:
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
        # asking keep_drafting on 1-deep steps (see `_asking`): running means of its predicted gain
        # (x the step time) and of its measured time, over the 1-deep steps that asked; the 1-deep
        # steps since the last that asked; and (step, summed predicted gain) of the step asking now
        self._ask_gain, self._ask_cost, self._ask_n, self._skipped = 0.0, 0.0, 0, 0
        self._asking_now: tuple[int, float] = (-1, 0.0)
        self._plan_ctx: PlanContext | None = None  # this step's plan context, for keep_drafting
        self._plan_key: tuple[int, int, int] | None = None  # its prices' key
        # Per-step verify state (see the module docstring); it checks each call continues the last.
        self._step = -1
        self._cost: StepCost | None = None
        self._depth = 0  # the most positions a step has had (sizes the step-time table; no effect on answers)
        self._passes = (-1, 0)  # (step, draft passes) as far as this policy knows (see verify)
        self._prices: _Prices | None = None  # this step's step-time table
        self._alloc: VerifyColumns | None = None

    def _context_tokens(self, context_lens: np.ndarray) -> int:
        return int(context_lens.sum()) if self.context_aware else 0

    def plan(self, ctx: PlanContext) -> np.ndarray:
        B, K = ctx.batch_size, ctx.max_depth
        prices = self._prices_for(ctx.step, ctx.cost, self._context_tokens(ctx.context_lens), B, K)
        # = plan_budgets(ctx.prior_survival, ...), compiled; with `dynamic` the plan's depth becomes a
        # ceiling (K for every sequence it drafts for) and drafting stops dynamically (keep_drafting),
        # unless the plan is 1 deep and asking does not pay: decided on the plan's depth, so the
        # ceiling is set here rather than by plan_kernel's `ceiling`
        budgets, deepest = plan_kernel(np.asarray(ctx.prior_conf, np.float64), prices.target[B:],
                                       prices.draft_all if self.price_draft else 0.0, self.margin)
        if self.dynamic and deepest > 0 and self._asking(ctx.step, int(deepest)):
            budgets[budgets > 0], deepest = K, K
        self._plan_ctx, self._plan_key = ctx, prices.key
        self._passes = (ctx.step, int(deepest))
        return budgets

    def _asking(self, step: int, deepest: int) -> bool:
        """Whether this step drafts on dynamically, asking `keep_drafting` after every pass.

        Each ask is a call into the controller between two draft passes. On a GPU host it is small
        next to a step; on the bundled CPU pair it runs with the caches cold from the forward before
        it, 0.23-0.29 ms at batch 16 (~25 us in a loop), about 1% of a step. When the plan drafts
        one position, asking is what drafting beyond it takes, and its worth is learned: the
        predicted gain in throughput of the passes the asks add (keep_kernel's Theta gain, times
        the step's time) against the asks' measured time, as running means over the 1-deep steps
        that asked (each time capped at twice the mean plus 1 ms: a first call loads compiled
        code). While the gain falls short, 1-deep steps keep their plan, and one in `ASK_PROBE`
        asks anyway, so the estimate follows a change. Deeper plans always ask (the asks also stop
        them early). A replay reports no asking time: every step asks, as without `weigh_asks`.
        Live A/B runs on the CPU pair (3-4 rounds each) of never asking on 1-deep steps: +1.2-1.6%
        at batch 16, where going on rarely paid, nothing at batch 4 and 64, -3.5% at batch 1,
        where it pays."""
        if deepest == 1 and self.weigh_asks and self._ask_gain < self._ask_cost:
            self._skipped += 1
            if self._skipped < ASK_PROBE:
                return False
        if deepest == 1:
            self._skipped, self._asking_now = 0, (step, 0.0)
        return True

    def observe(self, out: StepOutcome) -> None:
        step, gain = self._asking_now
        if step != out.step:
            return
        self._asking_now = (-1, 0.0)
        self._ask_n += 1
        w = max(ASK_RATE, 1.0 / self._ask_n)
        spent = min(max(out.keep_time_s, 0.0), 2.0 * self._ask_cost + 1e-3)
        self._ask_gain += w * (gain * out.step_time_s - self._ask_gain)
        self._ask_cost += w * (spent - self._ask_cost)

    def _prices_for(self, step: int, cost: StepCost, context: int, n: int, max_depth: int) -> _Prices:
        p = self._prices
        if p is None or p.cost is not cost or p.key != (step, context, n) or p.target.size <= n * (max_depth + 1):
            p = self._prices = _Prices(step, cost, context, n, max_depth)
        return p

    def keep_drafting(self, ctx: DraftContext) -> np.ndarray:
        """Draft position j + 1 for the sequences whose expected gain pays for another pass."""
        B, j = ctx.conf.shape
        pc = self._plan_ctx
        if not self.dynamic or pc is None or pc.step != ctx.step or j >= pc.max_depth or B == 0:
            return np.ones(B, bool)
        p = self._prices
        if p is None or p.key != self._plan_key or p.cost is not pc.cost:  # else: the plan's prices
            p = self._prices_for(ctx.step, pc.cost, self._context_tokens(pc.context_lens), B, pc.max_depth)
        keep, gain = keep_kernel(np.asarray(ctx.conf, np.float64), np.asarray(ctx.drafted, np.int64),
                                 np.asarray(ctx.budgets, np.int64), np.asarray(pc.prior_conf, np.float64),
                                 self.streak, p.target, p.pass_k, p.draft_all, self.margin, self.lookahead)
        if self._asking_now[0] == ctx.step:
            self._asking_now = (ctx.step, self._asking_now[1] + gain)
        if not keep.any() and self._passes[0] == ctx.step:
            self._passes = (ctx.step, min(self._passes[1], j))  # drafting ends after pass j
        return keep

    def _start(self, ctx: VerifyContext, j: int) -> VerifyColumns:
        n = len(ctx.seq_ids)
        cost, context = ctx.cost, self._context_tokens(ctx.context_lens)
        self._step, self._cost = ctx.step, cost
        self._depth = max(self._depth, j, int(ctx.drafted.max(initial=0)))
        passes = self._passes[1] if self._passes[0] == ctx.step else 0  # no plan this step: unknown
        p = self._prices_for(ctx.step, cost, context, n, max(self._depth, passes))
        sunk = passes * p.draft_all  # (see the module docstring)
        times, more = sunk + p.target[n:], (lambda k: sunk + p.target_at(n + k))
        a = self._alloc
        if a is not None and a.n_seq == n and a.margin == self.margin:
            a.reset(times, more)
        else:
            a = self._alloc = VerifyColumns(n, times, self.margin, more)
        return a

    def verify(self, ctx: VerifyContext) -> np.ndarray:
        n, j = ctx.conf.shape
        if n == 0 or j == 0:
            return np.zeros(n, np.int64)
        conf, drafted = np.asarray(ctx.conf, np.float64), np.asarray(ctx.drafted, np.int64)
        lens = np.asarray(ctx.context_lens, np.int64)
        a = self._alloc
        ans = None
        if a is not None and ctx.step == self._step and ctx.cost is self._cost:
            ans = a.answer(conf, drafted, lens)  # None: not a continuation of this step's calls
        if ans is None:
            a = self._start(ctx, j)
            ans = a.answer(conf, drafted, lens)
        self._depth = max(self._depth, a.j)
        return ans.copy()
