"""dspark: DSpark's confidence-scheduled verification, with the draft's depth priced in.

Each step (DESIGN.md "Allocation"):

- plan: the controller's history-based predictions `ctx.prior_survival` (a global prior shrunk
  toward each sequence's own acceptance history) go through `plan_budgets`: for every draft depth D
  the D sequential draft passes are part of the step time, slots j <= D are admitted by the sorted
  early-stop rule, and the best D's per-sequence counts are the budgets L_r. A batch that already
  saturates the compute knee gets 0 everywhere: speculation switches itself off.
- keep_drafting (dynamic depth): after each draft pass j, the calibrated confidences drafted so far
  give each sequence's survival s_{r,j}; the next position is worth about s_{r,j} * c-hat_{r,j+1}
  (c-hat: the prior for j + 1 blended with the last confidence, which runs in streaks). The next
  pass is drafted for the sequences (best first) that raise the step's predicted throughput
  tau / (draft time + target time) once its cost is paid; otherwise drafting stops. With it, the
  plan's budget is a ceiling (K for every sequence the plan would draft for at all), and deep
  drafts are paid only where the confidences say they will likely be verified.
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
the new column is merged in, see `ColumnAllocator`) after checking, byte for byte, that the columns
the cached answer rests on are the ones shown now, so every answer equals a fresh instance's. The
step times are priced once per step: the cost model (the same object) is assumed not to change
within a step (the controller refines it in `observe`).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from policies.allocation import ColumnAllocator, plan_budgets, unit
from policies.base import DepthPolicy, DraftContext, PlanContext, StepCost, VerifyContext


class _Prices:
    """One step's step-time table, priced once and shared by plan, keep_drafting and verify (the
    cost model is fixed within a step; the controller refines it in `observe`). The numbers are the
    cost model's own, element for element, so sharing them changes no answer."""

    def __init__(self, step: int, cost: StepCost, context: int, n: int, max_depth: int) -> None:
        self.key = (step, context, n)  # with the cost model's identity (see `DSpark._prices_for`)
        self.cost, self.context = cost, context
        self.target = np.asarray(cost.target_time(np.arange(n * (max_depth + 1) + 1), context), np.float64)  # (N,) by N
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
    """

    name: ClassVar[str] = "dspark"
    params: ClassVar[dict[str, object]] = {"margin": 0.0, "price_draft": True, "context_aware": True,
                                           "dynamic": True, "streak": 0.5}

    def __init__(self, margin: float = 0.0, price_draft: bool = True, context_aware: bool = True,
                 dynamic: bool = True, streak: float = 0.5) -> None:
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"{self.name}: margin must be in [0, 1), got {margin}")
        self.margin = float(margin)
        self.price_draft = bool(price_draft)
        self.context_aware = bool(context_aware)
        self.dynamic = bool(dynamic)
        self.streak = float(streak)  # weight of the last confidence (vs the prior) in c-hat_{r,j+1}
        self._plan_ctx: PlanContext | None = None  # this step's plan context, for keep_drafting
        # Per-step verify cache (see the module docstring): the inputs it was built from, as bytes.
        self._step = -1
        self._cost: StepCost | None = None
        self._context_lens = b""  # ctx.context_lens
        self._drafted = b""  # min(ctx.drafted, columns merged): which merged positions were drafted
        self._conf: list[bytes] = []  # ctx.conf[:, i] for the columns merged
        self._depth = 0  # the most positions a step has had (sizes the step-time table; no effect on answers)
        self._passes = (-1, 0)  # (step, draft passes) as far as this policy knows (see verify)
        self._prices: _Prices | None = None  # this step's step-time table
        self._alloc: ColumnAllocator | None = None

    def _context_tokens(self, context_lens: np.ndarray) -> int:
        return int(context_lens.sum()) if self.context_aware else 0

    def plan(self, ctx: PlanContext) -> np.ndarray:
        surv_t = unit(ctx.prior_conf.T, out=np.empty(ctx.prior_conf.shape[::-1]))  # (K, B)
        for j in range(1, surv_t.shape[0]):  # = ctx.prior_survival, position-major; faster than cumprod
            surv_t[j] *= surv_t[j - 1]
        prices = self._prices_for(ctx.step, ctx.cost, self._context_tokens(ctx.context_lens), ctx.batch_size,
                                  ctx.max_depth)
        budgets = plan_budgets(
            surv_t.T,
            ctx.cost,
            prices.context,
            margin=self.margin,
            price_draft=self.price_draft,
            target_by_n=prices.target,
            pass_time=prices.draft_all,
        )
        self._plan_ctx = ctx
        if self.dynamic and budgets.any():  # the plan's depth becomes a ceiling; drafting stops dynamically
            budgets = np.where(budgets > 0, ctx.max_depth, 0)
        self._passes = (ctx.step, int(budgets.max(initial=0)))
        return budgets

    def _prices_for(self, step: int, cost: StepCost, context: int, n: int, max_depth: int) -> _Prices:
        p = self._prices
        if p is None or p.cost is not cost or p.key != (step, context, n):
            p = self._prices = _Prices(step, cost, context, n, max_depth)
        return p

    def keep_drafting(self, ctx: DraftContext) -> np.ndarray:
        """Draft position j + 1 for the sequences whose expected gain pays for another pass."""
        B, j = ctx.conf.shape
        pc = self._plan_ctx
        if not self.dynamic or pc is None or pc.step != ctx.step or j >= pc.max_depth or B == 0:
            return np.ones(B, bool)
        p = self._prices_for(ctx.step, pc.cost, self._context_tokens(pc.context_lens), B, pc.max_depth)
        d_all, pass_k, times = p.draft_all, p.pass_k, p.target
        c = unit(ctx.conf)  # (B, j)
        surv = np.cumprod(c, axis=1)  # (B, j)
        drafting = ctx.drafted == j
        c_next = (1 - self.streak) * unit(pc.prior_conf[:, j]) + self.streak * c[:, -1]  # (B,)
        gain = np.where(drafting, surv[:, -1] * c_next, 0.0)  # (B,)
        order = np.argsort(-gain, kind="stable")
        g = np.cumsum(gain[order])  # (B,) expected tokens from the best k sequences drafting on
        n_now = B + int(ctx.drafted.sum())
        sunk = j * d_all
        tau_now = B + float(surv.sum())
        theta_now = tau_now / (sunk + times[n_now])
        theta = (tau_now + g) / (sunk + pass_k + times[n_now + 1 : n_now + B + 1])  # (B,) k = 1..B drafting on
        best = int(np.argmax(theta))
        keep = np.zeros(B, bool)
        if theta[best] > theta_now * (1.0 + self.margin):
            keep[order[: best + 1]] = True
        keep &= drafting
        if not keep.any() and self._passes[0] == ctx.step:
            self._passes = (ctx.step, min(self._passes[1], j))  # drafting ends after pass j
        return keep

    def _cache_matches(self, ctx: VerifyContext, j: int) -> bool:
        """True if this step's earlier calls saw exactly the inputs the cached answer rests on:
        the same confidences and drafted positions (`min(drafted, seen)`) in the columns it used."""
        a = self._alloc
        if a is None or ctx.step != self._step or ctx.cost is not self._cost:
            return False
        seen = a.frozen or a.j  # columns the cached answer depends on
        if not (seen <= j and (a.frozen or j <= a.j + 1)):
            return False
        return (
            ctx.context_lens.tobytes() == self._context_lens
            and np.minimum(ctx.drafted, seen).tobytes() == self._drafted
            and ctx.conf[:, :seen].T.tobytes() == b"".join(self._conf)
        )

    def _start(self, ctx: VerifyContext, j: int) -> ColumnAllocator:
        n = len(ctx.seq_ids)
        cost, context = ctx.cost, self._context_tokens(ctx.context_lens)
        self._step, self._cost, self._conf = ctx.step, cost, []
        self._context_lens = ctx.context_lens.tobytes()
        self._depth = max(self._depth, j, int(ctx.drafted.max(initial=0)))
        passes = self._passes[1] if self._passes[0] == ctx.step else 0  # no plan this step: unknown
        hint = n * max(self._depth, passes)  # sizing only: price every slot the step can have, once
        p = self._prices_for(ctx.step, cost, context, n, max(self._depth, passes))
        sunk = passes * p.draft_all  # (see the module docstring)
        self._alloc = ColumnAllocator(n, lambda k: sunk + p.target_at(n + k), self.margin, slots_hint=hint)
        return self._alloc

    def verify(self, ctx: VerifyContext) -> np.ndarray:
        n, j = ctx.conf.shape
        if n == 0 or j == 0:
            return np.zeros(n, np.int64)
        a = self._alloc if self._cache_matches(ctx, j) else self._start(ctx, j)
        while a.j < j and not a.frozen:
            i = a.j
            col = ctx.conf[:, i]  # (B,)
            self._conf.append(col.tobytes())
            c = np.fmax(col, 0.0)  # in [0, 1], NaN read as 0, 0 where position i + 1 was not drafted
            a.push(np.fmin(c, ctx.drafted > i, out=c))
        self._drafted = np.minimum(ctx.drafted, a.frozen or a.j).tobytes()
        self._depth = max(self._depth, a.j)
        return a.lengths().copy()
